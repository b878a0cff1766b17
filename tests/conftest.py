"""Shared fixtures: small chains for the planner, the CUDA skip marker."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

os.environ.setdefault("MEMPLAN_TESTING", "1")

# Property tests draw the same examples on every run (CI included): a failure is reproducible and
# a statistical bound (tests/planner/test_optimal.py) is checked on a fixed sample, never flaky.
settings.register_profile("memplan", derandomize=True, database=None, print_blob=True)
settings.load_profile("memplan")


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA (no GPU on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
