r"""Bindings a user declares beside a symmetry: which parameters of a model form a geometry's blocks.

A spec file (``geosharp derive --spec FILE.py``) declares metrics in ``SPEC`` and, for each, how the
blocks of the derived geometry (its ``BLOCKS``, e.g. ``("B", "At")`` for LoRA's GL(r) pair) are cut out of a
model's parameters in ``BINDINGS`` — plain data, copied into the generated module::

    BINDINGS = {
        "lora_hybrid": [{
            "B":  "{adapter}.lora_B.default.weight",                               # (d_out, r) as stored
            "At": {"param": "{adapter}.lora_A.default.weight", "transpose": True},  # (r, d_in) → (d_in, r)
        }],
    }

A block is a parameter-name pattern, or a dict with

=============  ===================================================================================
``param``      the pattern (required). ``{name}`` matches one name segment (no dot), or, at the very start
               of the pattern, a whole module path (``{adapter}.lora_B…``); the rest is literal
``transpose``  swap the last two axes: an ``nn.Linear`` weight (out, in) becomes (in, out)
``bias``       pattern of a vector appended as one more row, after the transpose: (n, k) → (n + 1, k)
``heads``      k: cut the last axis into k equal heads, (n, k·h) → (k, n, h), one group per head
=============  ===================================================================================

The first block's pattern enumerates the matches (every parameter name it matches, in model order); the
placeholders it captures fill in the other blocks' patterns. Each match is one factor of the perturbation
space, its heads (or a single group) on the leading batch axis. So for the match θ the block is

    X = split_heads( [Pᵀ ; b] )   (transpose and bias when declared)

and the binding's ``act(θ, A)`` is the generated module's own ``act`` on the blocks. A declared binding is
used only after :func:`~geosharp_ref.symmetry.check.check_symmetry` measured that acting with random
elements of the declared group leaves the model's output unchanged (float64).

Every entry is checked against the kernel module before any model is touched (:func:`check_declarations`):
unknown keys, missing or unknown blocks, and block shapes that contradict ``BLOCK_SHAPES`` (e.g. two blocks
that must share ``h``) are refused with a message that names the entry.
"""
from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from ..kernels import kernel_name
from ..sampling import sample_group_element
from .binding import claim

__all__ = ["DeclaredBinding", "check_declarations", "declared_bindings", "BLOCK_KEYS"]

#: the keys a block entry may have
BLOCK_KEYS = ("param", "transpose", "bias", "heads")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _entry(spec) -> dict:
    return {"param": spec} if isinstance(spec, str) else dict(spec)


def check_declarations(module, declarations, where: str = "BINDINGS") -> list:
    """The declarations for kernel ``module`` (a list of {block: entry} dicts), checked without a model;
    ValueError naming the first bad entry. Returns them with every entry as a dict."""
    blocks = tuple(module.BLOCKS)
    if isinstance(declarations, Mapping):
        declarations = [declarations]
    if not isinstance(declarations, (list, tuple)) or not declarations:
        raise ValueError(f"{where} must be a non-empty list of {{block: parameter pattern}} dicts for the blocks "
                         f"{list(blocks)}, got {declarations!r}")
    out = []
    for i, decl in enumerate(declarations):
        at = f"{where}[{i}]"
        if not isinstance(decl, Mapping):
            raise ValueError(f"{at} must be a dict {{block: pattern}} for the blocks {list(blocks)}, got {decl!r}")
        unknown = [b for b in decl if b not in blocks]
        missing = [b for b in blocks if b not in decl]
        if unknown or missing:
            raise ValueError(f"{at} must bind exactly the blocks {list(blocks)} of {kernel_name(module)}"
                             + (f"; unknown: {unknown}" if unknown else "") + (f"; missing: {missing}" if missing else ""))
        entries = {}
        for b in blocks:
            e = decl[b]
            if not isinstance(e, (str, Mapping)):
                raise ValueError(f"{at}[{b!r}] must be a parameter-name pattern or a dict with keys {list(BLOCK_KEYS)}, "
                                 f"got {e!r}")
            e = _entry(e)
            bad = [k for k in e if k not in BLOCK_KEYS]
            if bad:
                raise ValueError(f"{at}[{b!r}] has unknown keys {bad}; allowed: {list(BLOCK_KEYS)}")
            if not isinstance(e.get("param"), str) or not e["param"]:
                raise ValueError(f"{at}[{b!r}] needs 'param': a parameter-name pattern such as "
                                 f"'encoder.layer.{{i}}.attention.self.query.weight'")
            if "heads" in e and not (isinstance(e["heads"], int) and not isinstance(e["heads"], bool)
                                     and e["heads"] >= 1):
                raise ValueError(f"{at}[{b!r}]['heads'] must be a positive integer, got {e['heads']!r}")
            if "transpose" in e and not isinstance(e["transpose"], bool):
                raise ValueError(f"{at}[{b!r}]['transpose'] must be true or false, got {e['transpose']!r}")
            if "bias" in e and not isinstance(e["bias"], str):
                raise ValueError(f"{at}[{b!r}]['bias'] must be a parameter-name pattern, got {e['bias']!r}")
            entries[b] = e
        for b, e in entries.items():
            for pat in (e["param"], e.get("bias")):
                if pat and ("{" in _PLACEHOLDER.sub("", pat) or "}" in _PLACEHOLDER.sub("", pat)):
                    raise ValueError(f"{at}[{b!r}]: {pat!r} has braces that are no placeholder; a placeholder is "
                                     f"{{name}} (letters, digits, underscores)")
        first = set(_PLACEHOLDER.findall(entries[blocks[0]]["param"]))
        for b, e in entries.items():
            for pat in (e["param"], e.get("bias")):
                extra = set(_PLACEHOLDER.findall(pat or "")) - first
                if extra:
                    raise ValueError(f"{at}[{b!r}] uses placeholders {sorted(extra)} that the first block "
                                     f"({blocks[0]!r}: {entries[blocks[0]]['param']!r}) does not capture")
        heads = {e.get("heads", 1) for e in entries.values()}
        if len(heads) > 1:
            raise ValueError(f"{at}: every block must have the same number of heads (the batch of groups), got "
                             f"{sorted(heads)}")
        out.append(entries)
    return out


def _pattern_regex(pattern: str) -> re.Pattern:
    """``{name}``: one dotted segment ``[^.]+``; at the start of the pattern a module path ``.+?``."""
    parts, last, seen = [], 0, set()
    for m in _PLACEHOLDER.finditer(pattern):
        parts.append(re.escape(pattern[last:m.start()]))
        name = m.group(1)
        span = ".+?" if m.start() == 0 else "[^.]+"
        parts.append(f"(?P={name})" if name in seen else f"(?P<{name}>{span})")
        seen.add(name)
        last = m.end()
    parts.append(re.escape(pattern[last:]))
    return re.compile("".join(parts) + r"\Z")


class DeclaredBinding:
    """One match of a declaration: the blocks of kernel module ``kernels`` cut out of named parameters (a
    :class:`~geosharp_ref.symmetry.binding.Binding`; ``checked`` is False until
    :func:`~geosharp_ref.symmetry.check.check_symmetry` has measured it on a model).

    ``entries``: block → {param, transpose, bias, heads} with the placeholders filled in (concrete names)."""

    def __init__(self, kernels, entries: dict, key: str):
        self.kernels, self.entries, self.key = kernels, entries, key
        self.checked = False  # set by geosharp_ref.symmetry.check.check_symmetry
        names = []
        for e in entries.values():
            names += [e["param"]] + ([e["bias"]] if e.get("bias") else [])
        self.param_names = tuple(names)

    def _block(self, params, e):
        X = params[e["param"]]
        if e.get("transpose"):
            X = X.mT
        if e.get("bias"):
            X = torch.cat([X, params[e["bias"]][None, :]], dim=-2)
        k = e.get("heads", 1)
        n, w = X.shape[-2:]
        return X.reshape(n, k, w // k).permute(1, 0, 2)  # (k, n, h)

    def extract(self, params) -> tuple:
        """The blocks (k, n, h) in ``BLOCKS`` order."""
        return tuple(self._block(params, self.entries[b]) for b in self.kernels.BLOCKS)

    def insert(self, params, blocks) -> dict:
        out = dict(params)
        for b, X in zip(self.kernels.BLOCKS, blocks):
            e = self.entries[b]
            k, n, h = X.shape
            X = X.permute(1, 0, 2).reshape(n, k * h)
            if e.get("bias"):
                out[e["bias"]] = X[-1]
                X = X[:-1]
            out[e["param"]] = X.mT if e.get("transpose") else X
        return out

    def act(self, params, element) -> dict:
        """ψ(A, θ) by the generated module's ``act`` on the blocks."""
        return self.insert(params, tuple(self.kernels.act(*self.extract(params), element)))

    def random_element(self, params, scale: float = 1.0, seed: int = 0):
        """A random element of the declared group for these blocks (well-conditioned, times ``scale``)."""
        blocks = self.extract(params)
        return sample_group_element(self.kernels, tuple(b.cpu() for b in blocks), seed=seed,
                                    scale=scale).to(blocks[0].device)


def _check_shapes(module, binding, params, at):
    sizes = {}
    for b, dims, X in zip(module.BLOCKS, module.BLOCK_SHAPES, binding.extract(params)):
        if len(dims) != 2:
            raise ValueError(f"{at}: block {b!r} of {kernel_name(module)} is element-wise; declared "
                             f"bindings cut matrix blocks only")
        for d, size in zip(dims, X.shape[-2:]):
            want = int(d) if d.isdigit() else sizes.setdefault(d, size)
            if size != want:
                why = (f"its axis {d!r} must have size {want}" if d.isdigit() else
                       f"{d} = {want} (from the other blocks)")
                raise ValueError(f"{at}: block {b!r} has shape {tuple(X.shape[-2:])} per group but the geometry "
                                 f"needs {tuple(dims)}: {why}; check 'transpose' and 'heads'")


def declared_bindings(model_or_params, module, declarations, where: str = "BINDINGS") -> list:
    """Every match of ``declarations`` (:func:`check_declarations` format) among the model's parameters, as
    :class:`DeclaredBinding` objects, in model order. ValueError when a pattern matches nothing, a filled-in
    name is not a parameter, shapes disagree with the geometry, or a parameter is bound twice."""
    params = (dict(model_or_params.named_parameters()) if hasattr(model_or_params, "named_parameters")
              else dict(model_or_params))
    names = list(params)
    found, owner = [], {}
    checked = check_declarations(module, declarations, where)
    for i, entries in enumerate(checked):
        at = f"{where}[{i}]"
        first = entries[module.BLOCKS[0]]
        rx = _pattern_regex(first["param"])
        matches = [(n, m.groupdict()) for n in names if (m := rx.match(n))]
        if not matches:
            sample = ", ".join(names[:4])
            raise ValueError(f"{at}: the pattern {first['param']!r} matches no parameter of the model (names look "
                             f"like: {sample}, …); `geosharp symmetries MODEL_DIR` lists them")
        for name, values in matches:
            filled = {}
            for b, e in entries.items():
                f = dict(e)
                for key in ("param", "bias"):
                    if f.get(key):
                        f[key] = _PLACEHOLDER.sub(lambda m, v=values: v[m.group(1)], f[key])
                        if f[key] not in params:
                            raise ValueError(f"{at}[{b!r}]: {f[key]!r} (from the match {name!r}) is not a parameter "
                                             f"of the model")
                P = params[f["param"]]
                if P.dim() != 2:
                    raise ValueError(f"{at}[{b!r}]: {f['param']!r} has shape {tuple(P.shape)}; a block is cut from a "
                                     f"matrix (2 axes)")
                width = P.shape[0] if f.get("transpose") else P.shape[1]
                if f.get("bias") and params[f["bias"]].shape != (width,):
                    raise ValueError(f"{at}[{b!r}]: bias {f['bias']!r} has shape {tuple(params[f['bias']].shape)}, "
                                     f"expected ({width},) to be appended as a row")
                if width % f.get("heads", 1):
                    raise ValueError(f"{at}[{b!r}]: {width} columns do not split into {f['heads']} heads")
                filled[b] = f
            label = ",".join(f"{k}={v}" for k, v in values.items()) or name
            entry = f"[{i}]" if len(checked) > 1 else ""
            binding = DeclaredBinding(module, filled, f"{kernel_name(module)}{entry}:{label}")
            _check_shapes(module, binding, params, f"{at} ({label})")
            claim(owner, binding)
            found.append(binding)
    return found
