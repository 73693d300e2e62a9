"""Two joint symmetries of derivations.joint with their jointly invariant metrics and derived geometry (norm weight ×
Q/K pair under ``inv_lift``, LoRA GL(r) × attention GL(h) under ``lora_att_inv``), random points and tangents in
float64 coordinates, and the dense reference of the horizontal projection (shared by the derivation and generated
kernel tests)."""
import numpy as np
import sympy as sp
from sympy import Inverse, Trace

from derivations.exact_eval import DualEvaluator
from derivations.joint import JointMetric, lora_attention, norm_qk
from derivations.joint_geometry import derive_joint_geometry

_CACHE = {}


def norm_qk_setup():
    """(joint symmetry, metric, geometry) of norm_qk(3) under the invariant lift ``inv_lift`` (cached)."""
    if "norm" not in _CACHE:
        j = norm_qk(3)
        G, H, Gam = j.blocks
        xi, eta = j.tangent("xi"), j.tangent("eta")
        g = (Trace(Inverse(G.T * Gam * Gam * G) * xi[0].T * Gam * Gam * eta[0])
             + Trace(Inverse(H.T * Gam * Gam * H) * xi[1].T * Gam * Gam * eta[1])
             + Trace(Inverse(Gam) * Inverse(Gam) * xi[2] * eta[2].T))
        metric = JointMetric(j, g, "inv_lift")
        _CACHE["norm"] = (j, metric, derive_joint_geometry(metric))
    return _CACHE["norm"]


def lora_attention_setup():
    """(joint symmetry, metric, geometry) of lora_attention() under ``lora_att_inv`` (cached)."""
    if "lora" not in _CACHE:
        j = lora_attention()
        G, H, Bt, At = j.blocks
        xi, eta = j.tangent("xi"), j.tangent("eta")
        g = (Trace(Inverse(G.T * G) * xi[0].T * eta[0]) + Trace(Inverse(H.T * H) * xi[1].T * eta[1])
             + Trace(Inverse(G.T * G) * xi[2].T * At.T * At * eta[2]) + Trace(Inverse(At.T * At) * xi[3].T * eta[3]))
        metric = JointMetric(j, g, "lora_att_inv")
        _CACHE["lora"] = (j, metric, derive_joint_geometry(metric))
    return _CACHE["lora"]


def block_sizes(j, **kw):
    """{size symbol: value} for the block dimensions named in ``kw``."""
    return {d: kw[str(d)] for b in j.blocks for d in b.shape if str(d) in kw}


def random_point(j, sizes, rng):
    """{block: float64 value}: diagonal blocks with entries ±[0.5, 2], the others standard normal."""
    vals = {}
    for b in j.blocks:
        r, c = (int(sp.sympify(d).xreplace(sizes)) for d in b.shape)
        vals[b] = np.diag(rng.uniform(0.5, 2.0, r) * rng.choice([-1, 1], r)) if b in j.diagonal_blocks \
            else rng.standard_normal((r, c))
    return vals


def random_tangent(j, vals, rng):
    """A standard-normal tangent vector at ``vals`` (diagonal where the block is)."""
    return [np.diag(rng.standard_normal(v.shape[0])) if b in j.diagonal_blocks else rng.standard_normal(v.shape)
            for b, v in zip(j.blocks, vals.values())]


def coords(j, vecs):
    """The coordinate vector of per-block values (a diagonal block by its diagonal)."""
    return np.concatenate([np.diag(v) if b in j.diagonal_blocks else np.ravel(v) for b, v in zip(j.blocks, vecs)])


def uncoords(j, vals, c):
    """Per-block values of the coordinate vector ``c`` (the inverse of :func:`coords`)."""
    out, k = [], 0
    for b in j.blocks:
        v = vals[b]
        n = v.shape[0] if b in j.diagonal_blocks else v.size
        out.append(np.diag(c[k:k + n]) if b in j.diagonal_blocks else c[k:k + n].reshape(v.shape))
        k += n
    return out


def metric_gram(metric, j, vals, sizes):
    """Coordinate Gram g(e_i, e_j) (float64) of the metric expression."""
    N = len(coords(j, list(vals.values())))
    units = [uncoords(j, vals, np.eye(N)[k]) for k in range(N)]
    xi, eta = j.tangent("xi"), j.tangent("eta")
    Gm = np.zeros((N, N))
    for a in range(N):
        for b in range(N):
            env = {s: (v, None) for s, v in vals.items()}
            env.update({x: (u, None) for x, u in zip(xi, units[a])})
            env.update({t: (u, None) for t, u in zip(eta, units[b])})
            Gm[a, b] = DualEvaluator(sizes, env, exact=False).value(metric.expr)
    return Gm


def dense_projection(j, metric, geo, vals, X, sizes):
    """Dense reference ξ − V (Vᵀ g V)⁺ Vᵀ g ξ over the span of every part's vertical vectors, in coordinates:
    (x, projected x, V, coordinate Gram)."""
    Gm = metric_gram(metric, j, vals, sizes)
    cols = []
    for i in range(len(j.parts)):
        for E in geo.basis(i, sizes):
            lams = [np.zeros_like(B) for B in (geo.basis(k, sizes)[0] for k in range(len(j.parts)))]
            lams[i] = E
            cols.append(coords(j, geo.vertical_vector(vals, sizes, lams)))
    V = np.stack(cols, 1)
    x = coords(j, X)
    return x, x - V @ np.linalg.lstsq(V.T @ Gm @ V, V.T @ Gm @ x, rcond=None)[0], V, Gm
