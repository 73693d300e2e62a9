r"""Curvature measures: Hessian trace (Hutchinson) and top eigenvalues (Lanczos), on the quotient and Euclidean.

Both work on an operator's flat coordinates (:mod:`~geosharp_ref.sharpness.hessian`): Ã y for the quotient
(metric-orthonormal coordinates, tr Ã = tr(Hess L|_horizontal), spectrum = that of Hess L on the horizontal
space plus dim(vertical) zeros) or ∇²L y for the Euclidean Hessian.

* :func:`hutchinson_trace` — tr ≈ (1/m) Σᵢ yᵢᵀ Ã yᵢ, yᵢ Rademacher (default) or Gaussian (E[y yᵀ] = I);
  for the quotient yᵀÃy = g(z, Hess L[z]) with the metric-orthonormal horizontal probe z = P S y. Returned
  with its standard error s/√m (s the sample standard deviation). Variance per probe: 2‖Ã‖_F² (Gaussian),
  2(‖Ã‖_F² − Σ Ã_ii²) (Rademacher).
* :func:`hutchpp_trace` — Hutch++ (Meyer, Musco, Musco & Woodruff, SOSA 2021) for the same m matvecs:
  k = ⌊m/3⌋ sketch probes S (N × k), Q = orth(Ã S) (k matvecs), then
  tr ≈ tr(Qᵀ Ã Q) + (1/r) Σᵢ gᵢᵀ (I − QQᵀ) Ã (I − QQᵀ) gᵢ (k + r matvecs, r = m − 2k residual probes). Unbiased;
  exact when rank Ã ≤ k; its variance is Hutchinson's on the deflated operator, 2‖(I − QQᵀ)Ã(I − QQᵀ)‖_F²/r
  (Gaussian), so it pays when a few eigenvalues dominate ‖Ã‖_F (Hessians of trained networks: a few outliers
  per class). Its standard error is the residual probes' s/√r, conditional on the sketch. Memory: Q, k × N.
* :func:`top_eigenvalues` — Lanczos with full reorthogonalisation (``steps`` matvecs, default
  max(2k + 10, 20) capped at N; Ritz values of the tridiagonal T, residual bounds |β_m s_{m,j}| as errors;
  memory: the basis, steps × N numbers, e.g. 1.8 GB for 20 steps of all-MiniLM-L6-v2 in float32),
  or ``method="scipy"``: ``scipy.sparse.linalg.eigsh`` on the operator's ``LinearOperator``.
* :func:`exact_trace` — Σᵢ eᵢᵀ Ã eᵢ over the N coordinate vectors (N matvecs: tiny models only).
* :func:`curvature` — trace and top eigenvalues of a model on batches, quotient (inv/mix, further
  symmetries) or Euclidean (the perturbed parameters of the same space): one :class:`CurvatureResult`.
* :func:`curvature_sharpness` — the same as a :class:`~geosharp_ref.sharpness.result.SharpnessResult`, per
  batch, for the named measures ``hessian-trace-*`` and ``hessian-top-eigenvalue-*``
  (:mod:`~geosharp_ref.sharpness.measures`; the radius ρ is recorded and not used).
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

import torch

from ..forward import default_loss, model_loss
from .hessian import EuclideanHessian, QuotientHessian
from .pipeline import EvaluationSpace, bucket_batches, check_length_buckets, evaluation_space
from .result import SharpnessResult

__all__ = ["TraceEstimate", "Eigenvalues", "CurvatureResult", "hutchinson_trace", "hutchpp_trace", "top_eigenvalues",
           "exact_trace", "curvature", "curvature_sharpness", "check_trace_method", "PROBES", "GEOMETRIES",
           "TRACE_METHODS"]

#: probe distributions of :func:`hutchinson_trace`
PROBES = ("rademacher", "gaussian")
#: trace estimators of :func:`curvature`: :func:`hutchinson_trace` and :func:`hutchpp_trace`
TRACE_METHODS = ("hutchinson", "hutch++")
#: the geometries of :func:`curvature`: the quotient metrics and the Euclidean Hessian
GEOMETRIES = ("inv", "mix", "euclidean")


@dataclass
class TraceEstimate:
    """A trace estimate: ``value`` ± ``stderr`` from ``samples`` (``value`` their mean): one yᵀÃy per probe
    (Hutchinson), or tr(QᵀÃQ) + gᵀ(I − QQᵀ)Ã(I − QQᵀ)g per residual probe (Hutch++)."""

    value: float
    stderr: float
    samples: list = field(default_factory=list)


@dataclass
class Eigenvalues:
    """Top eigenvalues (descending) with residual bounds (``errors``; Lanczos) and the matvecs spent."""

    values: list
    errors: list
    matvecs: int


def _probe(n, kind, generator, dtype, device):
    if kind == "rademacher":
        return (torch.randint(0, 2, (n,), generator=generator).to(dtype) * 2 - 1).to(device)
    if kind == "gaussian":
        return torch.randn(n, generator=generator, dtype=dtype).to(device)
    raise ValueError(f"unknown probe distribution {kind!r}; choose one of {PROBES}")


def hutchinson_trace(op, probes: int = 16, *, distribution: str = "rademacher", generator=None,
                     progress=None) -> TraceEstimate:
    """tr ≈ mean of yᵀ (op.matvec_flat y) over ``probes`` probes (see the module doc); ``progress``: a
    callable invoked after each probe (e.g. a tqdm bar's ``update``)."""
    if isinstance(probes, bool) or not isinstance(probes, int) or probes < 1:
        raise ValueError(f"probes must be a positive integer, got {probes!r}")
    generator = generator or torch.Generator().manual_seed(0)
    device = _device(op)
    samples = []
    for _ in range(probes):
        y = _probe(op.dim, distribution, generator, op.dtype, device)
        samples.append(float(torch.dot(y, op.matvec_flat(y))))
        if progress is not None:
            progress()
    return _estimate(samples)


def _estimate(samples) -> TraceEstimate:
    m = len(samples)
    mean = sum(samples) / m
    sd = math.sqrt(sum((s - mean) ** 2 for s in samples) / (m - 1)) if m > 1 else float("nan")
    return TraceEstimate(mean, sd / math.sqrt(m), samples)


def check_trace_method(method: str, probes) -> None:
    """``method`` one of :data:`TRACE_METHODS`; for Hutch++ ``probes`` 0 (no trace) or at least 3 matvecs."""
    if method not in TRACE_METHODS:
        raise ValueError(f"unknown trace method {method!r}; choose one of {TRACE_METHODS}")
    if method == "hutch++" and probes != 0:
        _check_hutchpp_matvecs(probes)


def _check_hutchpp_matvecs(matvecs) -> None:
    if isinstance(matvecs, bool) or not isinstance(matvecs, int) or matvecs < 3:
        raise ValueError(f"Hutch++ (--trace-method hutch++) needs at least 3 matvecs (Hessian-vector products: a "
                         f"sketch, its trace and a residual probe), got {matvecs!r}: raise probes (--probes) or use "
                         f"the Hutchinson trace (--trace-method hutchinson)")


def hutchpp_trace(op, matvecs: int = 16, *, distribution: str = "rademacher", generator=None,
                  progress=None) -> TraceEstimate:
    """Hutch++ with ``matvecs`` (≥ 3) operator applications (see the module doc): k = ⌊matvecs/3⌋ (at most
    N) sketch probes, k more for tr(QᵀÃQ), the rest residual probes. ``samples`` are
    tr(QᵀÃQ) + gᵢᵀ(I − QQᵀ)Ã(I − QQᵀ)gᵢ, one per residual probe; ``stderr`` their s/√r, conditional on the
    sketch. ``progress``: a callable invoked after each matvec."""
    _check_hutchpp_matvecs(matvecs)
    generator = generator or torch.Generator().manual_seed(0)
    device = _device(op)
    k = min(matvecs // 3, op.dim)
    Y = torch.empty(op.dim, k, dtype=op.dtype, device=device)
    for j in range(k):
        Y[:, j] = op.matvec_flat(_probe(op.dim, distribution, generator, op.dtype, device))
        if progress is not None:
            progress()
    Q = torch.linalg.qr(Y).Q.T.contiguous()  # k × N, orthonormal rows spanning range(Ã S)
    del Y
    top = 0.0
    for q in Q:
        top += float(torch.dot(q, op.matvec_flat(q)))
        if progress is not None:
            progress()
    samples = []
    for _ in range(matvecs - 2 * k):
        g = _probe(op.dim, distribution, generator, op.dtype, device)
        g -= Q.T @ (Q @ g)  # (I − QQᵀ) g
        samples.append(top + float(torch.dot(g, op.matvec_flat(g))))
        if progress is not None:
            progress()
    return _estimate(samples)


def _device(op):
    base = op.space.base if isinstance(op, QuotientHessian) else op.base
    return next(iter(base.values())).device


def exact_trace(op) -> float:
    """Σᵢ eᵢᵀ Ã eᵢ: N matvecs (tiny models and tests only)."""
    total, eye = 0.0, torch.zeros(op.dim, dtype=op.dtype, device=_device(op))
    for i in range(op.dim):
        eye[i] = 1.0
        total += float(op.matvec_flat(eye)[i])
        eye[i] = 0.0
    return total


def top_eigenvalues(op, k: int = 1, *, steps: Optional[int] = None, method: str = "lanczos", generator=None,
                    progress=None) -> Eigenvalues:
    """The k largest (algebraic) eigenvalues of the operator (see the module doc)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    k = min(k, op.dim)
    if method == "scipy":
        from scipy.sparse.linalg import eigsh
        lin = op.as_linear_operator()
        calls = [0]

        def counted(y):
            calls[0] += 1
            if progress is not None:
                progress()
            return lin.matvec(y)

        from scipy.sparse.linalg import LinearOperator
        vals = eigsh(LinearOperator(lin.shape, matvec=counted, dtype=lin.dtype), k=k, which="LA",
                     return_eigenvectors=False, tol=1e-10)
        return Eigenvalues(sorted(map(float, vals), reverse=True), [float("nan")] * k, calls[0])
    if method != "lanczos":
        raise ValueError(f"unknown method {method!r}; choose 'lanczos' or 'scipy'")
    m = min(op.dim, steps if steps is not None else max(2 * k + 10, 20))
    generator = generator or torch.Generator().manual_seed(0)
    device = _device(op)
    Q = torch.empty(m, op.dim, dtype=op.dtype, device=device)  # the Krylov basis, m·N numbers
    q = torch.randn(op.dim, generator=generator, dtype=op.dtype).to(device)
    Q[0] = q / q.norm()
    alphas, betas = [], []
    for j in range(m):
        w = op.matvec_flat(Q[j])
        if progress is not None:
            progress()
        alphas.append(float(torch.dot(Q[j], w)))
        basis = Q[:j + 1]
        for _ in range(2):  # full reorthogonalisation, twice (Kahan-Parlett "twice is enough")
            w -= basis.T @ (basis @ w)
        b = float(w.norm())
        betas.append(b)
        if j == m - 1 or b <= 1e-10 * max(1.0, max(abs(x) for x in alphas)):
            break
        torch.div(w, b, out=Q[j + 1])
    n = len(alphas)
    T = torch.diag(torch.tensor(alphas, dtype=torch.float64))
    if n > 1:
        off = torch.tensor(betas[:n - 1], dtype=torch.float64)
        T = T + torch.diag(off, 1) + torch.diag(off, -1)
    vals, vecs = torch.linalg.eigh(T)
    order = torch.argsort(vals, descending=True)[:k]
    errors = [abs(betas[n - 1] * float(vecs[-1, i])) for i in order]
    return Eigenvalues([float(vals[i]) for i in order], errors, n)


@dataclass
class CurvatureResult:
    """Trace and top eigenvalues of one Hessian of a model's mean loss over the batches."""

    geometry: str
    trace: float
    trace_stderr: float
    eigenvalues: list
    eigenvalue_errors: list
    probes: int
    dim: int
    matvecs: int
    seconds: float
    config: dict = field(default_factory=dict)

    def to_dict(self):
        return asdict(self)


def _hessian(setup: EvaluationSpace, batches, metric, loss_fn, hvp: str, length_buckets):
    """The Hessian of the mean loss over ``batches`` (prepared, on the setup's model) in the setup's space
    (``metric`` None: the Euclidean one on the parameters the adaptive space perturbs)."""
    model, params = setup.model, setup.params
    losses = [lambda p, b=b: model_loss(model, p, b, loss_fn)
              for b in bucket_batches(model, params, batches, length_buckets, loss_fn)]
    if metric is None:
        return EuclideanHessian(params, losses, setup.space.adaptive_names, hvp=hvp)
    return QuotientHessian(setup.space, losses, hvp=hvp)


def _curvature_setup(model, batches, geometry, *, symmetries, smap, eps, dtype, exclude):
    """``(setup, metric)``: the evaluation space of ``geometry`` (:func:`evaluation_space`, silent where the model
    has no attention pairs), its model in eval mode."""
    if geometry not in GEOMETRIES:
        raise ValueError(f"unknown geometry {geometry!r}; choose one of {GEOMETRIES}")
    metric = None if geometry == "euclidean" else geometry
    setup = evaluation_space(model, batches, metric, dtype=dtype, smap=smap, symmetries=symmetries, warn=False,
                             eps=eps, exclude=tuple(exclude))
    setup.model.eval()
    return setup, metric


def hessian_operator(model, batches, geometry: str = "mix", *, symmetries=None, smap=None, loss_fn=default_loss,
                     eps: float = 0.0, dtype=None, exclude=(), hvp: str = "auto", length_buckets=None):
    """``(operator, model, params)``: the quotient Hessian (``geometry`` inv/mix; attention pairs of ``smap``,
    default detected, plus ``symmetries``) or the Euclidean one (``"euclidean"``, on the parameters the
    adaptive space perturbs) of the mean loss over ``batches``; the model in eval mode (a float copy when
    ``dtype`` differs). ``length_buckets`` K: padded text batches in K groups of similar length
    (:func:`~geosharp_ref.sharpness.pipeline.bucket_batches`)."""
    setup, metric = _curvature_setup(model, batches, geometry, symmetries=symmetries, smap=smap, eps=eps,
                                     dtype=dtype, exclude=exclude)
    return _hessian(setup, setup.batches, metric, loss_fn, hvp, length_buckets), setup.model, setup.params


def _estimates(op, k, probes, distribution, steps, seed, progress, trace_method):
    """``(trace, eigenvalues)`` of ``op``: ``probes`` matvecs of ``trace_method`` and ``k`` Lanczos
    eigenvalues (``steps``), from one generator seeded ``seed``; ``probes=0`` or ``k=0`` skips one."""
    estimate = hutchpp_trace if trace_method == "hutch++" else hutchinson_trace
    gen = torch.Generator().manual_seed(seed)
    trace = estimate(op, probes, distribution=distribution, generator=gen, progress=progress) \
        if probes else TraceEstimate(float("nan"), float("nan"))
    eig = top_eigenvalues(op, k, steps=steps, generator=gen, progress=progress) if k else Eigenvalues([], [], 0)
    return trace, eig


def curvature(model, batches, geometry: str = "mix", *, k: int = 1, probes: int = 16,
              distribution: str = "rademacher", steps: Optional[int] = None, seed: int = 0, symmetries=None,
              smap=None, loss_fn=default_loss, eps: float = 0.0, dtype=None, exclude=(), hvp: str = "auto",
              progress=None, length_buckets=None, trace_method: str = "hutchinson") -> CurvatureResult:
    """The trace (``probes`` matvecs; ``trace_method`` :data:`TRACE_METHODS`: Hutchinson, or Hutch++ with
    ``probes`` ≥ 3) and the ``k`` top eigenvalues (Lanczos, ``steps``) of the Hessian of the mean loss over
    ``batches`` in ``geometry`` (:data:`GEOMETRIES`); ``probes=0`` or ``k=0`` skips one. ``progress``: called
    after every matvec; ``length_buckets``: as in :func:`hessian_operator`."""
    check_length_buckets(length_buckets)
    check_trace_method(trace_method, probes)
    t0 = time.perf_counter()
    was_training = model.training
    try:
        op, _, _ = hessian_operator(model, batches, geometry, symmetries=symmetries, smap=smap, loss_fn=loss_fn,
                                    eps=eps, dtype=dtype, exclude=exclude, hvp=hvp, length_buckets=length_buckets)
        trace, eig = _estimates(op, k, probes, distribution, steps, seed, progress, trace_method)
    finally:
        model.train(was_training)
    config = dict(trace_method=trace_method, distribution=distribution, seed=seed, eps=eps, hvp=op.hvp.mode,
                  dtype=str(op.dtype), lanczos_steps=eig.matvecs)
    if isinstance(op, QuotientHessian):
        config["factors"] = op.space.factor_keys
    return CurvatureResult(geometry, trace.value, trace.stderr, eig.values, eig.errors, probes, op.dim,
                           op.hvp.calls, time.perf_counter() - t0, config)


def curvature_sharpness(model, batches, rho, *, quantity: str, geometry: str, probes: int = 16, steps=None,
                        symmetry_map=None, symmetries=None, loss_fn=default_loss, seed: int = 0, eps: float = 0.0,
                        dtype=None, exclude=(), measure: Optional[str] = None, progress: bool = False,
                        length_buckets=None, trace_method: str = "hutchinson", **_ignored) -> SharpnessResult:
    """A curvature quantity per batch as a :class:`SharpnessResult` (what the named measures return):
    ``quantity`` "trace" (``probes`` matvecs by ``trace_method``, :data:`TRACE_METHODS`; the standard errors in
    ``config``) or "top-eigenvalue" (Lanczos, ``steps``); ``mean`` over the batches (the trace of the mean loss's
    Hessian; for eigenvalues the mean of the per-batch top eigenvalues). One space for every batch, resolved on the
    first (as the Auto-PGD measures do); batch ``i`` draws its probes from ``seed + i``. ``rho`` is recorded only;
    ``loss_before`` is the loss at θ in the evaluation ``dtype``, ``loss_after`` equals it and the perturbation
    fields are empty (no perturbation is made). Options of the Auto-PGD measures are ignored."""
    if quantity not in ("trace", "top-eigenvalue"):
        raise ValueError(f"unknown curvature quantity {quantity!r}; choose 'trace' or 'top-eigenvalue'")
    trace = quantity == "trace"
    check_length_buckets(length_buckets)
    check_trace_method(trace_method if trace else "hutchinson", probes if trace else 0)
    t0 = time.perf_counter()
    per, errors, before = [], [], []
    was_training = model.training
    try:  # one space for every batch, on the first (as the Auto-PGD measures); one operator per batch
        setup, metric = _curvature_setup(model, batches, geometry, symmetries=symmetries, smap=symmetry_map,
                                         eps=eps, dtype=dtype, exclude=exclude)
        for i, b in enumerate(setup.batches):
            op = _hessian(setup, [b], metric, loss_fn, "auto", length_buckets)
            t, eig = _estimates(op, 0 if trace else 1, probes if trace else 0, "rademacher", steps, seed + i, None,
                                trace_method if trace else "hutchinson")
            per.append(t.value if trace else eig.values[0])
            errors.append(t.stderr if trace else eig.errors[0])
            with torch.no_grad():  # the loss at θ, in the evaluation dtype
                before.append(float(model_loss(setup.model, setup.params, b, loss_fn)))
    finally:
        model.train(was_training)
    name = measure or f"hessian-{quantity}-{geometry}"
    return SharpnessResult(measure=name, rho=float(rho), mean=sum(per) / len(per), per_batch=per,
                           loss_before=before, loss_after=list(before), perturbation_norms=[],
                           seconds=time.perf_counter() - t0,
                           config=dict(quantity=quantity, geometry=geometry, probes=probes, errors=errors, eps=eps,
                                       **({"steps": steps} if quantity != "trace" else {"trace_method": trace_method})))
