"""Pick a jointly invariant metric by name: a built-in (``inv``, ``mix`` for the norm × Q/K joint symmetry; the
folded metrics ``folded_inv``, ``folded_mix`` for any norm weight × GL pair, :mod:`derivations.joint_folded`) or a
member of a solved :class:`derivations.joint.JointFamily` (``m0``, ``1``, ``m0+m2``, ``2*m1+1/2*m3``), the
grammar of :meth:`derivations.invariant.InvariantFamily.metric`. Used by ``geosharp derive --spec FILE --metric``.
"""
from __future__ import annotations

import re

import sympy as sp

from .errors import DeclarationError
from .joint import JointMetric, JointSymmetry
from .joint_builtins import JOINT_BUILTIN_METRICS, joint_builtin_metric
from .joint_folded import FOLDED_KINDS, folded_metric, is_norm_pair
from .matrix_calculus import canonicalize

__all__ = ["builtin_joint_metric_on", "joint_family_member", "joint_builtin_names"]


def joint_builtin_names(joint: JointSymmetry) -> tuple:
    """The built-in metric kinds that apply to ``joint``: those of its built-in declaration (same name, blocks and
    shapes) and, on a norm weight × GL pair, the folded metrics."""
    own = tuple(k for j, k in JOINT_BUILTIN_METRICS if builtin_joint_metric_on(joint, k) is not None)
    return own + (tuple(FOLDED_KINDS) if is_norm_pair(joint) else ())


def builtin_joint_metric_on(joint: JointSymmetry, kind: str):
    """The built-in metric ``kind`` written on ``joint``'s own blocks (a :class:`JointMetric` of ``joint``), or
    None when it does not apply: ``inv``/``mix`` need the built-in declaration (same name, blocks and shapes), a
    folded kind (:data:`~derivations.joint_folded.FOLDED_KINDS`) a norm weight × GL pair."""
    if kind in FOLDED_KINDS:
        return folded_metric(kind, joint=joint) if is_norm_pair(joint) else None
    if (joint.name, kind) not in JOINT_BUILTIN_METRICS:
        return None
    ref = joint_builtin_metric(joint.name, kind)
    if tuple(joint.blocks) != tuple(ref.symmetry.blocks):
        return None
    return JointMetric(joint, ref.expr, kind)


def joint_family_member(fam, choice: str) -> JointMetric:
    """Σ c_k m_k of the family ``fam`` for a choice such as ``"m0+m2"`` or ``"2*m1+1/2*m3"`` (indices allowed)."""
    names = [m.name for m in fam.basis]
    weights = {}
    for part in re.split(r"\s*\+\s*", choice.strip()):
        mt = re.fullmatch(r"(?:([0-9/.]+)\s*\*\s*)?(m?\d+)", part)
        if not mt:
            raise DeclarationError(f"cannot read {choice!r}: name basis metrics (m0, m1, …) or indices, joined by "
                                   "'+' with optional coefficients, e.g. 'm0+m2' or '2*m1'")
        c, nm = mt.group(1), mt.group(2)
        nm = nm if nm.startswith("m") else f"m{nm}"
        if nm not in names:
            raise DeclarationError(f"no invariant metric {nm!r}; the family has {', '.join(names) or 'no members'}")
        weights[nm] = weights.get(nm, 0) + (sp.Rational(c) if c else 1)
    by_name = {m.name: m for m in fam.basis}
    expr = canonicalize(sp.Add(*[c * by_name[k].metric.expr for k, c in weights.items()]))
    return JointMetric(fam.joint, expr, choice.replace(" ", ""))
