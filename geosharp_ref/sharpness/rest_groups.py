"""The adaptive rest of a perturbation space in groups of parameters: one flat tensor per group.

Every operation of the adaptive geometry on the rest (:class:`~geosharp_ref.sharpness.space.ProductSpace`:
the scales c² = (|θ| + offset)², the metric Σ ⟨ξ ⊘ c², η⟩, the projection ξ ⊙ [c > 0], the ascent direction
c² ⊙ ∂F/∂ξ, linear combinations) is element-wise, followed by at most a sum. Done one parameter at a time it
launches one kernel per parameter and operation: on an H100 a 3-iteration ViT-B/32 evaluation launched 30,842
kernels, most of them for the rest (``benchmarks/profile_cuda.py``). Here consecutive parameters of one dtype
and device form groups of at most ``max_bytes``, and each operation runs on one flat tensor per group: the
same element-wise operations on the same values, a few kernels per group (7,840 launches there; the
iteration's time fell by 9 % for adaptive sharpness and not measurably for geodesic-inv,
``benchmarks/RESULTS.md`` section 6).

* :func:`byte_groups` splits the rest into groups (a parameter larger than ``max_bytes`` is a group alone, and
  a group holds one dtype on one device; ``max_bytes`` 0: every parameter alone, the per-parameter reference
  path);
* :func:`flat` gives a group's tensors as one 1-D tensor: a view where they already lie one after another
  in one storage (what :func:`unflat` returns), else a copy (``torch.cat``);
* :func:`unflat` gives a flat tensor back as one tensor per parameter, each over the flat tensor's storage
  (``Tensor.set_``, also for one parameter, so no tensor holds another as its ``_base`` and
  :mod:`geosharp_ref.parking` frees the group's memory once it has parked every tensor of it).

Element-wise results are bit-identical to the per-parameter path; a sum over a group (an inner product) adds
the same terms in another order, so it agrees to round-off. The space chooses the groups
(``ProductSpace(rest_group_bytes=...)``): :data:`GROUP_BYTES` on accelerators, one parameter per group on the
CPU, where a kernel costs no launch and a copy would cost a pass over the memory.
"""
from __future__ import annotations

import torch

__all__ = ["GROUP_BYTES", "byte_groups", "flat", "unflat"]

#: the largest group on an accelerator (bytes of its parameters): bounds the transient flat tensors
GROUP_BYTES = 64 << 20


def byte_groups(tensors, max_bytes: int) -> list[range]:
    """Consecutive index ranges over ``tensors``, each holding at most ``max_bytes`` bytes of one dtype on one
    device (a larger tensor alone; ``max_bytes`` ≤ 0: one tensor per range)."""
    groups, start, size = [], 0, 0
    for j, t in enumerate(tensors):
        nbytes = t.numel() * t.element_size()
        other = j > start and (t.dtype, t.device) != (tensors[start].dtype, tensors[start].device)
        if j > start and (max_bytes <= 0 or size + nbytes > max_bytes or other):
            groups.append(range(start, j))
            start, size = j, 0
        size += nbytes
    if len(tensors) > start:
        groups.append(range(start, len(tensors)))
    return groups


def _tiles_one_storage(ts) -> bool:
    """Whether the contiguous tensors ``ts`` lie one after another in one storage, in order."""
    first = ts[0]
    ptr, offset = first.untyped_storage().data_ptr(), first.storage_offset()
    for t in ts:
        if (not t.is_contiguous() or t.dtype != first.dtype or t.untyped_storage().data_ptr() != ptr
                or t.storage_offset() != offset):
            return False
        offset += t.numel()
    return True


def flat(ts) -> torch.Tensor:
    """The tensors ``ts`` (one dtype and device) as one 1-D tensor, in order: ``ts[0].reshape(-1)`` for one
    tensor, a view of their storage where they tile it in order (as :func:`unflat` leaves them), else a copy."""
    if len(ts) == 1:
        return ts[0].reshape(-1)
    if not any(t.requires_grad for t in ts) and _tiles_one_storage(ts):
        first = ts[0]
        return torch.empty(0, dtype=first.dtype, device=first.device).set_(
            first.untyped_storage(), first.storage_offset(), (sum(t.numel() for t in ts),))
    return torch.cat([t.reshape(-1) for t in ts])


def unflat(f: torch.Tensor, shapes) -> list:
    """The 1-D tensor ``f`` as one tensor per shape in ``shapes`` (their sizes sum to ``f.numel()``), each over
    ``f``'s storage, none a view with ``f`` as its base, so that parking them frees that storage (views where
    ``f`` requires grad: autograd sees them)."""
    if f.requires_grad:
        sizes = [torch.Size(s).numel() for s in shapes]
        return [part.view(s) for part, s in zip(f.split(sizes), shapes)]
    f = f.contiguous()
    storage, offset, out = f.untyped_storage(), f.storage_offset(), []
    for shape in shapes:
        t = torch.empty(0, dtype=f.dtype, device=f.device).set_(storage, offset, shape)
        out.append(t)
        offset += t.numel()
    return out
