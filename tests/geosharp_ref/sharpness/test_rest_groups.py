"""The adaptive rest in groups (:mod:`geosharp_ref.sharpness.rest_groups`, ``ProductSpace(rest_group_bytes=...)``):
the grouped operations against the per-parameter reference path, element-wise bit for bit and sums to round-off;
and its weights c², 1/c² kept once computed (``ProductSpace(cache_rest_weights=...)``) against computed again in
every operation, bit for bit through whole Auto-PGD runs."""
from __future__ import annotations

import importlib

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.multiprocessing.reductions import StorageWeakRef

from geosharp_ref.apgd import apgd
from geosharp_ref.parking import park
from geosharp_ref.sharpness import ProductSpace, gl_pair_factors, model_loss
from geosharp_ref.sharpness.rest_groups import GROUP_BYTES, byte_groups, flat, unflat
from geosharp_ref.sharpness.space import WEIGHT_CACHE_BYTES
from geosharp_ref.symmetry import symmetry_map
from tests.cases import TinyAttention


@given(sizes=st.lists(st.integers(1, 40), min_size=0, max_size=12), max_bytes=st.integers(-1, 300))
def test_byte_groups_cover_the_tensors_in_order_within_the_byte_bound(sizes, max_bytes):
    ts = [torch.zeros(n, dtype=torch.float64) for n in sizes]
    groups = byte_groups(ts, max_bytes)
    assert [j for r in groups for j in r] == list(range(len(ts)))
    for r in groups:
        nbytes = sum(8 * sizes[j] for j in r)
        assert len(r) == 1 or (max_bytes > 0 and nbytes <= max_bytes)
    for a, b in zip(groups, groups[1:]):  # greedy: the next tensor did not fit
        assert max_bytes <= 0 or sum(8 * sizes[j] for j in a) + 8 * sizes[b[0]] > max_bytes


def test_unflat_tiles_one_storage_that_flat_then_views_without_a_copy():
    gen = torch.Generator().manual_seed(0)
    ts = [torch.randn(s, generator=gen, dtype=torch.float64) for s in [(3, 4), (5,), (2, 1, 3)]]
    f = flat(ts)
    assert torch.equal(f, torch.cat([t.reshape(-1) for t in ts]))
    parts = unflat(f, [t.shape for t in ts])
    assert all(torch.equal(p, t) and p._base is None for p, t in zip(parts, ts))
    assert {p.untyped_storage().data_ptr() for p in parts} == {f.untyped_storage().data_ptr()}
    again = flat(parts)
    assert again.data_ptr() == f.data_ptr() and torch.equal(again, f)  # a view, not a copy
    swapped = flat(parts[::-1])  # not in storage order: a copy
    assert swapped.data_ptr() != f.data_ptr() and torch.equal(swapped, torch.cat([p.reshape(-1) for p in parts[::-1]]))
    assert flat(parts[1:]).data_ptr() == parts[1].data_ptr()  # a tail of the storage tiles it from its offset


def test_byte_groups_start_a_new_group_at_another_dtype():
    ts = [torch.zeros(3), torch.zeros(3), torch.zeros(3, dtype=torch.bfloat16), torch.zeros(2)]
    assert byte_groups(ts, 1 << 20) == [range(0, 2), range(2, 3), range(3, 4)]


def test_unflat_of_one_tensor_is_no_view_and_parking_it_frees_the_storage():
    f = torch.randn(12, dtype=torch.float64) * 2  # a new tensor, as the space's operations make
    (t,) = unflat(f, [(3, 4)])
    assert t._base is None and torch.equal(t, f.view(3, 4))
    ref, expected = StorageWeakRef(f.untyped_storage()), f.clone()
    del f
    handle = park([t])
    assert ref.expired()  # nothing else held the storage
    handle.restore()
    assert torch.equal(t.reshape(-1), expected)


def test_unflat_keeps_autograd_where_the_flat_tensor_requires_grad():
    f = torch.arange(7.0, dtype=torch.float64, requires_grad=True)
    a, b = unflat(f, [(3,), (2, 2)])
    (2 * a.sum() + 3 * b.sum()).backward()
    assert torch.equal(f.grad, torch.tensor([2.0, 2, 2, 3, 3, 3, 3], dtype=torch.float64))


def test_parking_a_group_frees_its_storage_and_restores_it_bit_for_bit():
    f = torch.randn(1000, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    expected = f.clone()
    parts = unflat(f, [(10, 50), (500,)])
    del f  # the parts alone hold the group's storage
    parked = park(parts)
    assert parked.nbytes == 8000 and all(p.numel() == 0 for p in parts)
    parked.restore()
    assert torch.equal(flat(parts), expected)
    assert parts[0].untyped_storage().data_ptr() == parts[1].untyped_storage().data_ptr()


def _spaces(metric, group_bytes, seed=3, **space_options):
    """The per-parameter reference space and a grouped one at the same θ (float64; some θ entries 0, so c = 0
    there; without factors, masks of the parameter's shape and a broadcast one on the rest)."""
    torch.manual_seed(seed)
    model = TinyAttention().double()
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    first = next(iter(params))
    params[first].view(-1)[::3] = 0.0
    model.load_state_dict(params, strict=False)
    batch = (torch.randn(4, 5, 8, dtype=torch.float64), torch.randint(0, 3, (4,)))
    if metric is None:
        gen = torch.Generator().manual_seed(seed)
        masks = {n: None for n in params}
        names = list(params)
        masks[names[1]] = torch.rand(params[names[1]].shape, generator=gen) > 0.3
        two_d = next(n for n in names if params[n].dim() == 2)
        masks[two_d] = torch.rand(params[two_d].shape[0], 1, generator=gen) > 0.5
        factors = ()
    else:
        smap = symmetry_map(model)
        factors, masks = gl_pair_factors(smap.groups, metric), smap.adaptive_masks
    ref = ProductSpace(params, factors, masks, rest_group_bytes=0, **space_options)
    grouped = ProductSpace(params, factors, masks, rest_group_bytes=group_bytes, **space_options)
    return model, batch, ref, grouped


def _same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("metric", [None, "mix"])
@pytest.mark.parametrize("group_bytes", [300, 1 << 30])
def test_grouped_rest_operations_equal_the_per_parameter_path(metric, group_bytes):
    model, batch, ref, grouped = _spaces(metric, group_bytes)
    assert len(grouped.rest_groups) < len(ref.rest_groups) == len(ref.adaptive_names)
    each = list(ref._each_scale2())  # the readable per-parameter c² (masks broadcast)
    for k, r in enumerate(grouped.rest_groups):
        assert torch.equal(grouped._group_scale2(k), torch.cat([each[j].reshape(-1) for j in r]))
    gen = torch.Generator().manual_seed(7)
    xi = ref.random(0.2, gen)
    eta = [torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in xi]
    assert float(grouped.inner(xi, eta)) == pytest.approx(float(ref.inner(xi, eta)), rel=1e-13, abs=1e-15)
    assert _same(grouped.project_horizontal(eta), ref.project_horizontal(eta))
    terms = [(0.3, xi), (torch.tensor(-1.7, dtype=torch.float64), eta), (2.0, xi)]
    assert _same(grouped.lincomb(terms), ref.lincomb(terms))
    for s in (0.25, torch.tensor(1.5, dtype=torch.float64)):
        assert _same(grouped.scale(xi, s), ref.scale(xi, s))
    grad_ref = ref.value_and_grad(lambda p: model_loss(model, p, batch))(xi)[1]
    grad = grouped.value_and_grad(lambda p: model_loss(model, p, batch))(xi)[1]
    assert _same(grad, grad_ref)
    d_ref, dd_ref, xd_ref = ref.ascent_step(xi, grad_ref)
    d, dd, xd = grouped.ascent_step(xi, grad, consume=True)
    assert all(t is None for t in grad)  # consumed
    assert _same(d, d_ref)
    assert float(dd) == pytest.approx(float(dd_ref), rel=1e-13) and float(xd) == pytest.approx(float(xd_ref), rel=1e-13)
    out = grouped.lincomb([(0.5, xi), (0.1, d)], consume=d)
    assert all(t is None for t in d) and _same(out, ref.lincomb([(0.5, xi), (0.1, d_ref)]))


@pytest.mark.parametrize("metric, rho", [(None, 0.3), ("mix", 3.0)])  # radii at which older best points occur
def test_grouped_auto_pgd_follows_the_per_parameter_run_with_every_best_point_parked(metric, rho, monkeypatch):
    """Whole Auto-PGD runs (random start, restarts at the checkpoints, every older best point parked): the
    grouped space's iterates are the reference's to round-off (amplified by the iterations; the single operations
    are compared to 1e-13 above), and on both paths parking frees the storages of the rest (no tensor of it keeps
    another's storage alive as a view's base)."""
    model, batch, ref, grouped = _spaces(metric, 300)
    freed = []

    def watched_park(tensors):
        tensors = list(tensors)
        rest = tensors[-len(ref.adaptive_names):]
        refs = [StorageWeakRef(t.untyped_storage()) for t in rest]
        handle = park(tensors)
        freed.append(handle.nbytes > 0 and all(r.expired() for r in refs))
        return handle
    # the module (the package's name ``geosharp_ref.apgd`` can be the function it exports)
    monkeypatch.setattr(importlib.import_module("geosharp_ref.apgd"), "park", watched_park)
    runs = []
    for space in (ref, grouped):
        freed.clear()
        runs.append(apgd(space.value_and_grad(lambda p: model_loss(model, p, batch)), space, rho, n_iter=30,
                         random_start=True, generator=torch.Generator().manual_seed(2), park_bytes=0))
        assert freed and all(freed)
    # 30 iterations (at ρ = 3 with losses in the hundreds) amplify the sums' round-off (1e-16) to about 1e-8
    assert runs[1].values == pytest.approx(runs[0].values, rel=1e-6)
    for a, b in zip(runs[1].best_xi, runs[0].best_xi):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8)


def test_a_mixed_precision_rest_keeps_each_parameters_dtype():
    gen = torch.Generator().manual_seed(0)
    params = {"a": torch.randn(4, 3, generator=gen), "b": torch.randn(5, generator=gen).to(torch.bfloat16),
              "c": torch.randn(6, generator=gen)}
    ref, grouped = ProductSpace(params, rest_group_bytes=0), ProductSpace(params, rest_group_bytes=1 << 20)
    assert [list(r) for r in grouped.rest_groups] == [[0], [1], [2]]
    xi = ref.random(0.1, torch.Generator().manual_seed(1))
    for out in (grouped.lincomb([(0.5, xi), (2.0, xi)]), grouped.scale(xi, 0.3), grouped.project_horizontal(xi)):
        assert [t.dtype for t in out] == [p.dtype for p in params.values()]
    assert _same(grouped.lincomb([(0.5, xi), (2.0, xi)]), ref.lincomb([(0.5, xi), (2.0, xi)]))


def test_spaces_group_the_rest_on_accelerators_only_unless_told():
    _, _, ref, _ = _spaces(None, 0)
    params, n = ref.base, len(ref.adaptive_names)
    assert len(ProductSpace(params).rest_groups) == n  # the CPU: one parameter per group
    assert len(ProductSpace(params, rest_group_bytes=GROUP_BYTES).rest_groups) == 1
    meta = {k: torch.empty_like(v, device="meta") for k, v in params.items()}  # an accelerator's tensors
    assert len(ProductSpace(meta).rest_groups) == 1
    assert len(ProductSpace(meta, fast=False).rest_groups) == n  # fast=False: the reference path


@pytest.mark.parametrize("metric, rho", [(None, 0.3), ("mix", 3.0)])
@pytest.mark.parametrize("group_bytes", [0, 300])
def test_kept_rest_weights_give_the_recomputed_run_bit_for_bit(metric, rho, group_bytes):
    """The same Auto-PGD run (random start, restarts, parking) with the rest's c² and 1/c² kept and computed
    again in every operation: every value, step size and the best point equal bit for bit; the kept weights are
    still what θ gives afterwards (no operation modified them in place), and a space that does not keep them
    holds none."""
    model, batch, _, again = _spaces(metric, group_bytes, cache_rest_weights=False)
    _, _, _, kept = _spaces(metric, group_bytes, cache_rest_weights=True)
    assert again._weights is None and kept._weights is not None
    runs = [apgd(space.value_and_grad(lambda p: model_loss(model, p, batch)), space, rho, n_iter=30,
                 random_start=True, generator=torch.Generator().manual_seed(2), park_bytes=0)
            for space in (again, kept)]
    assert runs[0].values == runs[1].values and runs[0].step_sizes == runs[1].step_sizes
    assert _same(runs[0].best_xi, runs[1].best_xi)
    assert all(w[0] is not None and w[1] is not None for w in kept._weights)  # every group's were used
    for k, (c2, inv) in enumerate(kept._weights):
        assert torch.equal(c2, again._group_scale2(k)) and torch.equal(inv, again._inverse(again._group_scale2(k)))


def test_spaces_keep_the_rest_weights_where_fast_and_small_unless_told(monkeypatch):
    _, _, ref, _ = _spaces(None, 0)
    params = ref.base
    assert ProductSpace(params)._weights is not None  # tiny: kept
    assert ProductSpace(params, fast=False)._weights is None  # the reference path computes them each time
    rest_bytes = sum(t.numel() * t.element_size() for t in params.values())
    space_module = importlib.import_module("geosharp_ref.sharpness.space")
    assert space_module.WEIGHT_CACHE_BYTES == WEIGHT_CACHE_BYTES
    monkeypatch.setattr(space_module, "WEIGHT_CACHE_BYTES", 2 * rest_bytes)  # c² and 1/c² need exactly this
    assert ProductSpace(params)._weights is None
    monkeypatch.setattr(space_module, "WEIGHT_CACHE_BYTES", 2 * rest_bytes + 1)
    assert ProductSpace(params)._weights is not None
    assert ProductSpace(params, fast=False, cache_rest_weights=True)._weights is not None  # told
