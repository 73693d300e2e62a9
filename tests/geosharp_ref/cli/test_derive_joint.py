"""`geosharp derive --spec FILE --metric CHOICE` on a spec that declares a joint symmetry (norm weight × Q/K pair):
a built-in name of the declaration (``inv``) writes the same kernels as the committed codegen/generated/norm_qk_inv
(and they pass the numerical checks: CG residual, the g-orthogonality of the projection to every vertical vector,
invariance of the metric), a family member sum equal to ``inv`` gives the same numbers, and a degenerate choice is
refused writing nothing."""
import importlib
import importlib.util

import pytest
import torch

from geosharp_ref.cli import main

SPEC = ("from derivations.joint import norm_qk\n"
        "SYMMETRY = {'norm_qk': norm_qk(3)}\nSIZES = {'d': 3, 'h': 2}\n")
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
