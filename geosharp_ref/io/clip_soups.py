"""model-soups CLIP ViT-B/32 ImageNet fine-tunes, loaded from local state dicts without any download.

* **model-soups CLIP ViT-B/32 ImageNet fine-tunes** (Wortsman et al. 2022; the paper's ImageNet
  population).  Each ``model_{i}.pt`` is the state dict of model-soups' ``ModelWrapper(model=clip_model,
  feature_dim=512, num_classes=1000, normalize=True)`` whose CLIP text transformer was deleted.
  :class:`CLIPSoupClassifier` re-implements it module for module (OpenAI CLIP's ``VisionTransformer``:
  ``nn.MultiheadAttention`` with fused ``in_proj``, QuickGELU MLP, pre-norm blocks; features
  ``ln_post(x[:, 0]) @ proj``, L2-normalised, then the linear ``classification_head``), so that its
  state dict keys are exactly the checkpoint's ``model.visual.*`` and ``classification_head.*`` keys.
  The leftover text keys (``model.token_embedding.weight``, ``model.positional_embedding``,
  ``model.ln_final.*``, ``model.text_projection``, ``model.logit_scale``, JIT leftovers such as
  ``model.input_resolution``, or a text ``model.transformer.*`` that was not deleted) are ignored.
  Input: ``pixel_values`` (B, 3, R, R), already preprocessed as CLIP's ``preprocess`` does (resize,
  centre crop, normalisation with CLIP's mean / std).
  One deliberate difference: OpenAI's ``LayerNorm`` subclass computes in float32 and casts back; here
  LayerNorm computes in the input dtype, so a float64 copy (``dtype=torch.float64`` in the sharpness
  functions) really is float64.  In float32, the dtype the checkpoints are loaded in, both are the same.
"""
from __future__ import annotations

import math
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import nn

__all__ = ["CLIPSoupConfig", "CLIPSoupClassifier", "clip_soup_config_from_state_dict", "load_clip_soup",
           "save_clip_soup_like", "CLIP_TEXT_KEYS"]

# leftover keys of the CLIP model once model-soups deleted its text transformer
CLIP_TEXT_KEYS = ("model.positional_embedding", "model.token_embedding.weight", "model.ln_final.weight",
                  "model.ln_final.bias", "model.text_projection", "model.logit_scale")
_VIS = "model.visual."
_HEAD = "classification_head."
_FORMAT_HINT = ("expected a model-soups checkpoint: the state dict of ModelWrapper(CLIP model, feature_dim, "
                "num_classes, normalize=True), saved with torch.save(model.state_dict(), 'model_i.pt')")


# ------------------------------------------------------------------------------------------------
# CLIP ViT image encoder + linear head (model-soups ModelWrapper)
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CLIPSoupConfig:
    """Shape of a model-soups CLIP classifier (ViT-B/32: width 768, 12 layers, 12 heads, patch 32,
    resolution 224, embed_dim 512, 1000 classes)."""
    width: int
    layers: int
    heads: int
    patch_size: int
    image_resolution: int
    embed_dim: int
    num_classes: int
    normalize: bool = True

    # names other geosharp code looks for (random batches, head counts)
    @property
    def image_size(self) -> int:
        return self.image_resolution

    @property
    def num_channels(self) -> int:
        return 3

    @property
    def num_attention_heads(self) -> int:
        return self.heads

    @property
    def num_labels(self) -> int:
        return self.num_classes

    @property
    def grid(self) -> int:
        return self.image_resolution // self.patch_size


class QuickGELU(nn.Module):
    """OpenAI CLIP's activation, x·σ(1.702 x)."""

    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


class ResidualAttentionBlock(nn.Module):
    """x + attn(ln_1(x)); x + mlp(ln_2(x)). Sequence-first (L, B, D) like OpenAI CLIP."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.attn = nn.MultiheadAttention(width, heads)
        self.ln_1 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(OrderedDict([("c_fc", nn.Linear(width, 4 * width)), ("gelu", QuickGELU()),
                                              ("c_proj", nn.Linear(4 * width, width))]))
        self.ln_2 = nn.LayerNorm(width)

    def forward(self, x):
        y = self.ln_1(x)
        x = x + self.attn(y, y, y, need_weights=False, attn_mask=None)[0]
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    def __init__(self, width: int, layers: int, heads: int):
        super().__init__()
        self.width, self.layers = width, layers
        self.resblocks = nn.Sequential(*[ResidualAttentionBlock(width, heads) for _ in range(layers)])

    def forward(self, x):
        return self.resblocks(x)


class VisionTransformer(nn.Module):
    """OpenAI CLIP's image encoder (``clip/model.py``)."""

    def __init__(self, cfg: CLIPSoupConfig):
        super().__init__()
        w, p = cfg.width, cfg.patch_size
        self.input_resolution, self.output_dim = cfg.image_resolution, cfg.embed_dim
        self.conv1 = nn.Conv2d(3, w, kernel_size=p, stride=p, bias=False)
        scale = w ** -0.5
        self.class_embedding = nn.Parameter(scale * torch.randn(w))
        self.positional_embedding = nn.Parameter(scale * torch.randn(cfg.grid ** 2 + 1, w))
        self.ln_pre = nn.LayerNorm(w)
        self.transformer = Transformer(w, cfg.layers, cfg.heads)
        self.ln_post = nn.LayerNorm(w)
        self.proj = nn.Parameter(scale * torch.randn(w, cfg.embed_dim))

    def forward(self, x):
        x = self.conv1(x.to(self.conv1.weight.dtype))          # (B, width, grid, grid)
        x = x.reshape(x.shape[0], x.shape[1], -1).permute(0, 2, 1)  # (B, grid², width)
        cls = self.class_embedding.to(x.dtype) + torch.zeros(x.shape[0], 1, x.shape[-1], dtype=x.dtype,
                                                             device=x.device)
        x = torch.cat([cls, x], dim=1) + self.positional_embedding.to(x.dtype)
        x = self.ln_pre(x)
        x = self.transformer(x.permute(1, 0, 2)).permute(1, 0, 2)  # NLD -> LND -> NLD
        return self.ln_post(x[:, 0, :]) @ self.proj


class _ImageOnlyCLIP(nn.Module):
    """The ``model`` of ModelWrapper once the text side is ignored: only ``visual`` remains."""

    def __init__(self, cfg: CLIPSoupConfig):
        super().__init__()
        self.visual = VisionTransformer(cfg)

    def encode_image(self, image):
        return self.visual(image)


class CLIPSoupClassifier(nn.Module):
    """model-soups ``ModelWrapper``: logits = head(f / ‖f‖) with f = CLIP image features.

    ``state_dict()`` keys are exactly the checkpoint's ``model.visual.*`` and ``classification_head.*``."""

    main_input_name = "pixel_values"

    def __init__(self, config: CLIPSoupConfig):
        super().__init__()
        if config.width % config.heads:
            raise ValueError(f"width {config.width} is not divisible by heads={config.heads}")
        if config.image_resolution % config.patch_size:
            raise ValueError(f"image resolution {config.image_resolution} is not a multiple of the patch "
                             f"size {config.patch_size}")
        self.config = config
        self.model = _ImageOnlyCLIP(config)
        self.classification_head = nn.Linear(config.embed_dim, config.num_classes)
        self.normalize = config.normalize

    def forward(self, pixel_values):
        features = self.model.encode_image(pixel_values)
        if self.normalize:
            features = features / features.norm(dim=-1, keepdim=True)
        return self.classification_head(features)


# ------------------------------------------------------------------------------------------------
# Reading model-soups state dicts
# ------------------------------------------------------------------------------------------------

_REQUIRED = ("model.visual.conv1.weight", "model.visual.positional_embedding", "model.visual.proj",
             "model.visual.transformer.resblocks.0.attn.in_proj_weight", "classification_head.weight")
_BLOCK = re.compile(r"^model\.visual\.transformer\.resblocks\.(\d+)\.")


def _unwrap(sd):
    """Accept {'state_dict': sd} wrappers and DataParallel's 'module.' prefix."""
    if isinstance(sd, dict) and "state_dict" in sd and isinstance(sd["state_dict"], dict):
        sd = sd["state_dict"]
    if isinstance(sd, dict) and sd and all(isinstance(k, str) and k.startswith("module.") for k in sd):
        sd = {k[len("module."):]: v for k, v in sd.items()}
    return sd


def _shape(sd, key):
    return tuple(sd[key].shape)


def clip_soup_config_from_state_dict(sd, heads: Optional[int] = None) -> CLIPSoupConfig:
    """The architecture of a model-soups state dict, from its tensor shapes alone (as OpenAI CLIP's
    ``build_model`` does): width, layers, patch size, resolution, embed dim, classes; heads =
    width // 64 (OpenAI CLIP's rule) unless ``heads`` is given (needed when width is not a multiple
    of 64)."""
    sd = _unwrap(sd)
    if not isinstance(sd, dict):
        raise ValueError(f"not a state dict (got {type(sd).__name__}); {_FORMAT_HINT}")
    missing = [k for k in _REQUIRED if k not in sd]
    if missing:
        vis = sum(1 for k in sd if isinstance(k, str) and k.startswith(_VIS))
        raise ValueError(f"state dict lacks {missing} ({len(sd)} keys, {vis} under {_VIS!r}); {_FORMAT_HINT}")
    for k in _REQUIRED:
        if not torch.is_tensor(sd[k]):
            raise ValueError(f"{k!r} is a {type(sd[k]).__name__}, not a tensor; {_FORMAT_HINT}")
    conv = _shape(sd, "model.visual.conv1.weight")
    if len(conv) != 4 or conv[1] != 3 or conv[2] != conv[3]:
        raise ValueError(f"model.visual.conv1.weight has shape {conv}; expected (width, 3, patch, patch) "
                         f"(a CLIP ViT image encoder, not a ResNet one)")
    width, patch = conv[0], conv[2]
    pos = _shape(sd, "model.visual.positional_embedding")
    if len(pos) != 2 or pos[1] != width:
        raise ValueError(f"model.visual.positional_embedding has shape {pos}; expected (grid² + 1, {width})")
    grid = round(math.sqrt(pos[0] - 1)) if pos[0] > 1 else 0
    if grid < 1 or grid * grid + 1 != pos[0]:
        raise ValueError(f"model.visual.positional_embedding has {pos[0]} rows, not grid² + 1 for a square "
                         f"grid of patches")
    proj = _shape(sd, "model.visual.proj")
    if len(proj) != 2 or proj[0] != width:
        raise ValueError(f"model.visual.proj has shape {proj}; expected ({width}, embed_dim)")
    head = _shape(sd, "classification_head.weight")
    if len(head) != 2 or head[1] != proj[1]:
        raise ValueError(f"classification_head.weight has shape {head}; expected (classes, {proj[1]}) to "
                         f"match model.visual.proj {proj}")
    blocks = sorted({int(m.group(1)) for k in sd if isinstance(k, str) for m in [_BLOCK.match(k)] if m})
    layers = len(blocks)
    if blocks != list(range(layers)):
        raise ValueError(f"residual blocks {blocks} are not numbered 0..{layers - 1}; the checkpoint is "
                         f"incomplete")
    if heads is None:
        if width % 64:
            raise ValueError(f"width {width} is not a multiple of 64, so OpenAI CLIP's rule heads = width "
                             f"// 64 does not apply; pass heads= (the number of attention heads)")
        heads = width // 64
    if not (isinstance(heads, int) and heads > 0 and width % heads == 0):
        raise ValueError(f"heads={heads!r} must be a positive integer dividing the width {width}")
    return CLIPSoupConfig(width=width, layers=layers, heads=heads, patch_size=patch,
                          image_resolution=grid * patch, embed_dim=proj[1], num_classes=head[0])


def _read_state_dict(path: Path):
    if not path.exists():
        raise FileNotFoundError(f"model file {str(path)!r} does not exist; {_FORMAT_HINT}")
    if not path.is_file():
        raise ValueError(f"{str(path)!r} is not a file; {_FORMAT_HINT} (a Hugging Face directory needs "
                         f"loader 'hf')")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickled modules, truncated files, other formats
        raise ValueError(f"could not read {str(path)!r} as a tensor state dict ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}); {_FORMAT_HINT}. A pickled "
                         f"whole model must first be re-saved as model.state_dict() where its classes "
                         f"are importable") from exc
    obj = _unwrap(obj)
    if not isinstance(obj, dict):
        raise ValueError(f"{str(path)!r} holds a {type(obj).__name__}, not a state dict; {_FORMAT_HINT}")
    return obj


def _ignored(key: str) -> bool:
    """Keys of the CLIP text side (and JIT leftovers) that the image classifier does not use."""
    return key.startswith("model.") and not key.startswith(_VIS)


def load_clip_soup(path, heads: Optional[int] = None) -> CLIPSoupClassifier:
    """Load a model-soups ``model_{i}.pt`` as an eval-mode float32 :class:`CLIPSoupClassifier`.

    The architecture is read from the tensor shapes (:func:`clip_soup_config_from_state_dict`);
    text-side keys are ignored; every image-encoder and head tensor must be present with the right
    shape, and nothing else may be under ``model.visual.`` / ``classification_head.``."""
    path = Path(path)
    sd = _read_state_dict(path)
    try:
        cfg = clip_soup_config_from_state_dict(sd, heads=heads)
    except ValueError as exc:
        raise ValueError(f"{str(path)!r}: {exc}") from None
    model = CLIPSoupClassifier(cfg)
    expected = model.state_dict()
    mine = {k: v for k, v in sd.items() if not (isinstance(k, str) and _ignored(k))}
    missing = [k for k in expected if k not in mine]
    unexpected = [str(k) for k in mine if k not in expected]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} keys: {missing[:6]}{' …' if len(missing) > 6 else ''}")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} keys: {unexpected[:6]}{' …' if len(unexpected) > 6 else ''}")
        raise ValueError(f"{str(path)!r} does not match a CLIP ViT classifier with width {cfg.width}, "
                         f"{cfg.layers} layers, patch {cfg.patch_size}: {'; '.join(parts)}; {_FORMAT_HINT}")
    for k, ref in expected.items():
        v = mine[k]
        if not torch.is_tensor(v):
            raise ValueError(f"{str(path)!r}: {k!r} is a {type(v).__name__}, not a tensor")
        if tuple(v.shape) != tuple(ref.shape):
            raise ValueError(f"{str(path)!r}: {k!r} has shape {tuple(v.shape)}, expected {tuple(ref.shape)} "
                             f"for width {cfg.width}, {cfg.layers} layers, patch {cfg.patch_size}, resolution "
                             f"{cfg.image_resolution}, embed dim {cfg.embed_dim}, {cfg.num_classes} classes; "
                             f"the checkpoint is inconsistent or not in the model-soups format")
        if not v.is_floating_point():
            raise ValueError(f"{str(path)!r}: {k!r} has dtype {v.dtype}; expected floating-point weights")
    model.load_state_dict({k: mine[k].float() for k in expected}, strict=True)
    return model.float().eval()


def save_clip_soup_like(path, width: int = 64, layers: int = 2, heads: int = 2, patch: int = 8,
                        resolution: int = 32, embed_dim: int = 16, classes: int = 10, seed: int = 0,
                        text_width: Optional[int] = None, vocab: int = 64, context: int = 8) -> dict:
    """Write a random checkpoint in exactly the model-soups key format (visual encoder, head, and the
    leftover CLIP text keys), to try the pipeline without the real files.  Returns the state dict.

    Initialisation follows OpenAI CLIP's (attention std width^-½, residual outputs
    width^-½·(2·layers)^-½, MLP in (2·width)^-½, embeddings and projection width^-½), with random
    non-zero biases and LayerNorm parameters so that every parameter matters."""
    cfg = CLIPSoupConfig(width=width, layers=layers, heads=heads, patch_size=patch,
                         image_resolution=resolution, embed_dim=embed_dim, num_classes=classes)
    gen = torch.Generator().manual_seed(seed)
    model = CLIPSoupClassifier(cfg)

    def rnd(*shape, std=1.0, mean=0.0):
        return mean + std * torch.randn(*shape, generator=gen)

    attn_std, proj_std, fc_std = width ** -0.5, width ** -0.5 * (2 * layers) ** -0.5, (2 * width) ** -0.5
    vals = {}
    for k, p in model.state_dict().items():
        leaf = k.rsplit(".", 1)[-1]
        if ".ln_" in k:  # LayerNorm: weight around 1, bias around 0
            vals[k] = rnd(*p.shape, std=0.1, mean=1.0 if leaf == "weight" else 0.0)
        elif p.dim() == 1:  # biases, class embedding
            vals[k] = rnd(*p.shape, std=width ** -0.5 if "class_embedding" in k else 0.05)
        elif "in_proj_weight" in k:
            vals[k] = rnd(*p.shape, std=attn_std)
        elif "out_proj" in k or "c_proj" in k:
            vals[k] = rnd(*p.shape, std=proj_std)
        elif "c_fc" in k:
            vals[k] = rnd(*p.shape, std=fc_std)
        elif "conv1" in k:
            vals[k] = rnd(*p.shape, std=(3 * patch * patch) ** -0.5)
        elif k.startswith(_HEAD):
            vals[k] = rnd(*p.shape, std=embed_dim ** -0.5)
        else:  # positional embedding, proj
            vals[k] = rnd(*p.shape, std=width ** -0.5)
    tw = text_width or width
    text = {"model.positional_embedding": rnd(context, tw, std=0.01),
            "model.text_projection": rnd(tw, embed_dim, std=tw ** -0.5),
            "model.logit_scale": torch.tensor(math.log(1 / 0.07)),
            "model.token_embedding.weight": rnd(vocab, tw, std=0.02),
            "model.ln_final.weight": torch.ones(tw), "model.ln_final.bias": torch.zeros(tw)}
    # ModelWrapper order: CLIP's own parameters (text leftovers around visual), then the head
    sd = OrderedDict()
    for k in ("model.positional_embedding", "model.text_projection", "model.logit_scale"):
        sd[k] = text[k]
    sd.update((k, v) for k, v in vals.items() if k.startswith(_VIS))
    for k in ("model.token_embedding.weight", "model.ln_final.weight", "model.ln_final.bias"):
        sd[k] = text[k]
    sd.update((k, v) for k, v in vals.items() if k.startswith(_HEAD))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(sd, path)
    return sd
