r"""The one interface every symmetry of a model implements: :class:`Binding`.

A symmetry of a model is a group action ψ on its parameters θ that leaves the model's function unchanged,
f(ψ(a, θ)) = f(θ) for every group element a. A binding says where the action lives in θ and which geometry
quotients it:

* **blocks** — ``extract(θ) = (X_1, …, X_k)``: tensors cut from the bound parameters, in the kernel module's
  ``BLOCKS`` order and with its ``BLOCK_SHAPES`` per group, batched over the group's leading dimensions
  (one GL(h) per head, one GL(1) per unit, one translation per column, …). ``insert(θ, X)`` is its inverse
  on the bound slices: a NEW dict equal to θ except on the slices the binding covers, so
  ``insert(θ, extract(θ)) == θ`` and bindings sharing a tensor but not its elements compose. ``insert`` is
  affine in the blocks and in θ (slices, reshapes, transposes, fixed scalings such as a norm fold; the elements
  it does not bind are copied): the evaluator maps a gradient of the parameters back to the blocks, and to an
  earlier binding of the same tensor, by its adjoint (``ProductSpace.value_and_grad``);
* **action** — ``act(θ, a) = ψ(a, θ)``, the group acting on the blocks (e.g. (G, H) ↦ (G A, H A⁻ᵀ) for a
  GL(h) pair, W ↦ a W for a scaling); ``random_element(θ, scale, seed)`` draws a well-conditioned group
  element of size ``scale`` (the exactness check acts with scales 10⁻² and 10²);
* **geometry** — ``kernels``: the generated geometry on the blocks that is invariant under ψ and so
  defines the quotient (a built-in name such as ``"gl_mix"``, ``"gl_inv"``, ``"translation"``,
  ``"scaling"``, a ``--spec`` output file, or a module; :func:`geosharp_ref.kernels.load_kernels`);
* **exactness** — a binding is used only once measured to be a symmetry of the model:
  :func:`~geosharp_ref.symmetry.check.check_binding` acts on a float64 copy and requires a relative change of
  the output ≤ 1e-10 (:func:`~geosharp_ref.symmetry.check.check_symmetry`: the log-probabilities, elements
  at scales 10⁻² and 10²).

Two optional attributes complete the protocol where a binding needs them:

* ``kernel_options`` — a dict of extra keyword arguments of its kernels' ``prepare`` (and of their uncached
  calls): which geometry of the module applies to these blocks, e.g. ``{"rotary_dim": r}`` for a rotary Q/K
  pair under the RoPE subgroup (``rope_<pairing>_<metric>``, :class:`~geosharp_ref.symmetry.attention.PairGroup`
  with ``rotary``); :class:`~geosharp_ref.sharpness.factors.Factor` passes them on;
* ``coverage(shapes)`` — name → bool mask of the elements bound, for the parameters it binds only *partly*
  (the up half of a fused ``gate_up_proj``, :class:`~geosharp_ref.symmetry.gated.GatedUnitsBinding`): the
  :class:`~geosharp_ref.symmetry.quotient.Quotient` keeps their other elements adaptive.

``key`` names the binding (``"<module path>:<kind>"``); ``param_names`` are the parameters it binds, fully
or partly. **A parameter belongs to one symmetry**: :func:`claim` is the one place that rule is written,
and :class:`~geosharp_ref.symmetry.quotient.Quotient` the one place that applies it with its precedence.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple, Optional, Protocol, runtime_checkable

from torch import Tensor

__all__ = ["Binding", "Candidate", "claim", "ONE_SYMMETRY"]

#: the rule, as every message that enforces it ends
ONE_SYMMETRY = "a parameter belongs to one symmetry"


@runtime_checkable
class Binding(Protocol):
    """A symmetry bound to parameter blocks (see the module doc for the mathematics).

    Implemented by :class:`~geosharp_ref.symmetry.attention.PairGroup`,
    :class:`~geosharp_ref.symmetry.heads.HeadTranslationBinding`,
    :class:`~geosharp_ref.symmetry.units.ReLUUnitsBinding`, :class:`~geosharp_ref.symmetry.gated.GatedUnitsBinding`, :class:`~geosharp_ref.symmetry.adapters.LoRABinding`,
    :class:`~geosharp_ref.symmetry.norms.NormScalingBinding` and
    :class:`~geosharp_ref.symmetry.declared.DeclaredBinding`."""

    #: stable unique id, ``"<module path>:<kind>"``
    key: str
    #: the parameters bound (fully or partly), names as in ``model.named_parameters()``
    param_names: tuple
    #: the geometry that quotients the symmetry: a built-in kernel name (``"gl_mix"``) or a module
    kernels: object

    def extract(self, params: Mapping[str, Tensor]) -> tuple:
        """The blocks (X_1, …, X_k) in the kernel module's ``BLOCKS`` order, group batch leading; differentiable."""
        ...

    def insert(self, params: Mapping[str, Tensor], blocks) -> dict:
        """A new dict: ``params`` with the bound slices rebuilt from ``blocks``; everything else passed through."""
        ...

    def act(self, params: Mapping[str, Tensor], element) -> dict:
        """ψ(element, params): the group action on the model's parameters (a new dict)."""
        ...

    def random_element(self, params: Mapping[str, Tensor], scale: float = 1.0, seed: int = 0):
        """A well-conditioned random group element of size ``scale`` for these blocks."""
        ...


def claim(owner: dict, binding) -> None:
    """Record in ``owner`` (parameter name → key of the symmetry that binds it) that ``binding`` binds its
    ``param_names``; ValueError if one is bound already (a parameter belongs to one symmetry)."""
    for n in binding.param_names:
        if n in owner:
            raise ValueError(f"parameter {n!r} is bound twice, by {owner[n]} and {binding.key}; {ONE_SYMMETRY}")
        owner[n] = binding.key


class Candidate(NamedTuple):
    """A place in a model where a symmetry family may apply, as its detection reports it: ``binding`` is None
    where the model's structure already refuses it, and ``reason`` then says why (empty otherwise)."""

    key: str
    binding: Optional[object]
    reason: str
