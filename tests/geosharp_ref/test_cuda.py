"""CUDA against the CPU. These tests run only where a CUDA device exists (CI has none; the device machine of a
session that is lent one runs them: ``pytest -m cuda``), and are skipped elsewhere.

Every random draw of the evaluator (Auto-PGD's starting points, Hutchinson's probes, Lanczos' start vector, the
average-case samples) is made on the CPU and moved, so one seed gives the same numbers on any device. In float64,
then, every named measure, every sharpness case, every decoder family with every built-in symmetry quotiented,
length buckets and the command line give on the GPU the CPU's values up to round-off. In float32 the GPU stays
within float32 round-off of the float64 CPU value.
"""
import copy
import json
import warnings

import pytest
import torch

from geosharp_ref.cli import main
from geosharp_ref.sharpness import MEASURES, geodesic_sharpness, get_measure
from tests import cases

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CUDA = torch.device("cuda")
#: float64 on two devices: the same arithmetic up to the order of reductions
RTOL, ATOL = 1e-7, 1e-12


def _options(name: str) -> dict:
    """Small options that exercise each kind of measure (Auto-PGD, average-case, curvature, linearised)."""
    m = get_measure(name)
    if m.curvature is not None:
        return dict(probes=3, steps=5)
    if m.average is not None:
        return dict(n_samples=3)
    if m.linearised:
        return {}
    return dict(n_iter=3, **({"steps": 4} if m.geodesic == "exact" else {}))


def _batches(M, n=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [M.make_batch(gen) for _ in range(n)]


def _assert_close(cpu, gpu, rtol=RTOL, atol=ATOL, what=""):
    for a, b in zip(cpu.per_batch + [cpu.mean] + cpu.loss_before, gpu.per_batch + [gpu.mean] + gpu.loss_before):
        assert abs(a - b) <= rtol * abs(a) + atol, (what, cpu.per_batch, gpu.per_batch)
    assert len(cpu.per_batch) == len(gpu.per_batch)


def _both(evaluate, model):
    """``evaluate(model)`` on the CPU and on a CUDA copy (warnings of tiny models silenced)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return evaluate(model), evaluate(copy.deepcopy(model).to(CUDA))


@pytest.mark.parametrize("name", sorted(MEASURES))
def test_every_measure_gives_the_cpu_value(name):
    M = cases.sharpness_case("bert")
    batches = _batches(M)
    cpu, gpu = _both(lambda m: get_measure(name).evaluate(m, batches, 0.05, symmetry_map=M.smap, loss_fn=M.loss_fn,
                                                          **_options(name)), M.model)
    _assert_close(cpu, gpu, what=name)
    if cpu.relative_size:
        assert gpu.relative_size == pytest.approx(cpu.relative_size, rel=1e-6, abs=1e-12)


@pytest.mark.parametrize("case", cases.SHARPNESS_NAMES)
@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_every_sharpness_case_gives_the_cpu_value(case, metric):
    M = cases.sharpness_case(case)
    batches = _batches(M)
    _assert_close(*_both(lambda m: geodesic_sharpness(m, batches, 0.05, metric=metric, symmetry_map=M.smap,
                                                      loss_fn=M.loss_fn, n_iter=3), M.model), what=case)


@pytest.mark.parametrize("case", cases.DECODER_NAMES)
def test_every_decoder_with_every_symmetry_gives_the_cpu_value(case):
    """RoPE subgroups, GQA, gated MLPs and the joint quotients, all on the device."""
    M = cases.sharpness_case(case, "decoder")
    batches = _batches(M)
    cpu, gpu = _both(lambda m: geodesic_sharpness(m, batches, 0.05, metric="mix", symmetries="all",
                                                  loss_fn=M.loss_fn, n_iter=3), M.model)
    _assert_close(cpu, gpu, what=case)
    assert cpu.config["factors"] and gpu.config["factors"] == cpu.config["factors"]  # the same symmetries found


def test_length_buckets_on_the_device_give_the_plain_cpu_value():
    gen = torch.Generator().manual_seed(1)
    torch.manual_seed(0)
    model = cases.bert().double().eval()
    lens = torch.randint(2, 13, (8,), generator=gen)
    mask = (torch.arange(12) < lens[:, None]).long()
    x = {"input_ids": torch.randint(3, 50, (8, 12), generator=gen) * mask, "attention_mask": mask}
    batches = [(x, torch.randint(0, 3, (8,), generator=gen))]
    m = get_measure("geodesic-mix")
    plain = m.evaluate(model, batches, 0.05, n_iter=3)
    fast = m.evaluate(copy.deepcopy(model).to(CUDA), batches, 0.05, n_iter=3, length_buckets=3)
    _assert_close(plain, fast, rtol=1e-9)


@pytest.mark.parametrize("name", ["adaptive", "geodesic-mix", "hessian-trace-mix"])
def test_float32_on_the_device_is_within_float32_round_off(name):
    M = cases.sharpness_case("bert")
    batches = _batches(M)
    ref = get_measure(name).evaluate(M.model, batches, 0.05, symmetry_map=M.smap, loss_fn=M.loss_fn,
                                     **_options(name))
    model32 = copy.deepcopy(M.model).float().to(CUDA)
    gpu = get_measure(name).evaluate(model32, batches, 0.05, symmetry_map=M.smap, loss_fn=M.loss_fn,
                                     **_options(name))
    assert gpu.loss_before == pytest.approx(ref.loss_before, rel=1e-5)
    # a difference of losses: float32 round-off of the loss (≈ 1e-7 of it) bounds its error
    tol = 1e-4 * max(ref.loss_before) + 1e-3 * abs(ref.mean)
    assert abs(gpu.mean - ref.mean) <= tol, (ref.per_batch, gpu.per_batch)


def test_the_command_line_gives_the_cpu_value_on_the_device(tmp_path, capsys):
    cases.save_llama_and_lm_data(tmp_path)
    values = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / f"{device}.json"
        rc = main(["evaluate", str(tmp_path / "llama"), "--data", str(tmp_path / "d.pt"), "--rho", "0.05",
                   "--metric", "mix", "--all-symmetries", "--batch-size", "2", "--batches", "2", "--iters", "3",
                   "--float64", "--device", device, "--json", str(out)])
        printed, err = capsys.readouterr()
        assert rc == 0, err
        assert f"device    : {device}" in printed
        values[device] = json.loads(out.read_text())
    cpu, gpu = values["cpu"], values["cuda"]
    assert gpu["per_batch"] == pytest.approx(cpu["per_batch"], rel=RTOL, abs=ATOL)


def test_the_curvature_command_gives_the_cpu_value_on_the_device(tmp_path, capsys):
    torch.manual_seed(0)
    cases.bert().save_pretrained(tmp_path / "bert")
    gen = torch.Generator().manual_seed(1)
    torch.save({"inputs": {"input_ids": torch.randint(3, 50, (6, 7), generator=gen)},
                "targets": torch.randint(0, 2, (6,), generator=gen)}, tmp_path / "d.pt")
    got = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / f"{device}.json"
        rc = main(["curvature", str(tmp_path / "bert"), "--data", str(tmp_path / "d.pt"), "--batches", "2",
                   "--batch-size", "3", "--probes", "3", "--top-k", "2", "--lanczos-steps", "5", "--all-symmetries",
                   "--float64", "--no-progress", "--device", device, "--json", str(out)])
        assert rc == 0, capsys.readouterr().err
        got[device] = json.loads(out.read_text())["results"]
    assert sorted(got["cuda"]) == sorted(got["cpu"])
    for geometry, cpu in got["cpu"].items():
        gpu = got["cuda"][geometry]
        assert gpu["trace"] == pytest.approx(cpu["trace"], rel=RTOL, abs=ATOL), geometry
        assert gpu["eigenvalues"] == pytest.approx(cpu["eigenvalues"], rel=RTOL, abs=ATOL), geometry


def test_auto_pgd_with_the_rest_grouped_and_best_points_parked_in_host_memory_gives_the_cpu_values(monkeypatch):
    """The accelerator defaults: the adaptive rest in groups (:mod:`geosharp_ref.sharpness.rest_groups`) and an
    older best point parked in host memory, no file (:func:`geosharp_ref.parking.default_medium`); every best
    point parked (``park_bytes=0``), against the CPU run (one parameter per group, parked in a file)."""
    from geosharp_ref import parking
    from geosharp_ref.apgd import apgd
    from geosharp_ref.sharpness import ProductSpace, gl_pair_factors, model_loss
    from geosharp_ref.symmetry import symmetry_map
    from tests.cases import TinyAttention

    torch.manual_seed(3)
    model = TinyAttention().double().eval()
    batch = (torch.randn(4, 5, 8, dtype=torch.float64), torch.randint(0, 3, (4,)))
    smap = symmetry_map(model)
    runs = []
    for device in ("cpu", CUDA):
        if device == CUDA:
            monkeypatch.setattr(parking.tempfile, "TemporaryFile", lambda: pytest.fail("a file on the device"))
        m = copy.deepcopy(model).to(device)
        params = {k: v.detach() for k, v in m.named_parameters()}
        space = ProductSpace(params, gl_pair_factors(smap.groups, "mix"), smap.adaptive_masks)
        assert (len(space.rest_groups) == 1) == (device == CUDA)
        b = (batch[0].to(device), batch[1].to(device))
        runs.append(apgd(space.value_and_grad(lambda p: model_loss(m, p, b)), space, 0.3, n_iter=8,
                         random_start=True, generator=torch.Generator().manual_seed(2), park_bytes=0))
    assert runs[1].values == pytest.approx(runs[0].values, rel=RTOL, abs=ATOL)
