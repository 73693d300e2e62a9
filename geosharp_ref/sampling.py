"""Random inputs for verification: well-conditioned points, tangents and group elements.

* :func:`sample_point`, :func:`sample_tangent`, :func:`sample_group_element` — for a generated kernel
  module (its ``BLOCKS``/``BLOCK_SHAPES``/``GROUP``): full-rank, well-conditioned, seeded;
* :func:`orbit_element` — one GL(h) element per head, A = a·Q·diag(u) (condition number ≤ 4 whatever the
  scale a); :func:`draw_orbit_elements` — one for every group of a model's symmetry map.
"""
from __future__ import annotations

import math

import torch

__all__ = ["well_conditioned", "sample_point", "sample_tangent", "sample_group_element", "orbit_element",
           "draw_orbit_elements", "DEFAULT_SIZES"]

DEFAULT_SIZES = {"n": 4, "m": 3, "h": 2, "k": 3}


def _shape(mod, b, sizes, elementwise_len):
    dims = mod.BLOCK_SHAPES[mod.BLOCKS.index(b)]
    if not dims:
        return (elementwise_len,)
    return tuple(sizes.get(d, 1 if d == "1" else 3) if not d.isdigit() else int(d) for d in dims)


def well_conditioned(shape, gen, dtype, cond=4.0):
    """Random matrices (..., r, c) with singular values in [1, cond] (log-uniform)."""
    *batch, r, c = shape
    k = min(r, c)
    U = torch.linalg.qr(torch.randn(*batch, r, r, generator=gen, dtype=dtype))[0][..., :, :k]
    V = torch.linalg.qr(torch.randn(*batch, c, c, generator=gen, dtype=dtype))[0][..., :, :k]
    s = torch.exp(torch.rand(*batch, k, generator=gen, dtype=dtype) * math.log(cond))
    return (U * s[..., None, :]) @ V.mT


def sample_point(mod, batch=(), sizes=None, seed=0, dtype=torch.float64, elementwise_len=5):
    """A random point θ (tuple of tensors) for the module's blocks: full-rank, well-conditioned."""
    sizes = {**DEFAULT_SIZES, **(sizes or {})}
    gen = torch.Generator().manual_seed(seed)
    out = []
    for b in mod.BLOCKS:
        shape = tuple(batch) + _shape(mod, b, sizes, elementwise_len)
        if len(shape) - len(batch) == 2:
            out.append(well_conditioned(shape, gen, dtype))
        else:
            x = torch.randn(*shape, generator=gen, dtype=dtype)
            out.append(x.abs() + 0.5 if mod.POSITIVE_BLOCKS else x)
    return tuple(out)


def sample_tangent(mod, point, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in point)


def sample_group_element(mod, point, seed=2, scale=1.0):
    """A random group element: A = scale · (well-conditioned h×h), a > 0, or a ∈ R."""
    gen = torch.Generator().manual_seed(seed)
    ref = point[0]
    if isinstance(mod.GROUP, tuple):
        h = ref.shape[-1]
        return scale * well_conditioned(ref.shape[:-2] + (h, h), gen, ref.dtype)
    batch = ref.shape[:-2] if ref.dim() >= 2 and mod.BLOCK_SHAPES[0] else ref.shape
    if mod.GROUP == "positive":
        return scale * torch.exp(torch.randn(batch, generator=gen, dtype=ref.dtype))
    return torch.randn(batch, generator=gen, dtype=ref.dtype)


def orbit_element(heads, h, scale, generator, dtype=torch.float64):
    """A = a·Ã of shape (heads, h, h), one GL(h) element per head: Ã = Q·diag(u), Q orthogonal (QR of a
    Gaussian, signs fixed), u ~ uniform[0.5, 2], so the condition number is ≤ 4 whatever the scale a."""
    Q, R = torch.linalg.qr(torch.randn(heads, h, h, generator=generator, dtype=dtype))
    Q = Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1)).unsqueeze(-2)
    u = 0.5 + 1.5 * torch.rand(heads, h, generator=generator, dtype=dtype)
    return scale * Q * u.unsqueeze(-2)


def draw_orbit_elements(smap, scale, generator, dtype=torch.float64):
    """Per group of ``smap``, :func:`orbit_element` (heads, h, h) at scale a (one generator for all); a group
    with its own sampler (a rotary Q/K pair: ``g.orbit_element``, an element of the RoPE subgroup) uses it."""
    return [g.orbit_element(scale, generator, dtype) if getattr(g, "rotary", None) is not None
            else orbit_element(g.num_heads, g.head_dim, scale, generator, dtype) for g in smap.groups]
