"""Fit L = E + A/N^alpha + B/D^beta to a user's runs, robustly, with bootstrap intervals.

The estimator is Hoffmann et al.'s approach 3 as Besiroglu et al. 2024 (arXiv 2404.10102,
section 2) redid it: in the parametrisation A = e^a, B = e^b, E = e^e, minimise

    sum_i Huber_delta( LSE(a - alpha log N_i, b - beta log D_i, e) - log L_i ),   delta = 1e-3,

with L-BFGS. LSE is log-sum-exp, so the residual is log(predicted loss) - log(loss).

NOTE [ summed, not averaged ]
Hoffmann et al. averaged the Huber terms. With delta = 1e-3 the objective is then ~1e-6 and its
gradient tiny, so L-BFGS's tolerance stops it long before the optimum; Epoch traced the paper's
odd constants to this. Summing keeps the scale at ~1e-3 (and tolerances are tight anyway).

NOTE [ the global search ]
The objective has local minima (on Epoch's data single L-BFGS starts stop near A = 1000, B = 500
or A = 1, B = 1, fits 1.2-20x worse; which start falls in depends on the installed scipy and numpy). Two global
searches:
- `method="grid"`: Epoch's full initialisation grid, alpha, beta in {0, 0.5, ..., 2},
  e in {-1, -0.5, ..., 1}, a, b in {0, 5, ..., 25} (4500 L-BFGS starts), the best result kept.
- `method="varpro"` (default, ~100x faster): variable projection. For fixed (alpha, beta) the model
  is linear in (E, A, B); on a 40 x 40 grid of (alpha, beta) we solve for them by iteratively
  reweighted least squares on the relative residual (a first-order stand-in for the log residual,
  with Huber weights), score every cell with the exact objective, and refine the best few cells
  with L-BFGS on the exact objective. Both reach the same optimum on Epoch's data (tests).

Bootstrap intervals resample the runs with replacement (seeded); each resample is refitted from
the full-data optimum and from the best cell of a coarse (alpha, beta) grid, whichever ends lower.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from memplan.planner.scaling.errors import ScalingError, check_fraction, check_positive
from memplan.planner.scaling.laws import FLOPS_PER_PARAM_TOKEN, Law, parametric_law
from memplan.planner.scaling.runs import Runs, load_runs
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["FitResult", "FitPrediction", "fit_law", "HUBER_DELTA", "EXTRAPOLATION_LIMIT"]

log = logging.getLogger(__name__)

HUBER_DELTA = 1e-3  # Hoffmann et al. 2022, section D.2; Besiroglu et al. 2024
EXTRAPOLATION_LIMIT = 100.0  # warn when a query's compute is this far outside the fitted range
COEFFS = ("E", "A", "B", "alpha", "beta")

Progress = Callable[[int, int], None]


class FitPrediction(BaseModel):
    """The fitted law's compute-optimal answer at one compute, with bootstrap intervals."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    flops: float
    params: float
    tokens: float
    loss: float
    tokens_per_param: float
    params_interval: tuple[float, float] | None = None
    tokens_interval: tuple[float, float] | None = None
    loss_interval: tuple[float, float] | None = None
    extrapolation: float = Field(
        description="how far outside the fitted compute range: flops / max (or min / flops), >= 1"
    )
    warnings: list[str] = Field(default_factory=list)


class FitResult(BaseModel):
    """Fitted coefficients of L = E + A/N^alpha + B/D^beta and their bootstrap intervals."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    E: float
    A: float
    B: float
    alpha: float
    beta: float
    intervals: dict[str, tuple[float, float]] = Field(
        default_factory=dict,
        description="percentile bootstrap interval of each coefficient (and params_exponent)",
    )
    confidence: float = 0.95
    n_runs: int
    n_bootstrap: int = 0
    seed: int | None = None
    method: str
    huber_delta: float = HUBER_DELTA
    objective: float = Field(description="the summed Huber loss at the optimum")
    alpha_equals_beta: bool = False
    fixed_E: float | None = None
    flops_range: tuple[float, float] = Field(description="least and largest 6 N D of the runs")
    params_exponent: float = Field(description="beta/(alpha+beta): N_opt grows as C to this power")
    predictions: list[FitPrediction] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)

    def law(self, name: str = "fit") -> Law:
        """The fitted law, usable wherever a law name is (queries, memory-aware sizing)."""
        return parametric_law(name, E=self.E, A=self.A, B=self.B, alpha=self.alpha,
                              beta=self.beta, source=f"fit to {self.n_runs} runs ({self.method})")


# --- the objective --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Spec:
    """Which of (a, b, e, alpha, beta) are free: e is fixed when E is, beta is alpha when tied."""

    tied: bool
    log_e: float | None  # fixed log E, or None

    @property
    def n_free(self) -> int:
        return 5 - self.tied - (self.log_e is not None)

    def full(self, x: np.ndarray) -> tuple[float, float, float, float, float]:
        a, b = x[0], x[1]
        k = 2
        if self.log_e is None:
            e, k = x[2], 3
        else:
            e = self.log_e
        al = x[k]
        be = al if self.tied else x[k + 1]
        return a, b, e, al, be

    def free(self, a: float, b: float, e: float, al: float, be: float) -> np.ndarray:
        out = [a, b] + ([e] if self.log_e is None else []) + [al] + ([] if self.tied else [be])
        return np.array(out, dtype=np.float64)


@dataclass(frozen=True)
class _Data:
    lN: np.ndarray
    lD: np.ndarray
    lL: np.ndarray
    N: np.ndarray
    D: np.ndarray
    L: np.ndarray

    @classmethod
    def of(cls, runs: Runs) -> _Data:
        return cls(np.log(runs.params), np.log(runs.tokens), np.log(runs.loss),
                   runs.params, runs.tokens, runs.loss)


def _objective(x: np.ndarray, d: _Data, w: np.ndarray | None, spec: _Spec,
               delta: float = HUBER_DELTA) -> tuple[float, np.ndarray]:
    """Summed Huber loss of the log residuals and its gradient in the free parameters."""
    a, b, e, al, be = spec.full(x)
    t0 = a - al * d.lN
    t1 = b - be * d.lD
    m = np.maximum(np.maximum(t0, t1), e)
    p0, p1, p2 = np.exp(t0 - m), np.exp(t1 - m), np.exp(e - m)
    s = p0 + p1 + p2
    r = m + np.log(s) - d.lL
    ar = np.abs(r)
    hub = np.where(ar <= delta, 0.5 * r * r, delta * (ar - 0.5 * delta))
    dh = np.clip(r, -delta, delta) / s
    if w is not None:
        hub = hub * w
        dh = dh * w
    q0, q1 = dh * p0, dh * p1
    g0, g1 = float(q0.sum()), float(q1.sum())
    g_al, g_be = -float((q0 * d.lN).sum()), -float((q1 * d.lD).sum())
    grad = [g0, g1]
    if spec.log_e is None:
        grad.append(float((dh * p2).sum()))
    grad.extend([g_al + g_be] if spec.tied else [g_al, g_be])
    return float(hub.sum()), np.array(grad)


_TOLERANCES = {
    # point estimates and resamples alike: the valley along (A, alpha) is flat, and gtol 1e-9
    # already moves Epoch's bootstrap interval endpoints by ~0.5%
    "tight": {"maxiter": 2000, "ftol": 1e-13, "gtol": 1e-11},
    "loose": {},  # scipy's defaults: screening many starts
}


def _refine(x0: np.ndarray, d: _Data, w: np.ndarray | None, spec: _Spec, *, tight: bool = True,
            tol: str | None = None):
    from scipy.optimize import minimize

    opts = _TOLERANCES[tol or ("tight" if tight else "loose")]
    with np.errstate(over="ignore", invalid="ignore"):
        res = minimize(_objective, x0, args=(d, w, spec), jac=True, method="L-BFGS-B", options=opts)
    fun = float(res.fun) if np.isfinite(res.fun) else math.inf
    return fun, np.asarray(res.x, dtype=np.float64)


# --- variable projection --------------------------------------------------------------------------


def _design(d: _Data, spec: _Spec, alphas: np.ndarray, betas: np.ndarray):
    """The linear problem of variable projection for each (alpha, beta) cell of the grid
    alphas x betas (alphas alone when alpha = beta): with X = N^-alpha and Y = D^-beta, the
    relative residual of L = E + A X + B Y is Z c - target, c = (E, A, B) (or (A, B) for a fixed E).
    Returns (al [K], be [K], X [K, n], Y [K, n], Z [K, n, p], column scales [K, p], target [n],
    fixed E or None)."""
    if spec.tied:
        al = be = alphas
    else:
        al, be = (g.ravel() for g in np.meshgrid(alphas, betas, indexing="ij"))
    X = np.exp(-al[:, None] * d.lN[None, :])  # [K, n] N^-alpha
    Y = np.exp(-be[:, None] * d.lD[None, :])  # [K, n] D^-beta
    K, n = X.shape
    invL = 1.0 / d.L
    fixed_E = None if spec.log_e is None else math.exp(spec.log_e)
    cols = [X * invL, Y * invL]
    if fixed_E is None:
        cols.insert(0, np.broadcast_to(invL, (K, n)))
        target = np.ones(n)
    else:
        target = 1.0 - fixed_E * invL
    Z = np.stack(cols, axis=2)  # [K, n, p]
    scale = np.sqrt((Z * Z).mean(axis=1)) + 1e-300  # [K, p] column scales, for conditioning
    return al, be, X, Y, Z, scale, target, fixed_E


def _varpro_cells(d: _Data, w: np.ndarray | None, spec: _Spec, alphas: np.ndarray,
                  betas: np.ndarray, *, irls: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """For each (alpha, beta) cell: (E, A, B) by Huber-IRLS on relative residuals, and the exact
    objective there. Returns (cells [K, 5] as (a, b, e, alpha, beta), objectives [K])."""
    al, be, X, Y, Z, scale, target, fixed_E = _design(d, spec, alphas, betas)
    K, n = X.shape
    Zs = Z / scale[:, None, :]
    ZsT = Zs.transpose(0, 2, 1)  # [K, p, n]
    base_w = np.ones(n) if w is None else w
    hw = np.broadcast_to(base_w, (K, n))
    p = Zs.shape[2]
    ridge = 1e-12 * np.eye(p)
    coef = np.zeros((K, p))
    for _ in range(irls):
        ZwT = ZsT * hw[:, None, :]
        M = np.einsum("kpn,knq->kpq", ZwT, Zs) + ridge
        v = np.einsum("kpn,n->kp", ZwT, target)
        coef = np.linalg.solve(M, v[..., None])[..., 0]
        r = np.einsum("knp,kp->kn", Zs, coef) - target
        hw = base_w * np.minimum(1.0, HUBER_DELTA / np.maximum(np.abs(r), 1e-300))
    coef = np.maximum(coef / scale, 1e-12)  # negative coefficients: clamp, the score rejects them
    if fixed_E is None:
        E, A, B = coef[:, 0], coef[:, 1], coef[:, 2]
    else:
        E, A, B = np.full(K, fixed_E), coef[:, 0], coef[:, 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.log(E[:, None] + A[:, None] * X + B[:, None] * Y) - d.lL[None, :]
        ar = np.abs(r)
        hub = np.where(ar <= HUBER_DELTA, 0.5 * r * r, HUBER_DELTA * (ar - 0.5 * HUBER_DELTA))
        score = hub @ base_w
    score = np.where(np.isfinite(score), score, np.inf)
    return np.stack([np.log(A), np.log(B), np.log(E), al, be], axis=1), score


_FINE = np.linspace(0.02, 2.0, 40)
_COARSE = np.linspace(0.05, 1.5, 10)


def _fit_varpro(d: _Data, w: np.ndarray | None, spec: _Spec, *, grid: np.ndarray = _FINE,
                top: int = 6, extra_starts: Sequence[np.ndarray] = ()) -> tuple[float, np.ndarray]:
    cells, score = _varpro_cells(d, w, spec, grid, grid)
    order = np.argsort(score)[:top]
    starts = [spec.free(*cells[k]) for k in order]
    best = (math.inf, starts[0])
    for x0 in starts + list(extra_starts):
        fun, x = _refine(x0, d, w, spec)
        if fun < best[0]:
            best = (fun, x)
    return best


def _grid_starts(spec: _Spec) -> list[np.ndarray]:
    """Epoch's initialisation grid (Besiroglu et al. 2024, section 2), restricted to free params."""
    exps = np.arange(0.0, 2.01, 0.5)
    es = np.arange(-1.0, 1.01, 0.5) if spec.log_e is None else [spec.log_e]
    ab = np.arange(0.0, 25.01, 5.0)
    starts = []
    for al, be, e, a, b in itertools.product(exps, [None] if spec.tied else exps, es, ab, ab):
        starts.append(spec.free(a, b, e, al, al if be is None else be))
    return starts


def _fit_grid(d: _Data, w: np.ndarray | None, spec: _Spec,
              progress: Progress | None = None) -> tuple[float, np.ndarray]:
    best = (math.inf, np.zeros(spec.n_free))
    starts = _grid_starts(spec)
    for k, x0 in enumerate(starts):
        fun, x = _refine(x0, d, w, spec, tight=False)
        if fun < best[0]:
            best = (fun, x)
        if progress:
            progress(k + 1, len(starts))
    fun, x = _refine(best[1], d, w, spec)  # polish the winner with tight tolerances
    return (fun, x) if fun <= best[0] else best


# --- the public function --------------------------------------------------------------------------


def _coeffs(spec: _Spec, x: np.ndarray) -> dict[str, float]:
    a, b, e, al, be = spec.full(x)
    return {"E": math.exp(e), "A": math.exp(a), "B": math.exp(b), "alpha": float(al),
            "beta": float(be)}


def _optimum(c: dict[str, float], flops: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    al, be = c["alpha"], c["beta"]
    G = (al * c["A"] / (be * c["B"])) ** (1.0 / (al + be))
    N = G * (flops / FLOPS_PER_PARAM_TOKEN) ** (be / (al + be))
    D = flops / (FLOPS_PER_PARAM_TOKEN * N)
    L = c["E"] + c["A"] * N ** -al + c["B"] * D ** -be
    return N, D, L


def _one_blas_thread():
    """A context that keeps BLAS to one thread (threadpoolctl), else a no-op.

    NOTE [ one BLAS thread ]
    The fit is thousands of L-BFGS runs on 5 parameters and a few hundred points: vectors far too
    small to share between threads. scipy's L-BFGS-B calls OpenBLAS, whose threads spin-wait; on
    a busy 2-core machine that made 1000 bootstraps 10x slower in wall time (and 13x in CPU time)
    than with one thread."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency
        import contextlib

        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def fit_law(
    runs: Runs | str | object,
    *,
    method: str = "varpro",
    alpha_equals_beta: bool = False,
    fixed_E: float | None = None,
    bootstrap: int = 0,
    seed: int = 0,
    confidence: float = 0.95,
    flops: Sequence[float] | float | None = None,
    init: dict[str, float] | None = None,
    progress: Progress | None = None,
) -> FitResult:
    """Fit E, A, B, alpha, beta to `runs` (a `Runs`, a path, JSON text or rows; see `load_runs`).

    `method`: "varpro" (default), "grid" (Epoch's 4500 starts) or "local" (one L-BFGS run from
    `init`, by default all-zero logs and exponents: for comparison only, it finds local minima).
    `bootstrap` resamples (seeded by `seed`) give `confidence` percentile intervals for every
    coefficient and for N_opt, D_opt and the loss at each of `flops` (FLOPs), which also get a
    warning when more than 100x outside the fitted compute range. `progress(done, total)` is called
    during long loops. Raises `ScalingError` on bad input (naming the field).
    """
    with _one_blas_thread():
        return _fit_law(runs, method=method, alpha_equals_beta=alpha_equals_beta, fixed_E=fixed_E,
                        bootstrap=bootstrap, seed=seed, confidence=confidence, flops=flops,
                        init=init, progress=progress)


def _fit_law(runs, *, method, alpha_equals_beta, fixed_E, bootstrap, seed, confidence, flops,
             init, progress) -> FitResult:
    data = load_runs(runs)
    if method not in ("varpro", "grid", "local"):
        raise ScalingError(f"method: unknown {method!r}; choose varpro, grid or local")
    if isinstance(bootstrap, bool) or not isinstance(bootstrap, int) or bootstrap < 0:
        raise ScalingError(f"bootstrap: expected a whole number of resamples >= 0, got {bootstrap!r}")
    conf = check_fraction("confidence", confidence)
    log_e = None if fixed_E is None else math.log(check_positive("fixed_E", fixed_E))
    if log_e is not None and float(np.min(data.loss)) <= fixed_E:
        raise ScalingError(f"fixed_E: {fixed_E:g} is not below every run's loss (least "
                           f"{float(np.min(data.loss)):g}); E is the loss no model goes under")
    spec = _Spec(tied=bool(alpha_equals_beta), log_e=log_e)
    if data.n < spec.n_free:
        raise ScalingError(
            f"runs: {data.n} run(s) cannot determine {spec.n_free} coefficients; give at least "
            f"{spec.n_free} runs (more, spread over sizes and token counts, for a useful fit)"
        )
    queries = np.atleast_1d(np.asarray([] if flops is None else flops, dtype=np.float64))
    for q in queries:
        check_positive("flops", q)
    d = _Data.of(data)

    if method == "varpro":
        fun, x = _fit_varpro(d, None, spec)
    elif method == "grid":
        fun, x = _fit_grid(d, None, spec, progress)
    else:
        start = {"E": 1.0, "A": 1.0, "B": 1.0, "alpha": 0.0, "beta": 0.0} | (init or {})
        x0 = spec.free(math.log(start["A"]), math.log(start["B"]), math.log(start["E"]),
                       start["alpha"], start["beta"])
        from scipy.optimize import minimize

        res = minimize(lambda z: _objective(z, d, None, spec)[0], x0, method="L-BFGS-B")
        fun, x = float(res.fun), np.asarray(res.x)
    coeffs = _coeffs(spec, x)
    warnings: list[str] = []
    for k in ("alpha", "beta"):
        if not 0.0 < coeffs[k] < 5.0:
            warnings.append(f"{k} = {coeffs[k]:.4g} is implausible; the runs may not constrain it")
    if data.n < 3 * spec.n_free:
        warnings.append(f"only {data.n} runs for {spec.n_free} coefficients: expect wide intervals")

    intervals: dict[str, tuple[float, float]] = {}
    boot_pred: np.ndarray | None = None
    if bootstrap:
        boots = _bootstrap(d, spec, x, bootstrap, seed, progress)
        lo, hi = 50 * (1 - conf), 50 * (1 + conf)
        names = (*COEFFS, "params_exponent")
        table = np.array([[c[k] for k in COEFFS] + [c["beta"] / (c["alpha"] + c["beta"])]
                          for c in boots])
        for j, k in enumerate(names):
            intervals[k] = (float(np.percentile(table[:, j], lo)), float(np.percentile(table[:, j], hi)))
        if queries.size:
            boot_pred = np.stack([np.stack(_optimum(c, queries)) for c in boots])  # [b, 3, q]

    fmin, fmax = float(data.flops.min()), float(data.flops.max())
    N, D, L = _optimum(coeffs, queries)
    preds = []
    for j, C in enumerate(queries):
        extrap = max(C / fmax, fmin / C, 1.0)
        warn = []
        if extrap > EXTRAPOLATION_LIMIT:
            warn.append(
                f"{C:.3g} FLOPs is {extrap:.3g}x outside the fitted range {fmin:.3g}..{fmax:.3g} "
                f"FLOPs (over {EXTRAPOLATION_LIMIT:g}x): an extrapolation, trust it accordingly"
            )
        iv = {}
        if boot_pred is not None:
            for i, k in enumerate(("params", "tokens", "loss")):
                col = boot_pred[:, i, j]
                iv[f"{k}_interval"] = (float(np.percentile(col, 50 * (1 - conf))),
                                       float(np.percentile(col, 50 * (1 + conf))))
        preds.append(FitPrediction(flops=float(C), params=float(N[j]), tokens=float(D[j]),
                                   loss=float(L[j]), tokens_per_param=float(D[j] / N[j]),
                                   extrapolation=float(extrap), warnings=warn, **iv))
        warnings.extend(warn)
    return FitResult(
        **coeffs, intervals=intervals, confidence=conf, n_runs=data.n, n_bootstrap=bootstrap,
        seed=seed if bootstrap else None, method=method, objective=fun,
        alpha_equals_beta=spec.tied, fixed_E=fixed_E, flops_range=(fmin, fmax),
        params_exponent=coeffs["beta"] / (coeffs["alpha"] + coeffs["beta"]),
        predictions=preds, warnings=warnings,
    )


def _coarse_starts(d: _Data, W: np.ndarray, spec: _Spec, grid: np.ndarray = _COARSE,
                   irls: int = 2) -> np.ndarray:
    """The best variable-projection cell of a coarse (alpha, beta) grid for each row of weights
    `W` [b, n], batched over rows with matrix products. Returns free vectors [b, n_free]."""
    al, be, X, Y, raw, sc, target, fixed_E = _design(d, spec, grid, grid)
    K, n = X.shape
    Z = raw / sc[:, None, :]  # [K, n, p], columns scaled for conditioning
    p = Z.shape[2]
    ZZ = (Z[:, :, :, None] * Z[:, :, None, :]).reshape(K, n, p * p)  # [K, n, p*p]
    Zt = Z * target[None, :, None]  # [K, n, p]
    hw = np.broadcast_to(W[None, :, :], (K,) + W.shape)  # [K, b, n]
    for _ in range(irls):
        M = (hw @ ZZ).reshape(K, -1, p, p) + 1e-12 * np.eye(p)  # [K, b, p, p]
        v = hw @ Zt  # [K, b, p]
        coef = np.linalg.solve(M, v[..., None])[..., 0]  # [K, b, p]
        r = Z @ coef.transpose(0, 2, 1) - target[None, :, None]  # [K, n, b]
        hw = W[None] * np.minimum(1.0, HUBER_DELTA / np.maximum(np.abs(r), 1e-300)).transpose(0, 2, 1)
    # undo the column scaling to get (E, A, B), then score each cell exactly in log space
    coef = np.maximum(coef / sc[:, None, :], 1e-12)  # [K, b, p]
    if fixed_E is None:
        E, A, B = coef[..., 0], coef[..., 1], coef[..., 2]
    else:
        E, A, B = np.full(coef.shape[:2], fixed_E), coef[..., 0], coef[..., 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.log(E[..., None] + A[..., None] * X[:, None, :] + B[..., None] * Y[:, None, :])
        r -= d.lL
        ar = np.abs(r)
        hub = np.where(ar <= HUBER_DELTA, 0.5 * r * r, HUBER_DELTA * (ar - 0.5 * HUBER_DELTA))
        score = np.einsum("kbn,bn->kb", hub, W)
    score = np.where(np.isfinite(score), score, np.inf)
    best = np.argmin(score, axis=0)  # [b]
    cols_b = np.arange(W.shape[0])
    return np.stack([spec.free(math.log(A[k, j]), math.log(B[k, j]), math.log(E[k, j]), al[k], be[k])
                     for j, k in zip(cols_b, best, strict=True)])


def _bootstrap(d: _Data, spec: _Spec, x_hat: np.ndarray, n_boot: int, seed: int,
               progress: Progress | None, chunk: int = 100) -> list[dict[str, float]]:
    """Coefficients of `n_boot` refits on resamples with replacement (as multiplicity weights):
    each from the full-data optimum and from the resample's best coarse grid cell."""
    rng = np.random.default_rng(seed)
    n = d.L.size
    W = np.stack([np.bincount(rng.integers(0, n, n), minlength=n) for _ in range(n_boot)])
    W = W.astype(np.float64)
    out = []
    for lo in range(0, n_boot, chunk):
        starts = _coarse_starts(d, W[lo:lo + chunk], spec)
        for j, w in enumerate(W[lo:lo + chunk]):
            fun, x = _refine(x_hat, d, w, spec, tol="tight")
            fun2, x2 = _refine(starts[j], d, w, spec, tight=False)
            if fun2 < fun:
                fun2, x2 = _refine(x2, d, w, spec, tol="tight")
                if fun2 < fun:
                    x = x2
            out.append(_coeffs(spec, x))
            if progress:
                progress(len(out), n_boot)
    return out
