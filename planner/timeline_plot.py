"""Draw a plan's memory timeline (`memplan.planner.timeline.PlanTimeline`) as a PNG: bytes over
the schedule's ops, each op's band coloured by its stage's role, the peak and the budget marked,
and a run's measured bytes over the prediction when the timeline has them."""

from __future__ import annotations

from pathlib import Path

from memplan.planner.timeline import PlanTimeline

__all__ = ["ROLE_COLOURS", "plot_timeline"]

# one colour per stage role (colour-blind-safe Okabe-Ito hues); the loss op is grey
ROLE_COLOURS = {"stored": "#0072B2", "checkpoint": "#009E73", "recomputed": "#D55E00", "loss": "#999999"}


def plot_timeline(timeline: PlanTimeline, path: str | Path) -> Path:
    """Draw `timeline` as a PNG at `path`. Returns the path written.

    The y axis is activation memory (bytes above fixed memory, shown in KiB, MiB or GiB); the x
    axis is the op index in the schedule. A path in a folder that does not exist: ValueError."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from memplan.planner.units import format_bytes

    path = Path(path)
    if not path.parent.is_dir():
        raise ValueError(f"path: the folder {str(path.parent)!r} does not exist; create it or write elsewhere")
    top = max([timeline.peak_bytes, timeline.budget_bytes or 0, *(timeline.measured_bytes or [])])
    scale, unit = (2**30, "GiB") if top >= 2**30 else (2**20, "MiB") if top >= 2**20 else (2**10, "KiB")
    roles = {s.stage: s.role for s in timeline.stages}
    n = len(timeline.ops)
    xs = list(range(n))
    ys = [b / scale for b in timeline.predicted_bytes]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for k, stage in enumerate(timeline.stage_of_op):
        role = roles.get(stage, "loss") if stage else "loss"
        ax.bar(k, ys[k], width=1.0, color=ROLE_COLOURS[role], alpha=0.35, lw=0)
    ax.step(xs, ys, where="mid", color="black", lw=1.2, label="predicted (replay)")
    if timeline.measured_bytes is not None:
        ax.step(xs, [b / scale for b in timeline.measured_bytes], where="mid", color="#CC79A7",
                lw=1.2, ls="--", label=f"measured ({timeline.measured_device or 'run'}), peak "
                f"{format_bytes(max(timeline.measured_bytes))}")
    if timeline.budget_bytes is not None:
        ax.axhline(timeline.budget_bytes / scale, color="#E69F00", lw=1, ls=":",
                   label=f"budget {format_bytes(timeline.budget_bytes)}")
    k = timeline.peak_op
    ax.plot([k], [ys[k]], "v", color="#D55E00", ms=9, zorder=5)
    ax.annotate(f"peak {format_bytes(timeline.peak_bytes)} at op {k} ({timeline.ops[k]})",
                (k, ys[k]), xytext=(0, 8), textcoords="offset points",
                ha="center" if 0.15 * n < k < 0.85 * n else ("left" if k <= 0.15 * n else "right"),
                fontsize=9)
    handles, _ = ax.get_legend_handles_labels()
    present = {roles.get(s, "loss") if s else "loss" for s in timeline.stage_of_op}
    handles += [Patch(color=c, alpha=0.35, label=f"op of a {r} stage" if r != "loss" else "loss")
                for r, c in ROLE_COLOURS.items() if r in present]
    ax.legend(handles=handles, fontsize=8, loc="upper left")
    ax.set_xlim(-0.5, n - 0.5)
    ax.set_ylim(0, top / scale * 1.15)
    ax.set_xlabel(f"op of the schedule ({n} ops)")
    ax.set_ylabel(f"activation memory ({unit}, above {format_bytes(timeline.fixed_bytes)} fixed)")
    ax.set_title(f"{timeline.profile_name}: {timeline.strategy} plan, {timeline.n_stages} stages, "
                 f"+{timeline.overhead:.1%} time")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
