"""A picture of a fit: the runs' losses against compute, the fitted law along each run size, and the
compute-optimal frontier. matplotlib (Agg) is imported on call."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from memplan.planner.scaling.fit import FitResult
from memplan.planner.scaling.laws import FLOPS_PER_PARAM_TOKEN
from memplan.planner.scaling.runs import Runs

__all__ = ["plot_fit"]


def plot_fit(runs: Runs, fit: FitResult, path: str | Path, *, sizes: int = 6) -> Path:
    """Write a PNG (or any format matplotlib knows by extension) to `path`; returns the path.

    Left: loss against FLOPs, runs coloured by log N, with the fitted L(N, C/(6N)) for `sizes`
    model sizes and the compute-optimal frontier L_opt(C). Right: N_opt(C) with the bootstrap
    interval at each predicted compute."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    law = fit.law()
    C = runs.flops
    lo, hi = float(C.min()), float(C.max())
    for p in fit.predictions:
        lo, hi = min(lo, p.flops), max(hi, p.flops)
    grid = np.geomspace(lo / 2, hi * 2, 200)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 5))
    sc = ax.scatter(C, runs.loss, c=np.log10(runs.params), cmap="viridis", s=12, label="runs")
    fig.colorbar(sc, ax=ax, label="log10 parameters")
    cmap = plt.get_cmap("viridis")
    ln = np.log10(runs.params)
    for N in np.geomspace(runs.params.min(), runs.params.max(), sizes):
        frac = (np.log10(N) - ln.min()) / max(np.ptp(ln), 1e-12)
        ax.plot(grid, law.loss(N, grid / (FLOPS_PER_PARAM_TOKEN * N)), color=cmap(frac), lw=1)
    N_opt = law.optimal_params(grid)
    ax.plot(grid, law.loss(N_opt, grid / (FLOPS_PER_PARAM_TOKEN * N_opt)), "k--", lw=1.5,
            label="compute-optimal frontier")
    ax.set(xscale="log", xlabel="training FLOPs (6 N D)", ylabel="loss (nats per token)",
           title=f"L = {fit.E:.3g} + {fit.A:.4g}/N^{fit.alpha:.3g} + {fit.B:.4g}/D^{fit.beta:.3g}")
    lmin, lmax = float(runs.loss.min()), float(np.percentile(runs.loss, 98))
    ax.set_ylim(lmin - 0.1 * (lmax - lmin), lmax + 0.1 * (lmax - lmin))
    ax.legend()
    ax2.plot(grid, N_opt, "k-", lw=1.5, label="N_opt(C)")
    for p in fit.predictions:
        if p.params_interval:
            err = [[p.params - p.params_interval[0]], [p.params_interval[1] - p.params]]
            ax2.errorbar([p.flops], [p.params], yerr=err, fmt="o", capsize=4)
        else:
            ax2.plot([p.flops], [p.params], "o")
    ax2.axvspan(float(C.min()), float(C.max()), color="0.9", label="fitted compute range")
    ax2.set(xscale="log", yscale="log", xlabel="training FLOPs", ylabel="parameters",
            title=f"N_opt grows as C^{fit.params_exponent:.3f}")
    ax2.legend()
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
