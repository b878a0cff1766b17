"""Fixtures for sizing tests: Epoch's extraction of the Chinchilla data (shipped in memplan.data)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def epoch_runs():
    """The 245 points Epoch extracted from Hoffmann et al.'s Figure 4, less the 5 of highest loss
    (Epoch's outlier rule), as `Runs`."""
    from memplan.data import load_dataset

    return load_dataset("epoch")


@pytest.fixture(scope="session")
def epoch_fit(epoch_runs):
    from memplan.planner.scaling import fit_law

    return fit_law(epoch_runs)
