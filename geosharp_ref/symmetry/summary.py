"""Refusals repeated per layer, summarised: one line per distinct reason with its count and layer range.

A key such as ``model.layers.7.self_attn`` is read as a pattern (``model.layers.{}.self_attn``) and a layer
number (7): the first dot-separated integer component. Entries whose pattern and reason agree once that number
is replaced (in the key and in the reason) are one line, e.g.
``model.layers.{0–29}.self_attn (30 layers): <reason>``; a key without a layer number stays on its own.
"""
from __future__ import annotations

import re

__all__ = ["summarise_by_layer", "summary_lines"]

_LAYER = re.compile(r"(?<=\.)(\d+)(?=\.|$)")


def _split(key: str):
    """``(pattern, layer)``: the key with its first integer component replaced by ``{}``, and that integer
    (None when there is none)."""
    m = _LAYER.search(key)
    if m is None:
        return key, None
    return key[:m.start()] + "{}" + key[m.end():], int(m.group(1))


def _ranges(numbers) -> str:
    """``[0, 1, 2, 5, 7, 8]`` → ``"0–2, 5, 7–8"``."""
    nums = sorted(set(numbers))
    out, start, prev = [], nums[0], nums[0]
    for n in nums[1:] + [None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        out.append(f"{start}" if start == prev else f"{start}–{prev}")
        if n is not None:
            start = prev = n
    return ", ".join(out)


def summarise_by_layer(rows) -> list[tuple[str, str, int]]:
    """``rows``: ``(key, reason)`` pairs in order. Returns ``(label, reason, count)`` per distinct
    (key pattern, reason with the layer number generalised), in order of first appearance; ``label`` is the key
    for a single entry, else the pattern with the layer range (``model.layers.{0–29}.self_attn``)."""
    groups: dict = {}
    for key, reason in rows:
        pattern, layer = _split(str(key))
        text = str(reason)
        if layer is not None:  # the reason may name the layer's own parameters: generalise them too
            text = text.replace(str(key), pattern)
            text = re.sub(rf"(?<=\.){layer}(?=\.)", "{}", text)
        groups.setdefault((pattern, text), []).append((key, layer, str(reason)))
    out = []
    for (pattern, text), members in groups.items():
        if len(members) == 1:
            key, _, reason = members[0]
            out.append((str(key), reason, 1))
        else:
            layers = [layer for _, layer, _ in members]
            label = pattern.replace("{}", "{" + _ranges(layers) + "}", 1)
            shown = text.replace("{}", "{" + _ranges(layers) + "}")
            out.append((label, shown, len(members)))
    return out


def summary_lines(rows, indent: str = "  ", status: str = "") -> list[str]:
    """Printable lines of :func:`summarise_by_layer`: ``{indent}{status} {label} (N layers): {reason}``."""
    lead = f"{indent}{status} " if status else indent
    return [f"{lead}{label}" + (f" ({n} layers)" if n > 1 else "") + f": {reason}"
            for label, reason, n in summarise_by_layer(rows)]
