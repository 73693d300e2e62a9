"""The model-soups CLIP classifier (geosharp_ref.io.clip_soups), on small checkpoints of the real format made here.

* logits equal a hand-written float64 forward computed from the state dict tensors alone (patches by
  reshaping, explicit per-head softmax attention with einsum, QuickGELU, L2-normalised features, linear
  head); save → load reproduces the state dict exactly and ignores the text keys; the architecture is
  inferred from shapes (ViT-B/32 shapes too, on the meta device); bad files are refused with messages
  that say what is wrong.
* the symmetry map finds layers × heads × 2 GL(h) pairs on the loaded model, and geodesic sharpness is
  invariant under a random GL(h) orbit action that leaves the outputs unchanged.
"""
from __future__ import annotations

import copy
import logging
import math

import pytest
import torch

from geosharp_ref.io.clip_soups import (CLIP_TEXT_KEYS, CLIPSoupClassifier, CLIPSoupConfig,
                                        clip_soup_config_from_state_dict, load_clip_soup, save_clip_soup_like)
from geosharp_ref.sharpness import geodesic_sharpness
from geosharp_ref.symmetry import symmetry_map
from geosharp_ref.sampling import draw_orbit_elements
from tests.cases import CLIP_SOUP_SMALL as SMALL, clip_images as _images

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)
transformers.logging.set_verbosity_error()

DT = torch.float64
FORWARD_TOL = 1e-12   # hand-written float64 forward vs the module (observed ~1e-16)
OUTPUT_TOL = 1e-10    # outputs after a GL(h) orbit action (observed ~1e-15)
SHARP_TOL = 1e-9      # geodesic sharpness after a GL(h) orbit action (observed ~1e-14)


def _rel(a, b):
    a, b = (torch.as_tensor(t, dtype=DT).detach() for t in (a, b))
    return float((a - b).norm() / b.norm())


# ---------------------------------------------------------------------------------------------
# An independent forward from the state dict tensors
# ---------------------------------------------------------------------------------------------

def _ln(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def reference_logits(sd, images, heads):
    """ModelWrapper(CLIP ViT).forward from the raw tensors, float64, no torch.nn modules."""
    t = {k: v.to(DT) for k, v in sd.items() if torch.is_tensor(v) and v.is_floating_point()}
    v = "model.visual."
    W = t[v + "conv1.weight"]
    width, _, p, _ = W.shape
    B, _, R, _ = images.shape
    g = R // p
    x = images.to(DT)
    patches = x.reshape(B, 3, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(B, g * g, 3 * p * p)
    tok = torch.einsum("bpc,wc->bpw", patches, W.reshape(width, 3 * p * p))
    x = torch.cat([t[v + "class_embedding"].expand(B, 1, width), tok], 1) + t[v + "positional_embedding"]
    x = _ln(x, t[v + "ln_pre.weight"], t[v + "ln_pre.bias"])
    hd = width // heads
    layer = 0
    while f"{v}transformer.resblocks.{layer}.attn.in_proj_weight" in t:
        r = f"{v}transformer.resblocks.{layer}."
        y = _ln(x, t[r + "ln_1.weight"], t[r + "ln_1.bias"])
        qkv = torch.einsum("blw,ow->blo", y, t[r + "attn.in_proj_weight"]) + t[r + "attn.in_proj_bias"]
        q, k, val = (qkv[..., i * width:(i + 1) * width].reshape(B, -1, heads, hd) for i in range(3))
        scores = torch.einsum("bqnd,bknd->bnqk", q, k) / math.sqrt(hd)
        att = torch.exp(scores - scores.amax(-1, keepdim=True))
        att = att / att.sum(-1, keepdim=True)
        o = torch.einsum("bnqk,bknd->bqnd", att, val).reshape(B, -1, width)
        x = x + torch.einsum("blw,ow->blo", o, t[r + "attn.out_proj.weight"]) + t[r + "attn.out_proj.bias"]
        y = _ln(x, t[r + "ln_2.weight"], t[r + "ln_2.bias"])
        z = torch.einsum("blw,ow->blo", y, t[r + "mlp.c_fc.weight"]) + t[r + "mlp.c_fc.bias"]
        z = z / (1 + torch.exp(-1.702 * z))
        x = x + torch.einsum("blo,wo->blw", z, t[r + "mlp.c_proj.weight"]) + t[r + "mlp.c_proj.bias"]
        layer += 1
    f = _ln(x[:, 0], t[v + "ln_post.weight"], t[v + "ln_post.bias"]) @ t[v + "proj"]
    f = f / torch.sqrt((f ** 2).sum(-1, keepdim=True))
    return f @ t["classification_head.weight"].T + t["classification_head.bias"]


def test_logits_equal_hand_written_forward(soup):
    path, sd = soup
    model = load_clip_soup(path, heads=2)
    assert not model.training
    images = _images()
    ref = reference_logits(sd, images, heads=2)
    got = copy.deepcopy(model).to(DT)(images.to(DT))
    assert got.shape == (4, SMALL["classes"])
    assert _rel(got, ref) <= FORWARD_TOL
    # float32 as loaded
    assert _rel(model(images), ref) <= 1e-5
    # the head split matters: one head (OpenAI's width // 64 rule at width 64) is another model
    assert _rel(reference_logits(sd, images, heads=1), ref) > 1e-3
    one_head = copy.deepcopy(load_clip_soup(path)).to(DT)  # heads = 64 // 64
    assert one_head.config.heads == 1
    assert _rel(one_head(images.to(DT)), reference_logits(sd, images, heads=1)) <= FORWARD_TOL
    # the features are L2-normalised: scaling proj leaves the logits unchanged, the head bias does not
    m2 = copy.deepcopy(model).to(DT)
    with torch.no_grad():
        m2.model.visual.proj.mul_(3.0)
    assert _rel(m2(images.to(DT)), ref) <= FORWARD_TOL
    # pixel_values as a keyword (data files with {"pixel_values": ...})
    assert torch.equal(model(pixel_values=images), model(images))


# ---------------------------------------------------------------------------------------------
# Round trip, ignored keys, config inference
# ---------------------------------------------------------------------------------------------

def test_round_trip_reproduces_state_dict_and_ignores_text_keys(soup, tmp_path):
    path, sd = soup
    assert set(CLIP_TEXT_KEYS) <= set(sd)  # the saved file carries the leftover text keys
    model = load_clip_soup(path, heads=2)
    loaded = model.state_dict()
    visual = {k: v for k, v in sd.items() if k not in CLIP_TEXT_KEYS}
    assert set(loaded) == set(visual)
    assert all(k.startswith(("model.visual.", "classification_head.")) for k in loaded)
    for k, v in visual.items():
        assert loaded[k].dtype == torch.float32 and torch.equal(loaded[k], v), k
    # other text keys / JIT leftovers / an undeleted text transformer / DataParallel prefix: same model
    images = _images(seed=3)
    y0 = model(images)
    extra = dict(sd)
    extra.update({"model.input_resolution": torch.tensor(32), "model.context_length": torch.tensor(8),
                  "model.vocab_size": torch.tensor(64),
                  "model.transformer.resblocks.0.attn.in_proj_weight": torch.randn(3 * 8, 8)})
    for k in CLIP_TEXT_KEYS:
        extra[k] = torch.randn_like(extra[k]) * 5
    torch.save(extra, tmp_path / "extra.pt")
    assert torch.equal(load_clip_soup(tmp_path / "extra.pt", heads=2)(images), y0)
    torch.save({"module." + k: v for k, v in sd.items()}, tmp_path / "dp.pt")
    assert torch.equal(load_clip_soup(tmp_path / "dp.pt", heads=2)(images), y0)
    # a float16 checkpoint is loaded as float32
    torch.save({k: v.half() for k, v in sd.items()}, tmp_path / "half.pt")
    half = load_clip_soup(tmp_path / "half.pt", heads=2)
    assert next(half.parameters()).dtype == torch.float32 and _rel(half(images), y0) < 1e-2
    # the model's own parameters carry the exact checkpoint key names
    fresh = CLIPSoupClassifier(model.config)
    assert set(fresh.state_dict()) == set(visual)


@pytest.mark.parametrize("kw", [
    dict(width=64, layers=1, heads=4, patch=4, resolution=16, embed_dim=8, classes=3),
    dict(width=96, layers=3, heads=3, patch=8, resolution=24, embed_dim=12, classes=7),
    SMALL,
])
def test_config_inferred_from_shapes(kw, tmp_path):
    sd = save_clip_soup_like(tmp_path / "m.pt", seed=0, **kw)
    cfg = clip_soup_config_from_state_dict(sd, heads=kw["heads"])
    assert cfg == CLIPSoupConfig(width=kw["width"], layers=kw["layers"], heads=kw["heads"],
                                 patch_size=kw["patch"], image_resolution=kw["resolution"],
                                 embed_dim=kw["embed_dim"], num_classes=kw["classes"])
    m = load_clip_soup(tmp_path / "m.pt", heads=kw["heads"])
    assert m.config == cfg and len(m.model.visual.transformer.resblocks) == kw["layers"]
    assert m.model.visual.transformer.resblocks[0].attn.num_heads == kw["heads"]
    if kw["width"] % 64:
        with pytest.raises(ValueError, match=r"not a multiple of 64.*pass heads="):
            clip_soup_config_from_state_dict(sd)
    else:
        assert clip_soup_config_from_state_dict(sd).heads == kw["width"] // 64


def test_config_of_vit_b32_shapes():
    """The real checkpoints' shapes (meta tensors: no memory): ViT-B/32, 12 heads, 224 px, 512 → 1000."""
    meta = dict(device="meta")
    w = 768
    sd = {"model.visual.conv1.weight": torch.empty(w, 3, 32, 32, **meta),
          "model.visual.class_embedding": torch.empty(w, **meta),
          "model.visual.positional_embedding": torch.empty(50, w, **meta),
          "model.visual.proj": torch.empty(w, 512, **meta),
          "classification_head.weight": torch.empty(1000, 512, **meta),
          "classification_head.bias": torch.empty(1000, **meta),
          "model.token_embedding.weight": torch.empty(49408, 512, **meta)}
    for i in range(12):
        sd[f"model.visual.transformer.resblocks.{i}.attn.in_proj_weight"] = torch.empty(3 * w, w, **meta)
    cfg = clip_soup_config_from_state_dict(sd)
    assert cfg == CLIPSoupConfig(width=768, layers=12, heads=12, patch_size=32, image_resolution=224,
                                 embed_dim=512, num_classes=1000)


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------

def test_errors_say_what_is_wrong(soup, tmp_path):
    path, sd = soup
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_clip_soup(tmp_path / "nope.pt")
    torch.save([torch.zeros(2)], tmp_path / "list.pt")
    with pytest.raises(ValueError, match="holds a list, not a state dict"):
        load_clip_soup(tmp_path / "list.pt")
    torch.save(CLIPSoupConfig(64, 1, 1, 8, 32, 16, 10), tmp_path / "pickled.pt")  # not weights-only
    with pytest.raises(ValueError, match="could not read .* as a tensor state dict"):
        load_clip_soup(tmp_path / "pickled.pt")
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="could not read"):
        load_clip_soup(tmp_path / "garbage.pt")
    with pytest.raises(ValueError, match="is not a file"):
        load_clip_soup(tmp_path)
    # a missing tensor of a block
    key = "model.visual.transformer.resblocks.1.mlp.c_fc.bias"
    bad = {k: v for k, v in sd.items() if k != key}
    torch.save(bad, tmp_path / "missing.pt")
    with pytest.raises(ValueError, match=r"missing 1 keys: \['" + key.replace(".", r"\.")):
        load_clip_soup(tmp_path / "missing.pt", heads=2)
    # a key the shape inference needs
    bad = {k: v for k, v in sd.items() if k != "model.visual.conv1.weight"}
    torch.save(bad, tmp_path / "noconv.pt")
    with pytest.raises(ValueError, match=r"lacks \['model\.visual\.conv1\.weight'\].*model-soups"):
        load_clip_soup(tmp_path / "noconv.pt", heads=2)
    # wrong shape
    bad = dict(sd)
    bad["model.visual.ln_post.weight"] = torch.ones(63)
    torch.save(bad, tmp_path / "shape.pt")
    with pytest.raises(ValueError, match=r"'model\.visual\.ln_post\.weight' has shape \(63,\), expected \(64,\)"):
        load_clip_soup(tmp_path / "shape.pt", heads=2)
    bad = dict(sd)
    bad["classification_head.weight"] = torch.zeros(10, 17)
    torch.save(bad, tmp_path / "head.pt")
    with pytest.raises(ValueError, match=r"classification_head\.weight has shape \(10, 17\)"):
        load_clip_soup(tmp_path / "head.pt", heads=2)
    # an unexpected image-encoder key (another architecture under model.visual)
    bad = dict(sd)
    bad["model.visual.transformer.resblocks.0.attn.q_norm.weight"] = torch.ones(32)
    torch.save(bad, tmp_path / "unexpected.pt")
    with pytest.raises(ValueError, match=r"unexpected 1 keys.*q_norm"):
        load_clip_soup(tmp_path / "unexpected.pt", heads=2)
    # a ResNet CLIP image encoder
    bad = dict(sd)
    bad["model.visual.conv1.weight"] = torch.zeros(32, 3, 3, 3)[:, :, :, :2]
    torch.save(bad, tmp_path / "resnet.pt")
    with pytest.raises(ValueError, match=r"expected \(width, 3, patch, patch\)"):
        load_clip_soup(tmp_path / "resnet.pt", heads=2)
    with pytest.raises(ValueError, match=r"heads=3 must be a positive integer dividing the width 64"):
        load_clip_soup(path, heads=3)


# ---------------------------------------------------------------------------------------------
# Symmetry map and geodesic sharpness on the loaded model
# ---------------------------------------------------------------------------------------------

def test_symmetry_map_and_orbit_invariance(soup):
    path, _ = soup
    model = load_clip_soup(path, heads=2).to(DT)
    smap = symmetry_map(model)
    L, N = SMALL["layers"], SMALL["heads"]
    assert not smap.refused, smap.refused
    assert sorted((g.key, g.num_heads, g.head_dim) for g in smap.groups) == sorted(
        (f"model.visual.transformer.resblocks.{i}.attn:{k}", N, SMALL["width"] // N)
        for i in range(L) for k in ("qk", "vo"))
    assert sum(g.num_heads for g in smap.groups) == L * N * 2

    gen = torch.Generator().manual_seed(7)
    images = _images(6, seed=5).to(DT)
    batch = (images, torch.randint(0, SMALL["classes"], (6,), generator=gen))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    y0 = model(images)
    for scale in (10.0, 0.1):
        As = draw_orbit_elements(smap, scale, gen)
        moved = smap.act(params, As)
        m1 = copy.deepcopy(model)
        m1.load_state_dict(moved)
        for g in smap.groups:  # the parameters really moved
            assert _rel(g.extract(moved)[0], g.extract(params)[0]) > 1e-2
        assert _rel(m1(images), y0) <= OUTPUT_TOL
        r0 = geodesic_sharpness(model, [batch], 0.1, metric="mix", n_iter=3, dtype=DT)
        r1 = geodesic_sharpness(m1, [batch], 0.1, metric="mix", n_iter=3, dtype=DT)
        assert r0.mean > 0
        assert _rel(r1.mean, r0.mean) <= SHARP_TOL, (r0.mean, r1.mean)
    # not vacuous: a non-symmetry (Q/K weights doubled) changes the output
    p2 = dict(params)
    for g in smap.groups:
        if g.kind == "qk":
            G, H = g.extract(p2)
            p2 = g.insert(p2, 2 * G, H)
    m2 = copy.deepcopy(model)
    m2.load_state_dict(p2)
    assert _rel(m2(images), y0) > 1e-3
