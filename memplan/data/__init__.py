"""Data shipped inside memplan: Epoch AI's extraction of the Chinchilla runs.

`chinchilla_epoch_extracted.csv` holds the 245 (model size, training FLOP, loss) points that
Besiroglu, Erdil, Barnett and You extracted from Figure 4 of Hoffmann et al. 2022 ("Training
Compute-Optimal Large Language Models"), in "Chinchilla Scaling: A replication attempt" (Epoch AI,
2024, arXiv:2404.10102); from their repository epoch-research/analyzing-chinchilla, file
data/svg_extracted_data.csv. Columns: x, y, color (plot coordinates), Model Size, Training FLOP,
hex_color, loss. Tokens = Training FLOP / (6 x Model Size). The source repository states no
licence; the numbers are measurements read off a published figure, cited here with both sources.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["DATASETS", "dataset_path", "load_dataset"]

# name -> (file inside this package, its columns as `load_runs` takes them, runs of highest loss
# to leave out: Epoch's outlier rule drops the 5 of highest loss)
DATASETS: dict[str, tuple[str, dict[str, str], int]] = {
    "epoch": ("chinchilla_epoch_extracted.csv", {"params": "Model Size", "flops": "Training FLOP"}, 5),
}


def dataset_path(name: str) -> Path:
    """The path of the shipped data set `name` (a file inside the installed package)."""
    if name not in DATASETS:
        raise ValueError(f"--dataset: unknown data set {name!r}; choose one of {sorted(DATASETS)}")
    return Path(str(resources.files(__name__).joinpath(DATASETS[name][0])))


def load_dataset(name: str):
    """The shipped data set `name` as `memplan.planner.scaling.Runs`, with its outlier rule applied
    (for "epoch": the 245 points less the 5 of highest loss, 240 runs)."""
    from memplan.planner.scaling import load_runs

    path = dataset_path(name)  # ValueError for an unknown name
    _, columns, drop = DATASETS[name]
    return load_runs(path, columns=columns).drop_highest_loss(drop)
