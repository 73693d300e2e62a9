"""Tiny models for property tests: :func:`tiny_model` (BERT, GPT-2, ViT, an MLP), :func:`with_lora` (a peft
LoRA adapter that matters), :func:`tiny_batch` (a batch that fits one) and the hypothesis strategy
:func:`small_models`."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

__all__ = ["tiny_model", "with_lora", "tiny_batch", "small_models"]


def _transformers():
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


#: the tiny configurations of :func:`tiny_model` (two layers of two heads of width 16)
_SMALL = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)


def tiny_model(kind: str = "bert", *, seed: int = 0, lora=None, lora_rank: int = 2, **config):
    """A tiny randomly initialised classifier (3 labels, float32, eval mode, eager attention): ``"bert"``
    (vocabulary 50), ``"gpt2"`` (vocabulary 50, sequence classification), ``"vit"`` (8×8 images, patches of
    4), each two layers of two heads of width 16 (``config`` overrides the transformers config; weights drawn
    N(0, 0.5²) so attention is far from uniform), or ``"mlp"`` (8 → 16 → ReLU → 3). ``lora``: module names
    to wrap with a peft LoRA adapter of rank ``lora_rank`` (its lora_B drawn N(0, 0.5²), not peft's zeros,
    so the adapter matters). ``seed`` fixes every weight."""
    torch.manual_seed(seed)
    if kind == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    else:
        T = _transformers()
        kw = dict(num_labels=3, initializer_range=0.5, attn_implementation="eager", **_SMALL)
        if kind == "bert":
            kw.update(vocab_size=50, max_position_embeddings=32)
            kw.update(config)
            model = T.BertForSequenceClassification(T.BertConfig(**kw))
        elif kind == "gpt2":
            kw = dict(num_labels=3, initializer_range=0.5, attn_implementation="eager", vocab_size=50, n_positions=32,
                      n_embd=16, n_layer=2, n_head=2, pad_token_id=0)
            kw.update(config)
            model = T.GPT2ForSequenceClassification(T.GPT2Config(**kw))
        elif kind == "vit":
            kw.update(image_size=8, patch_size=4)
            kw.update(config)
            model = T.ViTForImageClassification(T.ViTConfig(**kw))
        else:
            raise ValueError(f"unknown tiny model kind {kind!r}: choose bert, gpt2, vit or mlp")
    if lora:
        model = with_lora(model, lora, lora_rank, seed)
    return model.eval()


def with_lora(model, targets=("query", "value"), rank: int = 2, seed: int = 0):
    """``model`` wrapped by peft with a LoRA adapter of rank r = ``rank`` (alpha 2r) on the modules named
    ``targets``, each lora_B (r columns) drawn N(0, 0.5²) from a generator seeded with ``seed``: peft starts
    lora_B at 0, where B A = 0 and the adapter's GL(r) orbit is degenerate; after training it is not. lora_A keeps
    peft's initialisation (torch's global generator). Returns the PeftModel in eval mode; needs ``peft``."""
    import peft

    model = peft.get_peft_model(model, peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(targets)))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
    return model.eval()


def tiny_batch(model, batch_size: int = 4, seed: int = 0):
    """``(inputs, targets)`` that fits a :func:`tiny_model` (or a Hugging Face classifier with a
    ``config``): ``pixel_values`` for a config with ``image_size``, else ``input_ids`` of length ≤ 8; a plain
    module gets a tensor of its first Linear's width. Targets: class indices (``num_labels``, default 3)."""
    gen = torch.Generator().manual_seed(seed)
    cfg = getattr(model, "config", None)
    labels = int(getattr(cfg, "num_labels", 3) or 3)
    if cfg is None:
        first = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
        inputs = torch.randn(batch_size, first.in_features, generator=gen)
        last = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
        labels = last.out_features
    elif getattr(cfg, "image_size", None):
        size = cfg.image_size
        inputs = {"pixel_values": torch.randn(batch_size, getattr(cfg, "num_channels", 3), size, size, generator=gen)}
    else:
        positions = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", 8)
        inputs = {"input_ids": torch.randint(3, cfg.vocab_size, (batch_size, min(8, positions)), generator=gen)}
    return inputs, torch.randint(labels, (batch_size,), generator=gen)


def small_models(kinds=("bert", "vit"), *, lora=None):
    """Tiny models (:func:`tiny_model`) of the given ``kinds``, with a drawn seed (shrinks to the first kind,
    seed 0). Each draw builds a model: keep ``max_examples`` small."""
    return st.builds(lambda k, s: tiny_model(k, seed=s, lora=lora), st.sampled_from(tuple(kinds)), st.integers(0, 2**16))


# -- measuring ------------------------------------------------------------------------------------------------
