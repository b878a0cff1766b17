"""Fixtures for sizing tests: Epoch's extraction of the Chinchilla data (../shared/data)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
EPOCH_CSV = REPO.parent / "shared" / "data" / "chinchilla_epoch_extracted.csv"
EPOCH_COLUMNS = {"params": "Model Size", "flops": "Training FLOP"}


@pytest.fixture(scope="session")
def epoch_runs():
    """The 245 points Epoch extracted from Hoffmann et al.'s Figure 4, less the 5 of highest loss
    (Epoch's outlier rule), as `Runs`."""
    if not EPOCH_CSV.exists():
        pytest.skip(f"Epoch's Chinchilla data is not at {EPOCH_CSV} (a checkout without ../shared)")
    from planner.scaling import load_runs

    return load_runs(EPOCH_CSV, columns=EPOCH_COLUMNS).drop_highest_loss(5)


@pytest.fixture(scope="session")
def epoch_fit(epoch_runs):
    from planner.scaling import fit_law

    return fit_law(epoch_runs)
