"""`geosharp derive --spec FILE --metric CHOICE` on a spec that declares a joint symmetry (norm weight × Q/K pair):
a built-in name of the declaration (``inv``) writes the same kernels as the committed codegen/generated/norm_qk_inv
(and they pass the numerical checks: CG residual, the g-orthogonality of the projection to every vertical vector,
invariance of the metric), a family member sum equal to ``inv`` gives the same numbers, and a degenerate choice is
refused writing nothing. A folded metric by name (``folded_inv``, ``folded_mix``, on norm × Q/K and on a norm read
by one block) writes kernels equal to the hand-written folded geometry; a built-in of another declaration is
refused naming the ones that apply."""
import importlib
import importlib.util

import numpy as np
import pytest
import torch

from geosharp_ref.cli import main
from tests import cases
from tests.derivations.folded_numeric import closed_form_acceleration, dense_projection, g_hand, random_point

SPEC = ("from derivations.joint import norm_qk\n"
        "SYMMETRY = {'norm_qk': norm_qk(3)}\nSIZES = {'d': 3, 'h': 2}\n")
SPEC_ONE_READER = ("from derivations.joint_folded import norm_pair\n"
                   "SYMMETRY = {'norm_vo': norm_pair(3, ('G',))}\nSIZES = {'d': 3, 'h': 2, 'm': 4}\n")
T = torch.float64


def _load(path):
    spec = importlib.util.spec_from_file_location(f"joint_spec_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _inputs(seed, batch=2, d=5, h=2):
    """A batch of points at sizes other than the spec's SIZES (the kernels are shape-generic) and two tangents."""
    g = torch.Generator().manual_seed(seed)

    def blocks():
        return (torch.randn(batch, d, h, generator=g, dtype=T), torch.randn(batch, d, h, generator=g, dtype=T),
                torch.diag_embed(torch.randn(batch, d, generator=g, dtype=T)))

    pt = blocks()
    pt = (pt[0], pt[1], torch.diag_embed(torch.diagonal(pt[2], dim1=-2, dim2=-1).abs() + 0.5))
    return pt, blocks(), blocks()


def _check(mod, ref):
    pt, xi, eta = _inputs(0)
    out, _, rel = mod.horizontal_projection_with_residual(*pt, *xi)
    assert float(rel.max()) < 1e-12
    # g(ξ_h, v) = 0 for every vertical vector v of each part (unit generators)
    d, h = pt[0].shape[-2], pt[0].shape[-1]
    for i, n in ((0, h), (1, d)):
        for k in range(n * n if i == 0 else n):
            X = torch.zeros(2, n, n, dtype=T)
            if i == 0:
                X[:, k // n, k % n] = 1
            else:
                X[:, k, k] = 1
            v = getattr(mod, f"vertical_{i}")(*pt, X)
            assert float(mod.inner(*pt, *out, *v).abs().max()) < 1e-9 * float(mod.inner(*pt, *xi, *xi).max())
    assert torch.allclose(mod.inner(*pt, *xi, *eta), ref.inner(*pt, *xi, *eta), rtol=1e-12)
    assert all(torch.allclose(a, b, rtol=1e-9, atol=1e-12) for a, b in zip(out, ref.horizontal_projection(*pt, *xi)))
    assert all(torch.allclose(a, b, rtol=1e-9, atol=1e-12)
               for a, b in zip(mod.geodesic_acceleration(*pt, *out), ref.geodesic_acceleration(*pt, *out)))


def test_builtin_name_of_a_joint_declaration_writes_the_committed_kernels(tmp_path, capsys):
    spec = tmp_path / "norm_spec.py"
    spec.write_text(SPEC)
    assert main(["derive", "--spec", str(spec), "--metric", "inv", "--out", str(tmp_path / "o")]) == 0
    path = tmp_path / "o" / "norm_qk_inv.py"
    ref = importlib.import_module("codegen.generated.norm_qk_inv")
    body = path.read_text().splitlines()[3:]
    assert body == open(ref.__file__).read().splitlines()[3:]  # the same derivation as `geosharp derive`
    _check(_load(path), ref)


@pytest.mark.slow
def test_family_member_sum_is_derived_and_a_degenerate_member_is_refused(tmp_path, capsys):
    spec = tmp_path / "norm_spec.py"
    spec.write_text(SPEC)
    assert main(["derive", "--spec", str(spec)]) == 0
    listing = capsys.readouterr().out
    inv_terms = {"Trace((G.T*Gam*Gam*G)**(-1)*eta_G.T*Gam*Gam*xi_G)", "Trace((H.T*Gam*Gam*H)**(-1)*eta_H.T*Gam*Gam*xi_H)",
                 "Trace(Gam**(-1)*Gam**(-1)*eta_Gam*xi_Gam.T)"}
    names = [ln.split(":")[0].strip() for ln in listing.splitlines()
             if ln.strip().startswith("m") and ln.split(":", 1)[1].split("[")[0].strip() in inv_terms]
    assert len(names) == 3
    out = tmp_path / "bad"
    assert main(["derive", "--spec", str(spec), "--metric", names[0], "--out", str(out)]) == 2
    assert "not positive definite" in capsys.readouterr().err
    assert not out.exists() or not list(out.glob("*.py"))
    choice = "+".join(names)
    assert main(["derive", "--spec", str(spec), "--metric", choice, "--out", str(tmp_path / "o")]) == 0
    (path,) = list((tmp_path / "o").glob("norm_qk_*.py"))
    _check(_load(path), importlib.import_module("codegen.generated.norm_qk_inv"))


@pytest.mark.parametrize("spec, name, kind, fold_h", [(SPEC, "norm_qk", "folded_inv", True),
                                                      (SPEC_ONE_READER, "norm_vo", "folded_mix", False)],
                         ids=["norm_qk-folded_inv", "norm_vo-folded_mix"])
def test_folded_metric_by_name_writes_kernels_equal_to_the_hand_written_geometry(tmp_path, spec, name, kind, fold_h):
    """``--metric folded_inv|folded_mix`` (derived through the fold, whose metric operator is not block-diagonal):
    at sizes other than the spec's, per batch element, the written ``inner`` equals the hand-written folded metric,
    the CG projection the dense least-squares g-orthogonal projection onto the complement of every vertical
    vector, and the acceleration the closed form G̈ = Γ⁻¹Ĝ̈ − 2Γ⁻¹Ξξ_G − Γ⁻²Ξ²G, γ̈ = ξ_γ²/γ."""
    path = tmp_path / "spec.py"
    path.write_text(spec)
    assert main(["derive", "--spec", str(path), "--metric", kind, "--out", str(tmp_path / "o")]) == 0
    mod = _load(tmp_path / "o" / f"{name}_{kind}.py")
    rng = np.random.default_rng(3)
    d, h, m = 5, 2, (5 if fold_h else 3)
    points = [random_point(rng, d, h, m) for _ in range(2)]
    xs, ys = ([(rng.standard_normal((d, h)), rng.standard_normal((m, h)), rng.standard_normal(d)) for _ in points]
              for _ in range(2))

    def batch(items):
        return [torch.tensor(np.stack([it[k] if k < 2 else np.diag(it[k]) for it in items]), dtype=T)
                for k in range(3)]

    th, xi, eta = batch(points), batch(xs), batch(ys)
    inner = mod.inner(*th, *xi, *eta).reshape(-1)
    proj, _, resid = mod.horizontal_projection_with_residual(*th, *xi)
    acc = mod.geodesic_acceleration(*th, *xi)
    assert float(resid.max()) < 1e-12
    for b, (G, H, gam) in enumerate(points):
        want = g_hand(kind, G, H, gam, xs[b], ys[b], fold_h=fold_h)
        assert abs(float(inner[b]) - want) <= 1e-10 * abs(want)
        flat_x = np.concatenate([xs[b][0].ravel(), xs[b][1].ravel(), xs[b][2]])
        got = np.concatenate([proj[0][b].numpy().ravel(), proj[1][b].numpy().ravel(), np.diag(proj[2][b].numpy())])
        want = dense_projection(kind, G, H, gam, flat_x, fold_h)
        assert np.abs(got - want).max() < 1e-9 * max(1.0, np.abs(want).max())
        got = np.concatenate([acc[0][b].numpy().ravel(), acc[1][b].numpy().ravel(), np.diag(acc[2][b].numpy())])
        want = closed_form_acceleration(kind, G, H, gam, *xs[b], fold_h)
        assert np.abs(got - want).max() < 1e-9 * max(1.0, np.abs(want).max())


def test_a_builtin_metric_of_another_declaration_is_refused_naming_the_ones_that_apply(tmp_path, capsys):
    """``inv`` is norm × Q/K's built-in: on a norm read by one block it is refused before any family is solved,
    one line naming the built-ins that apply (the folded ones), nothing written."""
    path = tmp_path / "spec.py"
    path.write_text(SPEC_ONE_READER)
    out = tmp_path / "o"
    err = cases.cli_error_line(capsys, ["derive", "--spec", str(path), "--metric", "inv", "--out", str(out)])
    assert err.startswith("geosharp: error: the built-in metric 'inv' does not apply")
    assert "folded_inv, folded_mix" in err
    assert not out.exists()
