"""measure_host_bandwidth: None on the CPU with the reason logged, input checks, and on a GPU two
positive finite bandwidths (no wall-clock bounds)."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from memplan.profiler.bandwidth import measure_host_bandwidth


def test_cpu_gives_none_and_logs_why(caplog):
    with caplog.at_level(logging.INFO, logger="memplan.profiler.bandwidth"):
        assert measure_host_bandwidth("cpu", nbytes=1024, repeats=1) is None
    assert "a CUDA device is needed" in caplog.text


@pytest.mark.parametrize("kw", [dict(nbytes=0), dict(repeats=0), dict(nbytes=1.5), dict(repeats=True)])
def test_bad_sizes_are_refused_by_name(kw):
    name = next(iter(kw))
    with pytest.raises(ValueError, match=f"^{name}: a positive integer"):
        measure_host_bandwidth("cpu", **kw)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")
def test_cuda_gives_two_positive_bandwidths():
    got = measure_host_bandwidth("cuda", nbytes=16 * 2**20, repeats=3)
    assert got is not None and len(got) == 2
    assert all(math.isfinite(b) and b > 0 for b in got)
