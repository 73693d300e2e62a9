"""Hand-written float64 references for the folded metrics of a norm weight × GL pair (numpy / torch, no SymPy):
the metric g = Σ a_γ b_γ/γ² + g_pair(ΓG, ΓH)(dφ a, dφ b), its dense Gram and vertical span, the closed-form
projection and geodesic acceleration. ``fold_h``: whether H reads the norm (norm × Q/K) or not (norm × V/O, H is
m×h). Used by ``test_joint_folded.py`` and the command-line test of ``geosharp derive --metric folded_*``."""
import numpy as np
import torch

#: the folded blocks: ("G", "H") is norm × Q/K (H ∈ R^{d×h}); ("G",) norm × V/O or, at h = 1, a GL(1) unit
QK, ONE = ("G", "H"), ("G",)



def g_hand(kind, G, H, gam, a, b, lib=np, fold_h=True):
    """Σ a_γ b_γ/γ² + g_pair(ΓG, ΓH)((Γa_G + A_γG, Γa_H + A_γH), (Γb_G + B_γG, Γb_H + B_γH)) (H, a_H unfolded
    when not fold_h)."""
    diag = lib.diag
    inv = np.linalg.inv if lib is np else torch.linalg.inv
    tr = np.trace if lib is np else torch.trace
    Gam = diag(gam)
    Gh, Hh = Gam @ G, (Gam @ H if fold_h else H)
    aG, bG = Gam @ a[0] + diag(a[2]) @ G, Gam @ b[0] + diag(b[2]) @ G
    aH, bH = (Gam @ a[1] + diag(a[2]) @ H, Gam @ b[1] + diag(b[2]) @ H) if fold_h else (a[1], b[1])
    out = (a[2] * b[2] / gam ** 2).sum()
    if kind == "folded_inv":
        return out + tr(inv(Gh.T @ Gh) @ aG.T @ bG) + tr(inv(Hh.T @ Hh) @ aH.T @ bH)
    return out + tr(Hh.T @ Hh @ aG.T @ bG) + tr(Gh.T @ Gh @ aH.T @ bH)


def split(x, d, h, m=None):
    """Coordinates (vec G, vec H, γ) -> (G, H, γ); H is m×h (m = d by default)."""
    m = d if m is None else m
    return x[:d * h].reshape(d, h), x[d * h:d * h + m * h].reshape(m, h), x[d * h + m * h:]


def flat(G, H, gam, lib=np):
    return lib.concatenate([G.reshape(-1), H.reshape(-1), gam]) if lib is np else torch.cat(
        [G.reshape(-1), H.reshape(-1), gam])


def gram(kind, theta, d, h, lib=np, m=None, fold_h=True):
    N = theta.shape[0]
    E = np.eye(N) if lib is np else torch.eye(N, dtype=torch.float64)
    G, H, gam = split(theta, d, h, m)
    rows = [[g_hand(kind, G, H, gam, split(E[i], d, h, m), split(E[j], d, h, m), lib, fold_h) for j in range(N)]
            for i in range(N)]
    return np.array(rows) if lib is np else torch.stack([torch.stack(r) for r in rows])


def vertical_span(theta, d, h, m=None, fold_h=True):
    """Every vertical vector: norm part (−XG, −XH or 0, Xγ) for X = E_kk; pair part (GA, −HAᵀ, 0) for A = E_ab."""
    G, H, gam = split(theta, d, h, m)
    cols = []
    for k in range(d):
        X = np.zeros((d, d))
        X[k, k] = 1.0
        cols.append(flat(-X @ G, -X @ H if fold_h else np.zeros_like(H), X @ gam))
    for a in range(h):
        for c in range(h):
            A = np.zeros((h, h))
            A[a, c] = 1.0
            cols.append(flat(G @ A, -H @ A.T, np.zeros(d)))
    return np.stack(cols, 1)


def random_point(rng, d, h, m=None):
    gam = rng.uniform(0.5, 2.0, d) * rng.choice([-1.0, 1.0], d)
    return rng.standard_normal((d, h)), rng.standard_normal((d if m is None else m, h)), gam


def to_values(j, G, H, gam):
    Gs, Hs, Gams = j.blocks
    return {Gs: G, Hs: H, Gams: np.diag(gam)}


def sizes_of(j, d, h, m=None):
    G, H, _ = j.blocks
    return {G.shape[0]: d, G.shape[1]: h, H.shape[0]: d if m is None else m}


def closed_form_projection(kind, G, H, gam, xG, xH, xg, fold_h=True):
    """P(ξ) = (ξ_G + Γ⁻¹ΞG − GΛ, ξ_H + Γ⁻¹ΞH + HΛᵀ, 0) (ξ_H + HΛᵀ when H does not read the norm), Λ the pair's
    multiplier at the fold: C(ξ̂ − (ĜΛ, −ĤΛᵀ)) = 0 with the pair's horizontal condition C (docs/MATH.md; inv:
    Ĝᵀξ̂_G Ŝ_G⁻¹ − Ŝ_H⁻¹ξ̂_HᵀĤ, mix: Ĝᵀξ̂_G Ŝ_H − Ŝ_G ξ̂_HᵀĤ), solved as an h²×h² linear system (numpy)."""
    Gam, Xi, h = np.diag(gam), np.diag(xg), G.shape[1]
    Gh, Hh = Gam @ G, (Gam @ H if fold_h else H)
    SG, SH = Gh.T @ Gh, Hh.T @ Hh

    def cond(vG, vH):
        if kind == "folded_inv":
            return Gh.T @ vG @ np.linalg.inv(SG) - np.linalg.inv(SH) @ vH.T @ Hh
        return Gh.T @ vG @ SH - SG @ vH.T @ Hh

    units = [np.eye(h * h)[k].reshape(h, h) for k in range(h * h)]
    K = np.stack([cond(Gh @ E, -Hh @ E.T).ravel() for E in units], 1)
    fH = Gam @ xH + Xi @ H if fold_h else xH
    Lam = np.linalg.solve(K, cond(Gam @ xG + Xi @ G, fH).ravel()).reshape(h, h)
    Gi = np.diag(1 / gam)
    return (xG + Gi @ Xi @ G - G @ Lam, xH + (Gi @ Xi @ H if fold_h else 0) + H @ Lam.T, np.zeros_like(gam))


def pair_acceleration(kind, Gh, Hh, vG, vH):
    """The GL pair's geodesic acceleration (docs/MATH.md), hand-written."""
    if kind == "folded_inv":
        def one(B, v):
            Si = np.linalg.inv(B.T @ B)
            return -B @ Si @ v.T @ v + v @ Si @ B.T @ v + v @ Si @ v.T @ B
        return one(Gh, vG), one(Hh, vH)

    def one(B, v, C, w):
        Ti = np.linalg.inv(C.T @ C)
        return B @ w.T @ w @ Ti - v @ C.T @ w @ Ti - v @ w.T @ C @ Ti
    return one(Gh, vG, Hh, vH), one(Hh, vH, Gh, vG)


def closed_form_acceleration(kind, G, H, gam, xG, xH, xg, fold_h=True):
    """γ̈(0) flattened: G̈ = Γ⁻¹Ĝ̈ − 2Γ⁻¹Ξξ_G − Γ⁻²Ξ²G (the same for H if it reads the norm, else Ḧ = Ĥ̈),
    γ̈ = ξ_γ²/γ, with (Ĝ̈, Ĥ̈) the pair's acceleration at the fold (:func:`pair_acceleration`)."""
    Gi, Xi, Gam = np.diag(1 / gam), np.diag(xg), np.diag(gam)
    Hh, vH = (Gam @ H, Gam @ xH + Xi @ H) if fold_h else (H, xH)
    aGh, aHh = pair_acceleration(kind, Gam @ G, Hh, Gam @ xG + Xi @ G, vH)
    aH = Gi @ aHh - 2 * Gi @ Xi @ xH - Gi @ Gi @ Xi @ Xi @ H if fold_h else aHh
    return flat(Gi @ aGh - 2 * Gi @ Xi @ xG - Gi @ Gi @ Xi @ Xi @ G, aH, xg ** 2 / gam)


def dense_projection(kind, G, H, gam, x, fold_h=True):
    """The g-orthogonal projection of the flat tangent ``x`` onto the complement of the span of every vertical
    vector, by dense least squares on the hand-written Gram."""
    d, h = G.shape
    m = H.shape[0]
    theta = flat(G, H, gam)
    M, V = gram(kind, theta, d, h, m=m, fold_h=fold_h), vertical_span(theta, d, h, m, fold_h)
    return x - V @ np.linalg.lstsq(V.T @ M @ V, V.T @ M @ x, rcond=None)[0]
