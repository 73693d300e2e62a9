"""Spec files that declare a symmetry and no metric: ``geosharp derive --spec FILE.py [--metric CHOICE]``.

Such a file defines ``SYMMETRY`` (a :class:`derivations.Symmetry`, or a dict ``{name: Symmetry}``) and
optionally ``ANSATZ`` (a :class:`derivations.invariant.Ansatz`) instead of ``SPEC``. ``geosharp derive`` then
lists the invariant metrics of the ansatz family (:func:`derivations.invariant.invariant_metrics`: a basis
m0, m1, …, each with its invariance proof status and definiteness, the positive-definiteness conditions, and
which built-in metrics lie in the family), and with ``--metric CHOICE`` derives the geometry of one member and
generates its kernel module. CHOICE is a basis name (``m1``), an index (``1``), a sum with optional rational
coefficients (``m1+m3``, ``2*m0+1/2*m2``) or the name of a built-in metric in the family (``inv``, ``mix``);
with several symmetries, prefix the symmetry's name: ``lora:m1+m3``. A :class:`derivations.joint.JointSymmetry`
(with ``SIZES = {dimension: int}``, the concrete sizes its family is solved at) is listed with its invariance
per part; ``--metric`` derives a member (or a built-in name of the declaration, e.g. ``inv``/``mix`` for
:func:`derivations.joint.norm_qk`; ``folded_inv``/``folded_mix`` for any norm weight × GL pair, outside the family,
derived through the fold) into a batched joint kernel module (:func:`codegen.joint.generate_joint_choice`).

Example (examples/symmetry_only_spec.py)::

    from derivations import gl_pair
    from derivations.invariant import Ansatz

    SYMMETRY = {"lora": gl_pair("B", "At", n="d_out", m="d_in", h="r")}
    ANSATZ = Ansatz(degree=1)
"""
from __future__ import annotations

import ast
import re
import runpy
from pathlib import Path

from derivations.errors import DeclarationError, MetricError
from derivations.invariant import Ansatz, InvariantFamily, classify, invariant_metrics
from derivations.joint import JointFamily, JointSymmetry, joint_invariant_metrics
from derivations.metric import BUILTIN_METRICS, builtin_metric
from derivations.quotient import derive_geometry
from derivations.symmetry import Symmetry

from .generate import GeneratedModule, generate_module

__all__ = ["declares_symmetry_only", "load_symmetry_spec", "families", "listing", "generate_invariant"]


def declares_symmetry_only(path) -> bool:
    """True when the file assigns ``SYMMETRY`` at top level and no ``SPEC`` (read without running it)."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8", errors="replace"))
    except (SyntaxError, OSError, ValueError):
        return False
    names = {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
             for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)}
    return "SYMMETRY" in names and "SPEC" not in names


def load_symmetry_spec(path) -> tuple[dict, Ansatz, dict | None]:
    """``({name: Symmetry or JointSymmetry}, Ansatz, SIZES)`` of a symmetry-only spec file, checked (SIZES: the
    concrete sizes a JointSymmetry is solved at, required then)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"spec file {path} does not exist")
    try:
        ns = runpy.run_path(str(path))
    except Exception as exc:
        raise DeclarationError(f"spec file {path} raised {type(exc).__name__}: {exc}; fix the file (it must "
                               "define SYMMETRY = derivations.Symmetry(...) or {name: Symmetry})") from exc
    syms = ns.get("SYMMETRY")
    if isinstance(syms, (Symmetry, JointSymmetry)):
        syms = {syms.name: syms}
    if not isinstance(syms, dict) or not syms or not all(
            isinstance(k, str) and k.isidentifier() and isinstance(v, (Symmetry, JointSymmetry))
            for k, v in syms.items()):
        raise DeclarationError(f"{path}: SYMMETRY must be a derivations.Symmetry (or JointSymmetry) or a non-empty "
                               "dict {identifier: Symmetry}")
    ansatz = ns.get("ANSATZ", Ansatz())
    if not isinstance(ansatz, Ansatz):
        raise DeclarationError(f"{path}: ANSATZ must be a derivations.invariant.Ansatz, got {type(ansatz).__name__}")
    sizes = ns.get("SIZES")
    if any(isinstance(v, JointSymmetry) for v in syms.values()):
        if not (isinstance(sizes, dict) and all(isinstance(k, str) and isinstance(v, int) and v > 0
                                                for k, v in sizes.items())):
            raise DeclarationError(f"{path}: a JointSymmetry is solved at concrete sizes: define SIZES = "
                                   "{dimension name: positive int}, e.g. {'d': 3, 'h': 2}")
    return syms, ansatz, sizes


def families(path) -> dict:
    """{name: InvariantFamily} (or JointFamily for a JointSymmetry, solved at the spec's SIZES)."""
    syms, ansatz, sizes = load_symmetry_spec(path)
    return {name: (joint_invariant_metrics(sym, sizes, degree=ansatz.degree)
                   if isinstance(sym, JointSymmetry) else invariant_metrics(sym, ansatz)) for name, sym in syms.items()}


def builtin_members(fam: InvariantFamily) -> dict:
    """{built-in metric name: {basis name: coefficient}} for the built-in metrics that lie in the family."""
    out = {}
    for kind in sorted({k for _, k in BUILTIN_METRICS}):
        try:
            m = builtin_metric(fam.symmetry, kind)
        except (MetricError, Exception):  # not a built-in of this symmetry, or its blocks differ
            continue
        try:
            coords = fam.coordinates(m)
        except (KeyError, ValueError, NotImplementedError):
            continue
        if coords is not None:
            out[kind] = {k: c for k, c in coords.items() if c != 0}
    return out


def suggestion(fam: InvariantFamily) -> str:
    """A sum of semidefinite basis elements (without subgroup constants) covering every block."""
    chosen = []
    for b in fam.symmetry.blocks:
        if any(b in m.positive_on for m in chosen):
            continue
        for m in fam.basis:
            if b in m.positive_on and m.definiteness != "indefinite" and not any(
                    m.metric.expr.has(Z) for Z in fam.constants):
                chosen.append(m)
                break
    return "+".join(m.name for m in chosen) or "m0"


def _combination_text(coords: dict) -> str:
    return " + ".join(("" if c == 1 else f"{c}*") + k for k, c in coords.items())


def listing(path, fams: dict) -> str:
    lines = []
    for name, fam in fams.items():
        if isinstance(fam, JointFamily):
            lines.append(f"[{name}] invariant metrics of the joint symmetry (sizes {fam.sizes}); invariance per part")
            lines += ["  " + ln for ln in fam.summary().splitlines()]
            continue
        lines.append(f"[{name}] invariant metrics of {fam.symmetry.description}")
        lines += ["  " + ln for ln in fam.summary().splitlines()[1:]]
        named = builtin_members(fam)
        if named:
            lines.append("  built-in metrics in the family: "
                         + "; ".join(f"{k} = {_combination_text(v)}" for k, v in named.items()))
    plain = {k: f for k, f in fams.items() if not isinstance(f, JointFamily)}
    if not plain:
        name, fam = next(iter(fams.items()))
        prefix = f"{name}:" if len(fams) > 1 else ""
        lines.append(f"derive one with: geosharp derive --spec {path} --metric {prefix}{_joint_hint(fam)} (names, "
                     "indices joined by '+', or a built-in name of the declaration)")
        return "\n".join(lines)
    name, fam = next(iter(plain.items()))
    prefix = f"{name}:" if len(fams) > 1 else ""
    lines.append(f"derive one with: geosharp derive --spec {path} --metric {prefix}{suggestion(fam)} (names, indices or "
                 "built-in names joined by '+')")
    return "\n".join(lines)


def _pick(names, choice: str) -> tuple[str, str]:
    """(symmetry name, choice without its ``NAME:`` prefix)."""
    names = list(names)
    if ":" in choice:
        name, choice = choice.split(":", 1)
        if name not in names:
            raise DeclarationError(f"the spec declares no symmetry {name!r}; it declares {', '.join(names)}")
        return name, choice
    if len(names) > 1:
        raise DeclarationError(f"the spec declares {len(names)} symmetries ({', '.join(names)}); write --metric "
                               "NAME:CHOICE, e.g. " + f"{names[0]}:m0")
    return names[0], choice


def _joint_hint(fam) -> str:
    from derivations.joint_choice import joint_builtin_names

    from .joint import joint_suggestion

    return " or ".join([joint_suggestion(fam), *joint_builtin_names(fam.joint)])


def _resolve(fams: dict, choice: str):
    name, choice = _pick(fams, choice)
    fam = fams[name]
    named = builtin_members(fam)
    if choice.strip() in named:
        coords = named[choice.strip()]
        return name, fam, fam.combination(coords, name=choice.strip())
    return name, fam, fam.metric(choice)


def generate_invariant(path, choice: str, progress=None) -> tuple[list[GeneratedModule], dict]:
    """Derive the geometry of the invariant metric ``choice`` and generate its kernel module (in memory)."""
    import time

    syms, ansatz, sizes = load_symmetry_spec(path)
    name, rest = _pick(syms, choice)
    if isinstance(syms[name], JointSymmetry):  # joint kernels (codegen.joint): batched CG projection
        from .joint import generate_joint_choice

        return generate_joint_choice(path, name, syms[name], rest, sizes, degree=ansatz.degree, progress=progress)
    fams = families(path)
    t0 = time.perf_counter()
    name, fam, metric = _resolve(fams, choice)
    if any(metric.expr.has(Z) for Z in fam.constants):
        raise DeclarationError(
            f"metric {choice!r} uses the subgroup's centralizer constants {', '.join(map(str, fam.constants))}; "
            "kernels are generated for metrics written in the blocks only: choose members without them")
    kind, positive_on = classify(metric, fam)
    if kind != "positive definite":
        missing = [str(b) for b in fam.symmetry.blocks if b not in positive_on]
        raise MetricError(
            f"metric {choice!r} is {kind}, not positive definite" + (f" (degenerate on {', '.join(missing)})"
                                                                    if missing else "")
            + f"; add basis elements positive on every block, e.g. --metric {suggestion(fam)}")
    geo = derive_geometry(metric)
    module_name = re.sub(r"\W+", "_", f"{name}_{metric.name}").strip("_")
    module = generate_module(geo, module_name, origin=f"spec {Path(path).name}, invariant metric {metric.name}")
    seconds = time.perf_counter() - t0
    if progress:
        progress(module_name, seconds)
    return [module], {module_name: seconds}
