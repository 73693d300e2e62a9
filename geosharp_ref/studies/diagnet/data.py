"""Diagonal linear networks: data, square loss, hyper-parameters, and training all models at once.

See :mod:`geosharp_ref.studies.diagnet` for the model, the symmetry and the experiment.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

__all__ = ["DiagNetData", "make_data", "mse", "loss_gradient", "sample_hyperparameters", "TrainResult",
           "train_diagonal_nets", "single_thread", "DTYPE"]

DTYPE = torch.float64


# ================================================================================================
# Data and loss
# ================================================================================================

@dataclass
class DiagNetData:
    X: torch.Tensor          # (n, d) training inputs
    y: torch.Tensor          # (n,)
    X_test: torch.Tensor     # (n_test, d) fresh test inputs
    y_test: torch.Tensor
    beta_star: torch.Tensor  # (d,) sparse ground truth
    noise_std: float = 0.0

    @property
    def n(self):
        return self.X.shape[0]

    @property
    def d(self):
        return self.X.shape[1]


def make_data(d: int = 200, n: int = 100, n_test: int = 5000, sparsity: float = 0.9,
              noise_std: float = 0.0, seed: int = 0) -> DiagNetData:
    """Gaussian inputs, a sparse Gaussian ground truth (``round((1 − sparsity) d)`` non-zeros),
    labels y = Xβ* + noise; the test set is drawn fresh from the same distribution."""
    g = torch.Generator().manual_seed(int(seed))
    k = max(1, int(round((1.0 - sparsity) * d)))
    beta = torch.zeros(d, dtype=DTYPE)
    support = torch.randperm(d, generator=g)[:k]
    beta[support] = torch.randn(k, generator=g, dtype=DTYPE)
    X = torch.randn(n, d, generator=g, dtype=DTYPE)
    X_test = torch.randn(n_test, d, generator=g, dtype=DTYPE)
    y = X @ beta + noise_std * torch.randn(n, generator=g, dtype=DTYPE)
    y_test = X_test @ beta + noise_std * torch.randn(n_test, generator=g, dtype=DTYPE)
    return DiagNetData(X, y, X_test, y_test, beta, float(noise_std))


def mse(beta, X, y):
    """L(β) = mean((Xβ − y)²), batched over the leading dimensions of ``beta``."""
    r = beta @ X.mT - y
    return (r * r).mean(-1)


def loss_gradient(beta, X, y):
    """h = ∇L(β) = (2/n) Xᵀ(Xβ − y) (batched)."""
    return 2.0 * (beta @ X.mT - y) @ X / X.shape[0]


# ================================================================================================
# Training (all models at once)
# ================================================================================================

def sample_hyperparameters(n_models: int, n: int, seed: int = 0, alpha_range=(1e-3, 1.0),
                           lr_range=(0.02, 0.2), batch_fractions=(1.0, 0.5, 0.2, 0.1)) -> list[dict]:
    """Random initialisation scale α (log-uniform), learning rate (log-uniform) and batch size
    (``fraction · n``; 1.0 is full-batch gradient descent) for each model."""
    rng = np.random.default_rng([int(seed), 7919])
    la, lb = np.log10(alpha_range)
    ra, rb = np.log10(lr_range)
    out = []
    for i in range(n_models):
        out.append(dict(alpha=float(10 ** rng.uniform(la, lb)), lr=float(10 ** rng.uniform(ra, rb)),
                        batch_size=int(max(1, round(n * float(rng.choice(batch_fractions)))))))
    return out


@dataclass
class TrainResult:
    U: torch.Tensor            # (M, d)
    V: torch.Tensor            # (M, d)
    steps: list
    restarts: list
    lr: list                   # learning rate actually used (halved on divergence)
    converged: list
    train_loss: list
    seconds: float


class single_thread:
    """Context manager: torch on one intra-op thread (small tensors: thread hand-off costs more than
    it saves, and much more on a loaded 2-core machine). Restores the previous setting."""

    def __enter__(self):
        self.n = torch.get_num_threads()
        torch.set_num_threads(1)
        return self

    def __exit__(self, *exc):
        torch.set_num_threads(self.n)
        return False


def train_diagonal_nets(data: DiagNetData, hparams: Sequence[dict], target_loss: float = 1e-5,
                        max_steps: int = 300_000, seed: int = 0, progress: bool = True) -> TrainResult:
    """(S)GD on L(u ⊙ v) for every model simultaneously, from u = α·1, v = 0.

    Each step draws, per model, a batch of ``batch_size`` distinct training points (all of them for
    full-batch models); the full training loss is computed every step (it shares the residual
    with the gradient) and a model is frozen as soon as it is ≤ ``target_loss`` (frozen models leave
    the batched computation). A model whose loss becomes non-finite or grows 1e3-fold is restarted
    from its initialisation with half the learning rate."""
    X, y = data.X, data.y
    n, d = X.shape
    M = len(hparams)
    g = torch.Generator().manual_seed(int(seed) + 12345)
    alpha = torch.tensor([h["alpha"] for h in hparams], dtype=DTYPE)
    lr = torch.tensor([h["lr"] for h in hparams], dtype=DTYPE)
    bs = torch.tensor([h["batch_size"] for h in hparams])
    if int(bs.min()) < 1 or int(bs.max()) > n:
        raise ValueError(f"batch sizes must lie in [1, {n}]")
    U = alpha[:, None].expand(M, d).clone()
    V = torch.zeros(M, d, dtype=DTYPE)
    steps = torch.zeros(M, dtype=torch.long)
    restarts = torch.zeros(M, dtype=torch.long)
    final = torch.full((M,), float("nan"), dtype=DTYPE)
    l0 = float((y * y).mean())
    t0 = time.perf_counter()
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=M, desc="training diagonal nets", unit="model")
    ids = torch.arange(M)                   # active models (compact arrays below)
    Ua, Va = U.clone(), V.clone()
    step = 0
    with single_thread():
        while len(ids) and step < max_steps:
            r = (Ua * Va) @ X.T - y                      # (Ma, n)
            loss = (r * r).mean(1)
            bad = ~torch.isfinite(loss) | (loss > 1e3 * max(l0, 1e-12))
            if bool(bad.any()):
                bi = ids[bad]
                Ua[bad] = alpha[bi, None].expand(-1, d)
                Va[bad] = 0.0
                lr[bi] = lr[bi] * 0.5
                restarts[bi] += 1
                steps[bi] = 0
                continue
            done = loss <= target_loss
            if bool(done.any()):
                di = ids[done]
                final[di] = loss[done]
                U[di], V[di] = Ua[done], Va[done]
                keep = ~done
                ids, Ua, Va, r = ids[keep], Ua[keep], Va[keep], r[keep]
                if bar is not None:
                    bar.update(int(done.sum()))
                if not len(ids):
                    break
            b = bs[ids]
            if bool((b == n).all()):
                gb = (2.0 / n) * (r @ X)                 # full-batch gradient in β, (Ma, d)
            else:
                bmax = int(b.max())
                pick = torch.rand(len(ids), n, generator=g).argsort(1)[:, :bmax]
                vals = (torch.arange(bmax)[None, :] < b[:, None]).to(DTYPE) / b[:, None].to(DTYPE)
                w = torch.zeros(len(ids), n, dtype=DTYPE).scatter_(1, pick, vals)
                gb = 2.0 * (w * r) @ X
            step_lr = lr[ids][:, None]
            Ua, Va = Ua - step_lr * gb * Va, Va - step_lr * gb * Ua
            steps[ids] += 1
            step += 1
        if len(ids):
            U[ids], V[ids] = Ua, Va
    if bar is not None:
        bar.close()
    r = (U * V) @ X.T - y
    loss = (r * r).mean(1)
    final = torch.where(torch.isnan(final), loss, final)
    converged = (final <= target_loss).tolist()
    return TrainResult(U=U, V=V, steps=steps.tolist(), restarts=restarts.tolist(), lr=lr.tolist(),
                       converged=converged, train_loss=final.tolist(),
                       seconds=time.perf_counter() - t0)
