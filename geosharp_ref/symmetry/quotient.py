r"""Which symmetries of a model are quotiented: :class:`Quotient`, the one place that decides.

A perturbation space quotients each symmetry by its own geometry, so **a parameter belongs to one symmetry**
(:func:`~geosharp_ref.symmetry.binding.claim`). :class:`Quotient` alone resolves the symmetries of a model
and applies that rule with its precedence:

1. **explicit** symmetries (bindings, or factors wrapping one) come first; two of them sharing a parameter
   are an error (``parameter … is bound twice, by … and …; a parameter belongs to one symmetry``). A
   declared binding not yet measured (``checked`` False) is checked on the batch first
   (:func:`~geosharp_ref.symmetry.check.check_symmetry`: ValueError with the measured change);
2. the **attention GL(h) pairs** (:func:`~geosharp_ref.symmetry.attention.symmetry_map`) come next: a pair
   sharing a parameter with an explicit symmetry yields to it (its weights go to the adaptive geometry;
   :attr:`Quotient.yielded` says so), and every pair detected takes precedence over the built-ins;
3. the **built-ins** (``"all"``), searched in this order — LoRA adapters (:mod:`.adapters`), ReLU units
   (:mod:`.units`), gated-MLP units (:mod:`.gated`), the classifier head's softmax translation (:mod:`.heads`),
   norm weights (:mod:`.norm_weights`), norm scaling (:mod:`.norms`) — each bound only after its exactness check
   passed on the batch and only where no pair or earlier built-in holds a parameter; then dropped where they share a
   parameter with an explicit one. Where built-ins overlap they are quotiented **jointly** instead (issue 26): a
   LoRA adapter whose rows attention pairs hold binds its other factor and names the pairs (``joint_pairs``; one
   :class:`~geosharp_ref.sharpness.joint_lora.JointLoRAFactor` per connected set), a norm's weights and a stream
   scaling whose writers others hold bind what no other symmetry holds and **fold** into the rest
   (:meth:`Quotient.folded`: every pair and binding reading a bound norm sees W Γ). :attr:`Quotient.joint` lists
   these groups; nothing yields.

Everything else is adaptive (:attr:`Quotient.adaptive_masks`). :func:`find_symmetries` is the built-in
search as a report (``geosharp symmetries`` prints it).
"""
from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field

import torch

from ..kernels import gl_kernels
from . import adapters, gated, heads, norm_weights, norms, units
from .attention import NoAttentionPairsWarning, SymmetryMap, symmetry_map
from .binding import ONE_SYMMETRY, claim
from .summary import summary_lines
from .check import (CHECK_SCALES, CHECK_TOL, check_symmetries_together, check_symmetry, float64_parameters,
                    log_probabilities, rank_refusal, shared_float64_reference)

__all__ = ["Quotient", "SymmetryReport", "find_symmetries", "bound_binding", "ATTENTION_KIND"]

#: the kind of the attention pairs in :attr:`Quotient.refused`
ATTENTION_KIND = "attention GL(h)"


@dataclass
class SymmetryReport:
    """What :func:`find_symmetries` found: ``smap`` (the attention pairs), ``bindings`` (the further
    symmetries accepted), and ``entries``: one ``(key, kind, status, detail)`` per candidate, status
    ``"bound"`` or ``"refused"``."""

    smap: object
    bindings: list = field(default_factory=list)
    entries: list = field(default_factory=list)
    #: ``(key, [keys quotiented jointly with it])`` (:attr:`Quotient.joint`)
    joint: list = field(default_factory=list)

    @property
    def refused(self) -> list:
        return [(k, d) for k, _, s, d in self.entries if s == "refused"]

    def __str__(self) -> str:
        heads_ = sum(g.num_heads for g in self.smap.groups)
        rope = sum(1 for g in self.smap.groups if getattr(g, "rotary", None) is not None)
        lines = [f"attention GL(h): {len(self.smap.groups)} pairs ({heads_} heads) bound"
                 + (f" ({rope} rotary Q/K pairs under the RoPE subgroup)" if rope else "")
                 + f", {len(self.smap.refused)} refused"]
        for kind in dict.fromkeys(k for _, k, _, _ in self.entries):
            rows = [e for e in self.entries if e[1] == kind]
            bound = sum(1 for e in rows if e[2] == "bound")
            lines.append(f"{kind}: {bound} bound, {len(rows) - bound} refused")
            lines += [f"  {'bound':7s} {key}: {detail}" for key, _, status, detail in rows if status == "bound"]
            # a refusal repeated per layer: one line with the count and the layer range
            lines += summary_lines([(key, detail) for key, _, status, detail in rows if status == "refused"],
                                   status=f"{'refused':7s}")
        if self.joint:
            lines.append(f"joint groups: {len(self.joint)} symmetries quotiented as one group with those sharing "
                         f"their parameters (norm weights and the stream scaling folded, LoRA × attention pairs; "
                         f"nothing yielded)")
            lines += summary_lines([(key, "with " + (", ".join(keys) if keys else "its readers' adaptive geometry "
                                                                                "alone"))
                                    for key, keys in self.joint], status=f"{'joint':7s}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return dict(bindings=[b.key for b in self.bindings],
                    entries=[dict(key=k, kind=t, status=s, detail=d) for k, t, s, d in self.entries],
                    joint=[dict(key=n, keys=list(k)) for n, k in self.joint])


def bound_binding(symmetry):
    """The binding a symmetry entry stands for: a factor's ``binding`` (an object with ``kernels`` and
    ``binding``, e.g. :class:`geosharp_ref.sharpness.factors.Factor`), or the entry itself when it names its
    ``kernels``; ValueError otherwise."""
    inner = getattr(symmetry, "binding", None)
    if inner is not None and hasattr(symmetry, "kernels"):
        return inner
    if not hasattr(symmetry, "kernels"):
        raise ValueError(f"{symmetry!r} is neither a Factor nor a binding with a `kernels` attribute (e.g. "
                         f"geosharp_ref.symmetry.ReLUUnitsBinding)")
    return symmetry


def _partly_bound(masks: dict, params, symmetries, bound: dict) -> dict:
    """The adaptive masks without the parameters the symmetries bind; a parameter a binding binds only partly
    (its optional ``coverage(shapes)``: name → bool mask of the bound elements, e.g. the up half of a fused
    ``gate_up_proj``) keeps its unbound elements adaptive."""
    shapes = {n: tuple(v.shape) if torch.is_tensor(v) else tuple(v) for n, v in params.items()}
    partial = {}
    for s in symmetries:
        cov = getattr(bound_binding(s), "coverage", None)
        for n, c in (cov(shapes) if callable(cov) else {}).items():
            partial[n] = c if n not in partial else partial[n] | c
    out = {}
    for n, m in masks.items():
        if n in partial:
            keep = ~partial[n] if m is None else (m & ~partial[n])
            if bool(keep.any()):
                out[n] = keep
        elif n not in bound:
            out[n] = m
    return out


def _clash(owner: dict, binding) -> list:
    return sorted({owner[n] for n in binding.param_names if n in owner})


def _builtins(model, batch, metric: str, smap, seed: int) -> SymmetryReport:
    """The built-in search (the module doc, step 3): every family's candidates, checked and bound in order
    (one shared float64 copy of the model for all checks)."""
    with shared_float64_reference():
        return _checked_builtins(model, batch, metric, smap, seed, float64_parameters(model))


def _checked_builtins(model, batch, metric: str, smap, seed: int, params64) -> SymmetryReport:
    taken = {n: g.key for g in smap.groups for n in g.param_names}
    report = SymmetryReport(smap)

    def consider(binding, kind, worst=None, note=""):
        """Bind ``binding`` unless a parameter is taken or its check fails (``worst``: already measured)."""
        clash = _clash(taken, binding)
        if clash:
            report.entries.append((binding.key, kind, "refused", f"its parameters belong to {', '.join(clash)} "
                                                                  f"({ONE_SYMMETRY})"))
            return
        singular = rank_refusal(binding, params64)
        if singular:  # refused before any compute (its Gram matrix would fail the quotient metric)
            report.entries.append((binding.key, kind, "refused", singular))
            return
        try:
            if worst is None:
                worst = check_symmetry(model, binding, batch, seed, params64)
        except ValueError as exc:
            report.entries.append((binding.key, kind, "refused", str(exc)))
            return
        what = getattr(binding, "summary", None) or f"{binding.kernels} on {len(binding.param_names)} parameters"
        report.entries.append((binding.key, kind, "bound", f"{what}; output change {worst:.1e}{note}"))
        report.bindings.append(binding)
        for n in binding.param_names:
            taken[n] = binding.key

    def offer(candidates, kind):
        together, claimed = [], {}
        for _, binding, _ in candidates:  # the candidates free of any clash: checked together first
            if (binding is not None and not _clash(taken, binding) and not _clash(claimed, binding)
                    and not rank_refusal(binding, params64)):
                together.append(binding)
                claimed.update((n, binding.key) for n in binding.param_names)
        worst = None
        if len(together) > 1:
            try:
                worst = check_symmetries_together(model, together, batch, seed, params64)
            except ValueError:  # one of them is not a symmetry: check each on its own to say which
                worst = None
        note = f" (checked together with the other {len(together) - 1})" if worst is not None else ""
        for key, binding, reason in candidates:
            if binding is None:
                report.entries.append((key, kind, "refused", reason))
            else:
                joint = worst is not None and any(binding is t for t in together)
                consider(binding, kind, worst if joint else None, note if joint else "")
                bar.update(1)

    lora = adapters.lora_bindings(model, kernels=gl_kernels(metric))
    gated_mlps = gated.gated_mlp_candidates(model, metric)
    relu = units.relu_units_candidates(model, metric)
    if gated_mlps:  # a decoder's MLPs are gated: no "no MLP of a recognised layout" line for ReLU units
        relu = [c for c in relu if c.key != "MLP"]
    translation = heads.head_translation_candidates(model, batch)
    norm_w = norm_weights.norm_weight_candidates(model, batch)
    from tqdm.auto import tqdm

    total = len(lora) + sum(c[1] is not None for c in [*relu, *gated_mlps, *translation, *norm_w])
    # progress on a terminal only (disable=None), for models with many layers
    bar = tqdm(total=total, desc="checking symmetries (float64)", unit="binding", disable=None, leave=False)
    with bar:
        groups = {g.key: g for g in smap.groups}
        for b in lora:
            clash = _clash(taken, b)
            held = [groups[k] for k in clash if k in groups]
            if clash and len(held) == len(clash):  # held by attention pairs only: quotiented jointly with them
                b = adapters.joint_with_pairs(b, held)
            consider(b, adapters.KIND)
            bar.update(1)
        offer(relu, units.KIND)
        offer(gated_mlps, gated.KIND)
        offer(translation, heads.KIND)
        offer(norm_w, norm_weights.KIND)
    scaling, refused = norms.norm_scaling_bindings(model, batch, log_probabilities, tol=CHECK_TOL,
                                                   elements=CHECK_SCALES)
    for b in scaling:  # measured by norm_scaling_bindings at CHECK_SCALES already (and eps = 0 required)
        # writers held by a pair or an earlier built-in: quotiented jointly with them (the stream fold)
        joint = b.joint_with(taken) if _clash(taken, b) else None
        consider(joint or b, norms.KIND, worst=b.measured_change)
    for key, why in refused:
        report.entries.append((key, norms.KIND, "refused", why))
    return report


class Quotient:
    r"""The symmetries quotiented in one perturbation space, resolved once (see the module doc).

    Attributes:
        smap: the attention :class:`~geosharp_ref.symmetry.attention.SymmetryMap` detected or given (None
            when none was needed).
        metric: the GL(h) pair metric (``"inv"``/``"mix"``), or None (pairs left adaptive).
        pairs: the attention :class:`~geosharp_ref.symmetry.attention.PairGroup` objects kept, each with
            ``kernels = "gl_<metric>"`` (a rotary Q/K pair: ``"rope_<pairing>_<metric>"``, the RoPE subgroup;
            a declared ``gl_pair`` metric module leaves rotary pairs adaptive, listed in :attr:`refused`);
            empty when ``metric`` is None.
        bindings: the further symmetries kept: the explicit ones as given (bindings or factors), then the
            built-ins that ``"all"`` found and that share no parameter with them.
        all: ``pairs + bindings``.
        bound: parameter name → key of the binding (of :attr:`bindings`) that binds it.
        yielded: ``(pair key, reason)`` for each attention pair that yielded to an explicit symmetry.
        refused: ``(key, kind, reason)`` for each symmetry found but not used: attention pairs refused by
            detection (kind :data:`ATTENTION_KIND`), built-ins whose check failed, whose layout is not
            recognised or which overlap a pair, an earlier built-in or an explicit symmetry.
        adaptive_masks: parameter name → None (the whole tensor) or a bool mask of the elements that no kept
            symmetry covers: the adaptive geometry's share. Parameters a binding binds are absent.
    """

    def __init__(self, smap, metric, pairs, bindings, bound, yielded, refused, adaptive_masks, report=None):
        self.smap, self.metric = smap, metric
        self.pairs, self.bindings, self.bound = list(pairs), list(bindings), dict(bound)
        self.yielded, self.refused = list(yielded), list(refused)
        self.adaptive_masks = adaptive_masks
        self._report = report

    @property
    def all(self) -> list:
        return self.pairs + self.bindings

    # -- construction -------------------------------------------------------------------------------------

    @classmethod
    def assemble(cls, params, smap, metric, symmetries=()) -> "Quotient":
        """The quotient of parameters ``params`` (name → tensor, or name → shape) by the pairs of ``smap``
        (None: none) with ``gl_<metric>`` (``metric`` None: pairs left adaptive) and the given ``symmetries``
        (bindings or factors; no check, no ``"all"``): ValueError where two of them bind one parameter;
        pairs sharing a parameter with one of them yield."""
        symmetries = list(symmetries)
        refused = [(k, ATTENTION_KIND, why) for k, why in (smap.refused if smap is not None else ())]
        if smap is None or metric not in ("inv", "mix"):  # LoRA × pairs needs the pairs, under inv or mix
            joint = [s for s in symmetries if getattr(bound_binding(s), "joint_pairs", None)]
            symmetries = [s for s in symmetries if not any(s is j for j in joint)]
            refused += [(bound_binding(j).key, adapters.KIND, "quotiented jointly with attention pairs only under "
                                                             "their built-in inv or mix metric: adaptive")
                        for j in joint]
        bound = {}
        for s in symmetries:
            claim(bound, bound_binding(s))
        if smap is None or not metric:
            return cls(smap, metric, [], symmetries, bound, [], refused,
                       _partly_bound({n: None for n in params}, params, symmetries, bound)).folded()
        kept, yielded = [], []
        for g in smap.groups:
            taken = sorted({bound[n] for n in g.param_names if n in bound})
            if getattr(g, "rotary", None) is not None and not isinstance(metric, str):
                refused.append((g.key, ATTENTION_KIND, "a rotary Q/K pair is quotiented by the built-in RoPE "
                                                       "subgroup kernels (metric inv or mix), not by a declared "
                                                       "gl_pair metric: its weights are adaptive"))
            elif taken:
                yielded.append((g.key, f"shares parameters with {', '.join(taken)} ({ONE_SYMMETRY}): its weights "
                                       f"are adaptive instead"))
            else:
                kept.append(g)
        masks = smap.adaptive_masks if len(kept) == len(smap.groups) else SymmetryMap(kept, smap.param_shapes,
                                                                    smap.refused).adaptive_masks
        masks = _partly_bound(masks, params, symmetries, bound)
        return cls(smap, metric, [g.with_metric(metric) for g in kept], symmetries, bound, yielded, refused,
                   masks).folded()

    def folded(self) -> "Quotient":
        """This quotient with every symmetry whose parameters read a bound norm (a
        :class:`~geosharp_ref.symmetry.norm_weights.NormWeightsBinding`) seen through that norm's fold, so the
        norm group and the readers' groups are quotiented jointly (:mod:`.norm_weights`); itself when no
        norm weights are bound. A factor given explicitly has its binding folded."""
        folds = norm_weights.folds_of(map(bound_binding, self.bindings))
        if not folds:
            return self

        def fold(s):
            inner = bound_binding(s)
            if inner is s:
                return norm_weights.fold_binding(s, folds)
            out = copy.copy(s)
            object.__setattr__(out, "binding", norm_weights.fold_binding(inner, folds))
            return out

        self.pairs = [norm_weights.fold_binding(g, folds) for g in self.pairs]
        self.bindings = [fold(s) for s in self.bindings]
        return self

    @property
    def joint(self) -> list:
        """``(key, [keys of the symmetries quotiented jointly with it])`` per joint symmetry: a bound norm's
        weights (the pairs and bindings reading it, seen through its fold, :mod:`.norm_weights`), a stream
        scaling whose writers other symmetries hold (folded likewise), a LoRA adapter quotiented with the
        attention pairs holding its rows (:func:`~geosharp_ref.symmetry.adapters.joint_with_pairs`)."""
        out = []
        for b in map(bound_binding, self.bindings):
            fold = getattr(b, "joint_fold", None)
            if fold is not None:
                out.append((b.key, [bound_binding(s).key for s in self.all
                                    if fold in getattr(bound_binding(s), "norm_folds", ())]))
            elif getattr(b, "joint_pairs", None):
                out.append((b.key, list(b.joint_pairs)))
        return out

    @classmethod
    def resolve(cls, model, batch=None, *, metric="mix", symmetries=None, smap=None, seed: int = 0) -> "Quotient":
        """Resolve the symmetries of ``model`` (see the module doc).

        ``batch``: one ``(inputs, targets)`` batch, needed to check declared bindings and for ``"all"``;
        ``metric``: ``"inv"``/``"mix"`` for the attention pairs (and the GL(1)/GL(r) built-ins), None to
        leave the pairs adaptive (built-ins then use ``"mix"``); ``symmetries``: None, ``"all"``, or a list of
        bindings / factors, optionally with an ``"all"`` entry; ``smap``: the attention pairs (default:
        :func:`~geosharp_ref.symmetry.attention.symmetry_map` of the model, detected when needed; it warns
        :class:`~geosharp_ref.symmetry.attention.NoAttentionPairsWarning` only when no symmetries are given);
        ``seed``: of the check's random group elements."""
        if symmetries is None:
            symmetries = []
        elif isinstance(symmetries, str):
            symmetries = [symmetries]
        explicit = [s for s in symmetries if not isinstance(s, str)]
        words = [s for s in symmetries if isinstance(s, str)]
        if any(w != "all" for w in words):
            raise ValueError(f"unknown symmetries entry {next(w for w in words if w != 'all')!r}: give factors, "
                             f"bindings or 'all'")
        unchecked = [s for s in explicit if getattr(s, "checked", True) is False]
        if (unchecked or words) and batch is None:
            raise ValueError("a batch is needed to check the symmetries (declared bindings, 'all') on the model")
        for s in unchecked:  # a declaration is used only once it is measured to be a symmetry of this model
            check_symmetry(model, s, batch, seed)
        if smap is None and (metric or words):
            with warnings.catch_warnings():
                if symmetries:  # no attention pairs is fine when other symmetries are quotiented
                    warnings.filterwarnings("ignore", category=NoAttentionPairsWarning)
                smap = symmetry_map(model)
        report, found, overlap = None, [], []
        if words:
            taken = {n: bound_binding(s).key for s in explicit for n in bound_binding(s).param_names}
            report = _builtins(model, batch, metric or "mix", smap, seed)
            kinds = {k: t for k, t, _, _ in report.entries}
            for b in report.bindings:
                clash = _clash(taken, b)
                if clash:
                    overlap.append((b.key, kinds[b.key], f"its parameters belong to {', '.join(clash)} "
                                                         f"({ONE_SYMMETRY})"))
                else:
                    found.append(b)
        q = cls.assemble(dict(model.named_parameters()), smap, metric, explicit + found)
        if report is not None:
            q.refused += [(k, t, d) for k, t, s, d in report.entries if s == "refused"] + overlap
        if report is not None:
            report.joint = q.joint
        q._report = report
        return q

    # -- reporting ----------------------------------------------------------------------------------------

    def report(self) -> SymmetryReport:
        """The :class:`SymmetryReport` of the built-in search (``"all"``), or, without one, the attention pairs
        and the explicit symmetries kept."""
        if self._report is not None:
            return self._report
        smap = self.smap if self.smap is not None else SymmetryMap([], {}, [])
        entries = [(b.key, "given", "bound", f"{b.kernels} on {len(b.param_names)} parameters")
                   for b in map(bound_binding, self.bindings)]
        return SymmetryReport(smap, list(self.bindings), entries)

    def __repr__(self) -> str:
        return (f"Quotient(metric={self.metric!r}, pairs={[g.key for g in self.pairs]}, "
                f"bindings={[bound_binding(b).key for b in self.bindings]}, yielded={len(self.yielded)}, "
                f"refused={len(self.refused)})")


def find_symmetries(model, batch, *, metric: str = "mix", seed: int = 0, smap=None) -> SymmetryReport:
    """Find, check and bind every built-in symmetry of ``model`` on ``batch`` (``(inputs, targets)``; the inputs
    are what the checks run): ``Quotient.resolve(model, batch, metric=metric, symmetries="all", smap=smap,
    seed=seed).report()``. ``metric`` (``inv``/``mix``) is the quotient metric of the GL(1)/GL(r) bindings
    (ReLU units, LoRA); ``smap``: the attention pairs to give precedence (default:
    :func:`~geosharp_ref.symmetry.attention.symmetry_map` of the model). Returns a :class:`SymmetryReport`."""
    return Quotient.resolve(model, batch, metric=metric, symmetries="all", smap=smap, seed=seed).report()
