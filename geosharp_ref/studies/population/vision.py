"""Vision population task: tiny Hugging Face ViTs on scikit-learn's digits.

Data: ``sklearn.datasets.load_digits`` (1797 real 8×8 handwritten digits shipped inside scikit-learn),
pixels / 16 as ``pixel_values`` of shape (N, 1, 8, 8). A fixed permutation (``split_seed``) puts the
last ``n_test`` images in the test set and the others in the training pool.

Model: ``ViTForImageClassification`` with 8×8 single-channel images, patch 4 (4 tokens + CLS),
hidden 64, 2 layers, 4 heads of dimension 16, MLP 128, no dropout (sharpness is deterministic):
2 layers × 4 heads × 2 GL(16) pairs.

Recipe (chosen on a 10-model pilot, before any sharpness was computed): AdamW, learning rate
{1e-3, 2e-3, 4e-3}, 25–100 epochs, batch {32, 64, 128}; without augmentation the models reach zero
training error, with it 4–6 %; a third get 10 % label noise, which these small models do not
memorise (their gap is negative: train error on noisy labels above the clean test error).

Augmentation: random ±1 pixel shifts (zero fill), one per image.
"""
from __future__ import annotations

import torch

from .task import PopulationTask, Split

__all__ = ["VisionDigitsTask", "VISION_ARCH", "load_digits_split", "random_shift"]

VISION_ARCH = dict(image_size=8, patch_size=4, num_channels=1, hidden_size=64, num_hidden_layers=2,
                   num_attention_heads=4, intermediate_size=128, num_labels=10, hidden_dropout_prob=0.0,
                   attention_probs_dropout_prob=0.0)


def load_digits_split(split_seed: int = 0, n_test: int = 597):
    """``(x_pool, y_pool, x_test, y_test)``: sklearn digits as (N, 1, 8, 8) float32 in [0, 1]."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(split_seed))
    x, y = x[perm], y[perm]
    n_pool = len(y) - n_test
    return x[:n_pool], y[:n_pool], x[n_pool:], y[n_pool:]


def random_shift(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Random ±1 pixel shifts (zero fill) of images ``(N, C, H, W)``, one shift per image."""
    n, _, hgt, wid = x.shape
    pad = torch.nn.functional.pad(x, (1, 1, 1, 1))
    dx = torch.randint(0, 3, (n,), generator=gen)
    dy = torch.randint(0, 3, (n,), generator=gen)
    out = torch.empty_like(x)
    for i in range(3):
        for j in range(3):
            m = (dy == i) & (dx == j)
            if m.any():
                out[m] = pad[m, :, i:i + hgt, j:j + wid]
    return out


class VisionDigitsTask(PopulationTask):
    name = "vision"
    kind = "vision-vit-digits"
    arch = VISION_ARCH
    hparam_choices = dict(lr=(1e-3, 2e-3, 4e-3), weight_decay=(0.0, 0.01, 0.1), batch_size=(32, 64, 128),
                          train_size=(150, 300, 600, 1200), label_noise=(0.0, 0.0, 0.1),
                          augment=(False, True), warmup=(0.0, 0.1))
    epochs_max = 100
    n_test = 597
    num_labels = 10

    def data_spec(self, split_seed: int, n_test: int | None = None) -> dict:
        return dict(dataset="sklearn.load_digits", split_seed=split_seed,
                    n_test=self.n_test if n_test is None else n_test, pixels="images / 16, shape (1, 8, 8)")

    def load_split(self, data_spec: dict, root=None) -> Split:
        xp, yp, xt, yt = load_digits_split(data_spec["split_seed"], data_spec["n_test"])
        return Split(pool={"pixel_values": xp}, y_pool=yp, test={"pixel_values": xt}, y_test=yt)

    def build_model(self, arch: dict):
        import transformers

        return transformers.ViTForImageClassification(transformers.ViTConfig(**arch))

    def augment(self, inputs: dict, gen: torch.Generator) -> dict:
        return {**inputs, "pixel_values": random_shift(inputs["pixel_values"], gen)}
