# GENERATED FILE - DO NOT EDIT.
# Source: derivations.joint_geometry (derivations.joint_builtins: norm_qk / inv); joint symmetry 'norm_qk', metric 'inv'.
# Regenerate with `geosharp derive` (built-ins) or `geosharp derive --spec FILE.py --metric CHOICE`.
"""Joint quotient-geometry kernels: norm weight diag(gamma) x Q/K pair: (Gam D, D^-1 G A, D^-1 H A^-T); metric 'inv'.

Blocks: G (d, h), H (d, h), Gam (d, d). Every function broadcasts over leading batch dimensions.

Metric      g = Trace(Gam**(-2)*xi_Gam*eta_Gam.T) + Trace((G.T*Gam**2*G)^-1*xi_G.T*Gam**2*eta_G) + Trace((H.T*Gam**2*H)^-1*xi_H.T*Gam**2*eta_H)
Invariance  proved, proved (per part)
Projection  iterative (CG in the joint Lie algebra)
"""
import torch

from codegen import runtime as _rt
from codegen import runtime_joint as _rtj

JOINT = 'norm_qk'
METRIC = 'inv'
BLOCKS = ('G', 'H', 'Gam')
BLOCK_SHAPES = (('d', 'h'), ('d', 'h'), ('d', 'd'))
DIAGONAL_BLOCKS = ('Gam',)
N_PARTS = 2
#: per part: ("gl" | "diag", dimension, None): gl(h) or the diagonal algebra, at the blocks' size (PART_DIMS);
#: ("basis", dimension, matrices): the span of declared matrices (that size only)
PART_ALGEBRAS = [('gl', 'h', None), ('diag', 'd', None)]
#: per part: (block index, axis) giving the group dimension
PART_DIMS = [(0, -1), (0, -2)]


def inner(G, H, Gam, xi_G, xi_H, xi_Gam, eta_G, eta_H, eta_Gam, eps=0.0, cache=None):
    """g_θ(ξ, η) = Trace(Gam**(-2)*xi_Gam*eta_Gam.T) + Trace((G.T*Gam**2*G)^-1*xi_G.T*Gam**2*eta_G) + Trace((H.T*Gam**2*H)^-1*xi_H.T*Gam**2*eta_H)."""
    return (((torch.linalg.matrix_power(torch.linalg.inv(Gam), 2)) @ xi_Gam) * eta_Gam).sum((-2, -1)) + ((torch.linalg.solve(G.mT @ (torch.linalg.matrix_power(Gam, 2) @ G), xi_G.mT @ torch.linalg.matrix_power(Gam, 2))) * eta_G.mT).sum((-2, -1)) + ((torch.linalg.solve(H.mT @ (torch.linalg.matrix_power(Gam, 2) @ H), xi_H.mT @ torch.linalg.matrix_power(Gam, 2))) * eta_H.mT).sum((-2, -1))


def _vertical_0_nonzero(G, H, Gam, X0, eps=0.0, cache=None):
    """v_0(X) of part 0 (gl_pair) on every block."""
    return G @ X0, H @ (-X0.mT)


def vertical_0(G, H, Gam, X0, eps=0.0, cache=None):
    """v_0(X) of part 0 (gl_pair) on every block."""
    vals = _vertical_0_nonzero(G, H, Gam, X0, eps=eps, cache=cache)
    out = []
    k = 0
    out.append(vals[k])
    k += 1
    out.append(vals[k])
    k += 1
    out.append(torch.zeros_like(Gam))
    return tuple(out)


def condition_0(G, H, Gam, xi_G, xi_H, xi_Gam, eps=0.0, cache=None):
    """C_0(ξ) = -(H.T*Gam**2*H)^-1*xi_H.T*Gam**2*H + G.T*Gam.T**2*xi_G*(G.T*Gam.T**2*G)^-1."""
    return torch.linalg.solve(G.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ G), G.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ xi_G), left=False) - torch.linalg.solve(H.mT @ (torch.linalg.matrix_power(Gam, 2) @ H), xi_H.mT @ (torch.linalg.matrix_power(Gam, 2) @ H))


def _act_0_nonzero(G, H, Gam, A0):
    """ψ_0(A, θ) of part 0 (gl_pair)."""
    return G @ A0, torch.linalg.solve(A0.mT, H, left=False), Gam


def act_0(G, H, Gam, A0):
    """ψ_0(A, θ) of part 0 (gl_pair)."""
    vals = _act_0_nonzero(G, H, Gam, A0)
    out = []
    k = 0
    out.append(vals[k])
    k += 1
    out.append(vals[k])
    k += 1
    out.append(vals[k])
    k += 1
    return tuple(out)


def _vertical_1_nonzero(G, H, Gam, X1, eps=0.0, cache=None):
    """v_1(X) of part 1 (norm_scaling) on every block."""
    return -(X1 @ G), -(X1 @ H), Gam @ X1


def vertical_1(G, H, Gam, X1, eps=0.0, cache=None):
    """v_1(X) of part 1 (norm_scaling) on every block."""
    vals = _vertical_1_nonzero(G, H, Gam, X1, eps=eps, cache=cache)
    out = []
    k = 0
    out.append(vals[k])
    k += 1
    out.append(vals[k])
    k += 1
    out.append(vals[k])
    k += 1
    return tuple(out)


def condition_1(G, H, Gam, xi_G, xi_H, xi_Gam, eps=0.0, cache=None):
    """C_1(ξ) = -Gam.T**2*xi_G*(G.T*Gam.T**2*G)^-1*G.T - Gam.T**2*xi_H*(H.T*Gam.T**2*H)^-1*H.T + Gam.T*Gam**(-2)*xi_Gam."""
    return Gam.mT @ ((torch.linalg.matrix_power(torch.linalg.inv(Gam), 2)) @ xi_Gam) - (torch.linalg.matrix_power(Gam.mT, 2) @ xi_G) @ (torch.linalg.solve(G.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ G), G.mT)) - (torch.linalg.matrix_power(Gam.mT, 2) @ xi_H) @ (torch.linalg.solve(H.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ H), H.mT))


def _act_1_nonzero(G, H, Gam, A1):
    """ψ_1(A, θ) of part 1 (norm_scaling)."""
    return torch.linalg.solve(A1, G), torch.linalg.solve(A1, H), Gam @ A1


def act_1(G, H, Gam, A1):
    """ψ_1(A, θ) of part 1 (norm_scaling)."""
    vals = _act_1_nonzero(G, H, Gam, A1)
    out = []
    k = 0
    out.append(vals[k])
    k += 1
    out.append(vals[k])
    k += 1
    out.append(vals[k])
    k += 1
    return tuple(out)


def __acceleration_ambient_nonzero(G, H, Gam, xi_G, xi_H, xi_Gam, eps=0.0, cache=None):
    """γ̈(0) with every block as a general matrix (diagonal blocks: see below)."""
    t0 = G.mT @ Gam
    t1 = G.mT @ Gam.mT
    t2 = Gam @ H
    t3 = Gam @ xi_Gam
    t4 = Gam.mT @ H
    t5 = Gam.mT @ xi_G
    t6 = Gam.mT @ xi_Gam.mT
    t7 = Gam.mT @ xi_H
    t8 = xi_Gam @ xi_Gam.mT
    return xi_G @ (torch.linalg.solve(G.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ G), G.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ xi_G) + xi_G.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ G) + t1 @ (xi_Gam.mT @ G) + G.mT @ (t3.mT @ G))) - torch.linalg.solve(Gam.mT, xi_Gam.mT @ xi_G) - (torch.linalg.matrix_power(torch.linalg.inv(Gam.mT), 2)) @ (t3.mT @ xi_G) - 1/2 * ((torch.linalg.matrix_power(torch.linalg.inv(Gam.mT), 2)) @ (torch.linalg.matrix_power(Gam, 2) @ (G @ (torch.linalg.solve(G.mT @ (torch.linalg.matrix_power(Gam, 2) @ G), (xi_G.mT @ (torch.linalg.matrix_power(Gam, 2) @ xi_G)) @ (torch.linalg.solve(G.mT @ (torch.linalg.matrix_power(Gam, 2) @ G), G.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ G)))))))) - 1/2 * (G @ (torch.linalg.solve(G.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ G), xi_G.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ xi_G)))), xi_H @ (torch.linalg.solve(H.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ H), H.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ xi_H) + xi_H.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ H) + t2.mT @ (xi_Gam.mT @ H) + H.mT @ (t3.mT @ H))) - torch.linalg.solve(Gam.mT, xi_Gam.mT @ xi_H) - (torch.linalg.matrix_power(torch.linalg.inv(Gam.mT), 2)) @ (t3.mT @ xi_H) - 1/2 * ((torch.linalg.matrix_power(torch.linalg.inv(Gam.mT), 2)) @ (torch.linalg.matrix_power(Gam, 2) @ (H @ (torch.linalg.solve(H.mT @ (torch.linalg.matrix_power(Gam, 2) @ H), (xi_H.mT @ (torch.linalg.matrix_power(Gam, 2) @ xi_H)) @ (torch.linalg.solve(H.mT @ (torch.linalg.matrix_power(Gam, 2) @ H), H.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ H)))))))) - 1/2 * (H @ (torch.linalg.solve(H.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ H), xi_H.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ xi_H)))), xi_Gam @ (torch.linalg.solve(Gam, xi_Gam)) + t3 @ ((torch.linalg.matrix_power(torch.linalg.inv(Gam), 2)) @ xi_Gam) + 1/2 * ((torch.linalg.matrix_power(Gam, 2) @ xi_G) @ (torch.linalg.solve(G.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ G), xi_G.mT @ Gam.mT))) + 1/2 * ((torch.linalg.matrix_power(Gam, 2) @ xi_H) @ (torch.linalg.solve(H.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ H), xi_H.mT @ Gam.mT))) + 1/2 * ((torch.linalg.matrix_power(Gam, 2) @ t5) @ (torch.linalg.solve(G.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ G), xi_G.mT))) + 1/2 * ((torch.linalg.matrix_power(Gam, 2) @ t7) @ (torch.linalg.solve(H.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ H), xi_H.mT))) - 1/2 * (torch.linalg.matrix_power(Gam, 2) @ (torch.linalg.solve(Gam.mT, t8.mT @ (torch.linalg.matrix_power(torch.linalg.inv(Gam.mT), 2))))) - 1/2 * (torch.linalg.solve(Gam.mT, torch.linalg.matrix_power(Gam, 2) @ ((torch.linalg.matrix_power(torch.linalg.inv(Gam.mT), 2)) @ t8.mT), left=False)) - 1/2 * ((torch.linalg.matrix_power(Gam, 2) @ G) @ (torch.linalg.solve(G.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ G), (torch.linalg.solve(G.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ G), xi_G.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ xi_G), left=False)) @ t1))) - 1/2 * ((torch.linalg.matrix_power(Gam, 2) @ H) @ (torch.linalg.solve(H.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ H), (torch.linalg.solve(H.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ H), xi_H.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ xi_H), left=False)) @ t2.mT))) - 1/2 * ((torch.linalg.matrix_power(Gam, 2) @ t0.mT) @ (torch.linalg.solve(G.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ G), (torch.linalg.solve(G.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ G), xi_G.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ xi_G), left=False)) @ G.mT))) - 1/2 * ((torch.linalg.matrix_power(Gam, 2) @ t4) @ (torch.linalg.solve(H.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ H), (torch.linalg.solve(H.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ H), xi_H.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ xi_H), left=False)) @ H.mT)))


def _acceleration_ambient(G, H, Gam, xi_G, xi_H, xi_Gam, eps=0.0, cache=None):
    """γ̈(0) with every block as a general matrix (diagonal blocks: see below)."""
    vals = __acceleration_ambient_nonzero(G, H, Gam, xi_G, xi_H, xi_Gam, eps=eps, cache=cache)
    out = []
    k = 0
    out.append(vals[k])
    k += 1
    out.append(vals[k])
    k += 1
    out.append(vals[k])
    k += 1
    return tuple(out)


def geodesic_acceleration(G, H, Gam, xi_G, xi_H, xi_Gam, eps=0.0, cache=None):
    """γ̈(0) = −Γ(ξ, ξ); a diagonal block's component is the diagonal part (its tangent space)."""
    out = list(_acceleration_ambient(G, H, Gam, xi_G, xi_H, xi_Gam, eps=eps, cache=cache))
    return _rtj.diagonal_parts(out, [False, False, True])


def second_order_geodesic(G, H, Gam, xi_G, xi_H, xi_Gam, eps=0.0, cache=None):
    """E(ξ) = θ + ξ + ½ γ̈(0) (paper Eq. 4)."""
    acc = geodesic_acceleration(G, H, Gam, xi_G, xi_H, xi_Gam, eps=eps, cache=cache)
    return tuple(b + x + a / 2 for b, x, a in zip((G, H, Gam,), (xi_G, xi_H, xi_Gam,), acc))


def __vjp_ambient_nonzero(G, H, Gam, xi_G, xi_H, xi_Gam, cot_G, cot_H, cot_Gam, eps=0.0, cache=None):
    """(∂E/∂ξ)ᵀ ū with every block as a general matrix."""
    t0 = G.mT @ Gam
    t1 = G.mT @ Gam.mT
    t2 = G.mT @ cot_G
    t3 = G.mT @ cot_Gam.mT
    t4 = Gam @ H
    t5 = Gam @ xi_Gam
    t6 = Gam.mT @ H
    t7 = Gam.mT @ cot_Gam
    t8 = Gam.mT @ cot_Gam.mT
    t9 = Gam.mT @ xi_G
    t10 = Gam.mT @ xi_Gam.mT
    t11 = Gam.mT @ xi_H
    t12 = H.mT @ cot_Gam.mT
    t13 = H.mT @ cot_H
    t14 = cot_G.mT @ xi_G
    t15 = cot_Gam @ xi_Gam.mT
    t16 = cot_H.mT @ xi_H
    return torch.linalg.matrix_power(Gam, 2) @ (G @ (torch.linalg.solve(G.mT @ (torch.linalg.matrix_power(Gam, 2) @ G), 1/2 * t14.mT))) + cot_G + torch.linalg.solve(G.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ G), 1/4 * (t8 @ (torch.linalg.matrix_power(Gam, 2) @ xi_G)) + 1/4 * (cot_Gam.mT @ (torch.linalg.matrix_power(Gam, 2) @ t9)) + torch.linalg.matrix_power(Gam.mT, 2) @ (G @ (1/2 * t14)) - torch.linalg.matrix_power(Gam.mT, 2) @ (xi_G @ (1/4 * t2.mT)) - 1/4 * (torch.linalg.matrix_power(Gam.mT, 2) @ (xi_G @ (torch.linalg.solve(G.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ G), t1 @ (cot_Gam.mT @ (torch.linalg.matrix_power(Gam, 2) @ G)))))) - 1/4 * (torch.linalg.matrix_power(Gam.mT, 2) @ (xi_G @ (torch.linalg.solve(G.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ G), t3 @ (torch.linalg.matrix_power(Gam, 2) @ t0.mT))))) - 1/4 * (torch.linalg.matrix_power(Gam.mT, 2) @ (xi_G @ (torch.linalg.solve(G.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ G), (G.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ ((torch.linalg.matrix_power(torch.linalg.inv(Gam), 2)) @ cot_G))) @ (G.mT @ (torch.linalg.matrix_power(Gam, 2) @ G)))))), left=False) + torch.linalg.solve(G.mT @ (torch.linalg.matrix_power(Gam, 2) @ G), 1/4 * (torch.linalg.matrix_power(Gam.mT, 2) @ (t8.mT @ xi_G)) + 1/4 * (Gam @ (torch.linalg.matrix_power(Gam.mT, 2) @ (cot_Gam @ xi_G))) + cot_G @ (1/2 * (G.mT @ (torch.linalg.matrix_power(Gam, 2) @ xi_G)) + 1/2 * (xi_G.mT @ (torch.linalg.matrix_power(Gam, 2) @ G)) + 1/2 * (t0 @ (xi_Gam @ G)) + 1/2 * (G.mT @ (t10.mT @ G))) - 1/4 * (torch.linalg.matrix_power(Gam, 2) @ (xi_G @ (torch.linalg.solve(G.mT @ (torch.linalg.matrix_power(Gam, 2) @ G), G.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ (t8.mT @ G)))))) - 1/4 * (torch.linalg.matrix_power(Gam, 2) @ (xi_G @ (torch.linalg.solve(G.mT @ (torch.linalg.matrix_power(Gam, 2) @ G), t0 @ (torch.linalg.matrix_power(Gam.mT, 2) @ t3.mT))))) - 1/4 * (torch.linalg.matrix_power(Gam, 2) @ (xi_G @ (torch.linalg.solve(G.mT @ (torch.linalg.matrix_power(Gam, 2) @ G), (G.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ G)) @ (cot_G.mT @ ((torch.linalg.matrix_power(torch.linalg.inv(Gam.mT), 2)) @ (torch.linalg.matrix_power(Gam, 2) @ G))))))), left=False) - 1/2 * (xi_Gam @ (torch.linalg.solve(Gam, cot_G))) - 1/2 * (t5 @ ((torch.linalg.matrix_power(torch.linalg.inv(Gam), 2)) @ cot_G)) - torch.linalg.matrix_power(Gam, 2) @ (xi_G @ (torch.linalg.solve(G.mT @ (torch.linalg.matrix_power(Gam, 2) @ G), 1/4 * t2))), torch.linalg.matrix_power(Gam, 2) @ (H @ (torch.linalg.solve(H.mT @ (torch.linalg.matrix_power(Gam, 2) @ H), 1/2 * t16.mT))) + cot_H + torch.linalg.solve(H.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ H), 1/4 * (t8 @ (torch.linalg.matrix_power(Gam, 2) @ xi_H)) + 1/4 * (cot_Gam.mT @ (torch.linalg.matrix_power(Gam, 2) @ t11)) + torch.linalg.matrix_power(Gam.mT, 2) @ (H @ (1/2 * t16)) - torch.linalg.matrix_power(Gam.mT, 2) @ (xi_H @ (1/4 * t13.mT)) - 1/4 * (torch.linalg.matrix_power(Gam.mT, 2) @ (xi_H @ (torch.linalg.solve(H.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ H), t4.mT @ (cot_Gam.mT @ (torch.linalg.matrix_power(Gam, 2) @ H)))))) - 1/4 * (torch.linalg.matrix_power(Gam.mT, 2) @ (xi_H @ (torch.linalg.solve(H.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ H), t12 @ (torch.linalg.matrix_power(Gam, 2) @ t6))))) - 1/4 * (torch.linalg.matrix_power(Gam.mT, 2) @ (xi_H @ (torch.linalg.solve(H.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ H), (H.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ ((torch.linalg.matrix_power(torch.linalg.inv(Gam), 2)) @ cot_H))) @ (H.mT @ (torch.linalg.matrix_power(Gam, 2) @ H)))))), left=False) + torch.linalg.solve(H.mT @ (torch.linalg.matrix_power(Gam, 2) @ H), 1/4 * (torch.linalg.matrix_power(Gam.mT, 2) @ (t8.mT @ xi_H)) + 1/4 * (Gam @ (torch.linalg.matrix_power(Gam.mT, 2) @ (cot_Gam @ xi_H))) + cot_H @ (1/2 * (H.mT @ (torch.linalg.matrix_power(Gam, 2) @ xi_H)) + 1/2 * (xi_H.mT @ (torch.linalg.matrix_power(Gam, 2) @ H)) + 1/2 * (t6.mT @ (xi_Gam @ H)) + 1/2 * (H.mT @ (t10.mT @ H))) - 1/4 * (torch.linalg.matrix_power(Gam, 2) @ (xi_H @ (torch.linalg.solve(H.mT @ (torch.linalg.matrix_power(Gam, 2) @ H), H.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ (t8.mT @ H)))))) - 1/4 * (torch.linalg.matrix_power(Gam, 2) @ (xi_H @ (torch.linalg.solve(H.mT @ (torch.linalg.matrix_power(Gam, 2) @ H), t6.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ t12.mT))))) - 1/4 * (torch.linalg.matrix_power(Gam, 2) @ (xi_H @ (torch.linalg.solve(H.mT @ (torch.linalg.matrix_power(Gam, 2) @ H), (H.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ H)) @ (cot_H.mT @ ((torch.linalg.matrix_power(torch.linalg.inv(Gam.mT), 2)) @ (torch.linalg.matrix_power(Gam, 2) @ H))))))), left=False) - 1/2 * (xi_Gam @ (torch.linalg.solve(Gam, cot_H))) - 1/2 * (t5 @ ((torch.linalg.matrix_power(torch.linalg.inv(Gam), 2)) @ cot_H)) - torch.linalg.matrix_power(Gam, 2) @ (xi_H @ (torch.linalg.solve(H.mT @ (torch.linalg.matrix_power(Gam, 2) @ H), 1/4 * t13))), 1/2 * (torch.linalg.solve(Gam.mT, xi_Gam.mT @ cot_Gam)) + 1/2 * ((torch.linalg.matrix_power(torch.linalg.inv(Gam.mT), 2)) @ (t5.mT @ cot_Gam)) + 1/2 * (t7 @ (xi_Gam.mT @ (torch.linalg.matrix_power(torch.linalg.inv(Gam.mT), 2)))) + G @ ((torch.linalg.solve(G.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ G), 1/2 * t14, left=False)) @ t1) + H @ ((torch.linalg.solve(H.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ H), 1/2 * t16, left=False)) @ t4.mT) + t0.mT @ ((torch.linalg.solve(G.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ G), 1/2 * t14, left=False)) @ G.mT) + t6 @ ((torch.linalg.solve(H.mT @ (torch.linalg.matrix_power(Gam.mT, 2) @ H), 1/2 * t16, left=False)) @ H.mT) + cot_Gam + torch.linalg.solve(Gam.mT, 1/2 * t15 - 1/2 * (xi_G @ cot_G.mT) - 1/2 * (xi_H @ cot_H.mT), left=False) - 1/2 * (t9 @ (cot_G.mT @ (torch.linalg.matrix_power(torch.linalg.inv(Gam.mT), 2)))) - 1/2 * (t11 @ (cot_H.mT @ (torch.linalg.matrix_power(torch.linalg.inv(Gam.mT), 2)))) - 1/4 * (torch.linalg.solve(Gam, torch.linalg.matrix_power(Gam.mT, 2) @ (cot_Gam @ ((torch.linalg.matrix_power(torch.linalg.inv(Gam), 2)) @ xi_Gam)))) - 1/4 * (torch.linalg.solve(Gam.mT, cot_Gam.mT @ (torch.linalg.matrix_power(Gam, 2) @ ((torch.linalg.matrix_power(torch.linalg.inv(Gam.mT), 2)) @ xi_Gam)))) - 1/4 * ((torch.linalg.matrix_power(torch.linalg.inv(Gam), 2)) @ (torch.linalg.matrix_power(Gam.mT, 2) @ (cot_Gam @ (torch.linalg.solve(Gam, xi_Gam))))) - 1/4 * ((torch.linalg.matrix_power(torch.linalg.inv(Gam.mT), 2)) @ (cot_Gam.mT @ (torch.linalg.matrix_power(Gam, 2) @ (torch.linalg.solve(Gam.mT, xi_Gam)))))


def _vjp_ambient(G, H, Gam, xi_G, xi_H, xi_Gam, cot_G, cot_H, cot_Gam, eps=0.0, cache=None):
    """(∂E/∂ξ)ᵀ ū with every block as a general matrix."""
    vals = __vjp_ambient_nonzero(G, H, Gam, xi_G, xi_H, xi_Gam, cot_G, cot_H, cot_Gam, eps=eps, cache=cache)
    out = []
    k = 0
    out.append(vals[k])
    k += 1
    out.append(vals[k])
    k += 1
    out.append(vals[k])
    k += 1
    return tuple(out)


def second_order_geodesic_vjp(G, H, Gam, xi_G, xi_H, xi_Gam, cot_G, cot_H, cot_Gam, eps=0.0, cache=None):
    """Vector-Jacobian product (∂E/∂ξ)ᵀ ū of second_order_geodesic: P(VJP_ambient(P ū)), P the diagonal part on diagonal blocks (their tangent spaces), the identity elsewhere."""
    u = _rtj.diagonal_parts((cot_G, cot_H, cot_Gam,), [False, False, True])
    out = _vjp_ambient(G, H, Gam, xi_G, xi_H, xi_Gam, *u, eps=eps, cache=cache)
    return _rtj.diagonal_parts(out, [False, False, True])


def prepare(G, H, Gam, eps=0.0):
    """Per-base-point cache for ``cache=``: the (K_i, h_i, h_i) orthonormal bases of the parts' Lie algebras (the CG coordinates). The other kernels factor inline and accept (and ignore) the cache."""
    blocks = (G, H, Gam,)
    return _rt.BasePoint(blocks, eps, bases=_rtj.algebra_bases(globals(), blocks))


def _bases(cache):
    """The cached algebra bases, or None."""
    return None if cache is None else getattr(cache, 'bases', None)


def horizontal_lambda(G, H, Gam, xi_G, xi_H, xi_Gam, eps=0.0, cache=None, tol=1e-12, maxiter=None):
    """Λ = (Λ_1, …, Λ_p), each (…, h_i, h_i): C_i(v(Λ)) = C_i(ξ) for every part, by batched CG on 𝕄λ = b (every batch element to ‖b − 𝕄λ‖ ≤ tol ‖b‖, at most maxiter iterations, default 2·dim 𝔨)."""
    return _rtj.joint_lambda(globals(), (G, H, Gam,), (xi_G, xi_H, xi_Gam,), tol=tol, maxiter=maxiter, bases=_bases(cache))[0]


def horizontal_projection(G, H, Gam, xi_G, xi_H, xi_Gam, eps=0.0, cache=None, tol=1e-12, maxiter=None):
    """Horizontal part ξ − v(Λ) of ξ (one tensor per block; Λ from horizontal_lambda)."""
    return _rtj.joint_projection(globals(), (G, H, Gam,), (xi_G, xi_H, xi_Gam,), tol=tol, maxiter=maxiter, bases=_bases(cache))[0]


def horizontal_projection_with_residual(G, H, Gam, xi_G, xi_H, xi_Gam, eps=0.0, cache=None, tol=1e-12, maxiter=None):
    """(ξ − v(Λ), CG iterations, true relative residual ‖b − 𝕄λ‖/‖b‖ with the batch shape)."""
    return _rtj.joint_projection(globals(), (G, H, Gam,), (xi_G, xi_H, xi_Gam,), tol=tol, maxiter=maxiter, bases=_bases(cache))
