"""`measured_again`: re-run a test that compares exact CPU bytes when a run disagrees.

NOTE [ byte tests in the full suite ]
Exact per-op byte comparisons pass alone every time but, late in the full suite, disagree in
some runs by 4 bytes to a few KiB, for a cause not yet pinned down (the gap moves between runs of
the same code). Not other threads: the profiler records only the measuring thread's allocations
(torch 2.13, checked with a thread allocating throughout a measured step, started before it or
inside it); not Python's cyclic collector either, which `measure_memory` pauses. A real error in
the model or the runner repeats on every run; this does not. So such a test is run up to three times
and fails only when every run fails (the last run's assertion is raised).
What is known (2026-12-05): one cause of a full activation under save policies was found and
removed (NOTE [ candidate save policies ] rule 5 in profiler/policies.py); a 4-byte scalar held
from the first backward op to the end of the step, in one step and not in another of the same
process, remains (seen on the tiny GPT after other steps had run, and between a service run's
peak step and its per-op timeline step)."""

from __future__ import annotations

import functools
import logging

log = logging.getLogger(__name__)


def measured_again(tries: int = 3):
    def wrap(test):
        @functools.wraps(test)
        def run(*args, **kwargs):
            for attempt in range(1, tries + 1):
                try:
                    return test(*args, **kwargs)
                except AssertionError:
                    if attempt == tries:
                        raise
                    log.warning("%s: bytes disagreed on run %d; measuring again", test.__name__,
                                attempt)
        return run
    return wrap
