r"""Rotary Q/K pairs: the RoPE subgroup of GL(h), and which rotary implementations are understood.

A rotary attention layer scores s(p, p') = q_p R_p (k_{p'} R_{p'})ᵀ = [x, 1] G R_p R_{p'}ᵀ Hᵀ [x', 1]ᵀ
(G, H the Q/K blocks of :mod:`.detect`). Every implementation in transformers builds R_p the same way: per
frequency pair of head coordinates (i, j) it multiplies (q_i, q_j) by the complex number
c_{p,k} + i s_{p,k} (cos and sin of the position times the pair's frequency, times one scalar factor), and
leaves the last h − r coordinates untouched (partial rotary, r the rotary dimension). So R_p is block
diagonal, per pair a *rotation-scaling* c I + s J (J = [[0, 1], [−1, 0]]), the identity on the free block.

**Commutant.** A ∈ GL(h) with A R_p = R_p A for every p keeps every score:
(G A) R_p R_{p'}ᵀ (H A⁻ᵀ)ᵀ = G A R_p R_{p'}ᵀ A⁻¹ Hᵀ = G R_p R_{p'}ᵀ Hᵀ. The matrices that commute with every
c I + s J on a pair are a I + b J (a complex scalar), and a block commuting with both a non-trivial rotation
and the identity has no cross terms, so the group kept is

    K_r = (ℂ*)^{r/2} × GL(h − r)     (real dimension r + (h − r)², instead of h²),

with the pairing read from the model: Hugging Face ``rotate_half`` pairs i with i + r/2 (``"half"``), GPT-J's
``rotate_every_two`` pairs 2i with 2i + 1 (``"interleaved"``). (If two frequencies coincide the commutant is
larger; K_r is always inside it, so quotienting K_r stays exact.)

**Which RoPE variants keep K_r.** Only the per-pair complex-scalar form matters, not the frequencies or the
factor, so every ``rope_type`` of transformers' ``ROPE_INIT_FUNCTIONS`` is fine: ``default``, ``linear`` (the
position divided by a factor: other angles), ``dynamic`` NTK (frequencies that depend on the sequence length:
other angles per forward), ``llama3``/``longrope``/``proportional`` (per-frequency rescaling: other angles)
and ``yarn`` (frequencies interpolated *and* cos, sin multiplied by an attention temperature m: the pair
multiplied by m·e^{iφ}, still a complex scalar, commuting with K_r). Query scaling by a scalar (Gemma's
``query_pre_attn_scalar``) is a multiple of the identity. What breaks the commutant, and is refused:

* a normalisation inside the head (QK-norm: q ↦ q / ‖q‖ · w is not equivariant under a I + b J unless
  |a + ib| = 1 and w is constant on pairs), see :func:`~.layouts.qk_refusal`;
* an implementation not in :data:`ROTARY_FAMILIES` (its pairing or its partial-rotary convention is not
  known), a ``rope_type`` transformers does not list, a ``rotate_half`` / ``rotate_every_two`` whose code is
  not the one the pairing assumes, partial rotary in a family whose ``apply_rotary_pos_emb`` rotates the whole
  head, or an odd rotary dimension.

:func:`rotary_layout` returns ``(pairing, r)`` or the refusal.
"""
from __future__ import annotations

import inspect
import re
import sys
from typing import Optional


__all__ = ["ROTARY_FAMILIES", "rotary_layout"]

#: transformers model families whose rotary embedding is understood: family → (pairing, partial rotary read
#: from the config). ``half``: ``rotate_half`` (i with i + r/2); ``interleaved``: ``rotate_every_two``.
ROTARY_FAMILIES = {
    "llama": ("half", False), "mistral": ("half", False), "qwen2": ("half", False), "gemma": ("half", False),
    "phi3": ("half", True), "gpt_neox": ("half", True), "gptj": ("interleaved", True),
}
_FAMILY = re.compile(r"^transformers\.models\.(\w+)\.modeling_\w+$")
_HALF_CODE = ("x.shape[-1] // 2", "torch.cat((-x2, x1), dim=-1)")
_EVERY_TWO_CODE = ("x[:, :, :, ::2]", "x[:, :, :, 1::2]", "torch.stack((-x2, x1), dim=-1)")


def _rope_parameters(configs) -> dict:
    for cfg in configs:
        rp = getattr(cfg, "rope_parameters", None)
        if isinstance(rp, dict) and rp:
            return rp
        rs = getattr(cfg, "rope_scaling", None)
        if isinstance(rs, dict) and rs:
            return rs
    return {}


def _partial_factor(configs, rp) -> float:
    if "partial_rotary_factor" in rp:
        return float(rp["partial_rotary_factor"])
    for cfg in configs:
        for name in ("partial_rotary_factor", "rotary_pct"):
            v = getattr(cfg, name, None)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                return float(v)
    return 1.0


def _code_matches(module, name, needles) -> bool:
    fn = getattr(module, name, None)
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        return False
    return all(n in src for n in needles)


def rotary_layout(mod, configs, h: int) -> tuple[Optional[tuple], Optional[str]]:
    """``((pairing, r), None)`` for a rotary attention module whose RoPE keeps the subgroup K_r (module doc), or
    ``(None, reason)``. ``configs``: the module's and the model's configs; ``h``: the head dimension."""
    cls = type(mod)
    m = _FAMILY.match(cls.__module__ or "")
    family = m.group(1) if m else None
    tail = ("; the Q/K pair's weights stay adaptive (declare it with the rope_<pairing>_<metric> kernels if "
            "you know its pairing)")
    if family not in ROTARY_FAMILIES:
        return None, (f"rotary position encoding of a model family not understood ({cls.__module__}.{cls.__name__}; "
                      f"understood: {', '.join(sorted(ROTARY_FAMILIES))}): its coordinate pairing and partial-"
                      f"rotary convention are unknown" + tail)
    pairing, partial = ROTARY_FAMILIES[family]
    module = sys.modules.get(cls.__module__)
    if pairing == "half" and not _code_matches(module, "rotate_half", _HALF_CODE):
        return None, f"{family}: rotate_half is not the i ↔ i + r/2 pairing this version assumed" + tail
    if pairing == "interleaved" and not _code_matches(module, "rotate_every_two", _EVERY_TWO_CODE):
        return None, f"{family}: rotate_every_two is not the 2i ↔ 2i + 1 pairing this version assumed" + tail
    rp = _rope_parameters(configs)
    rope_type = rp.get("rope_type", rp.get("type", "default"))
    try:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
        known = set(ROPE_INIT_FUNCTIONS) | {"default"}
    except ImportError:  # pragma: no cover - transformers absent: only the default is known
        known = {"default"}
    if rope_type not in known:
        return None, (f"rope_type {rope_type!r} is not one of transformers' {sorted(known)}: whether it keeps "
                      f"a per-pair complex scalar (the RoPE commutant) is unknown" + tail)
    if family == "gptj":
        r = next((getattr(c, "rotary_dim") for c in configs if getattr(c, "rotary_dim", None)), None) or h
    else:
        factor = _partial_factor(configs, rp)
        if not partial and factor != 1.0:
            return None, (f"{family}: partial_rotary_factor={factor} but its apply_rotary_pos_emb rotates the "
                          f"whole head" + tail)
        r = int(h * factor)
    if r % 2 or not 0 < r <= h:
        return None, f"rotary dimension {r} is not even and in (0, {h}]" + tail
    return (pairing, r), None
