"""Chains for planner tests: the chain model's worked example and random chains (hypothesis)."""

from __future__ import annotations

from hypothesis import strategies as st
from memplan.profiler.schema import Profile

WORKED = dict(
    x=(1, 3, 4, 3, 4), f=(3, 4, 4, 1), b=(6, 8, 8, 2), s=(3, 4, 1, 4), tf=(2, 2, 0, 2), tb=(1, 0, 0, 0)
)


def chain(x, f, b, s, tf=None, tb=None, *, tfn=None, fixed_bytes: int = 0,
          name: str = "chain") -> Profile:
    """A Profile from per-stage lists; x includes x_0 (the input) first; `tfn`: the no-grad
    forward's transients (forward_nograd_temp_bytes; None: not given)."""
    L = len(f)
    tf = tf or [0] * L
    tb = tb or [0] * L
    tfn = tfn or [None] * L
    return Profile(
        name=name,
        input_bytes=x[0],
        fixed_bytes=fixed_bytes,
        layers=[
            dict(name=f"s{i + 1}", forward_s=f[i], backward_s=b[i], output_bytes=x[i + 1],
                 saved_bytes=s[i], forward_temp_bytes=tf[i], backward_temp_bytes=tb[i],
                 forward_nograd_temp_bytes=tfn[i])
            for i in range(L)
        ],
    )


def worked_example() -> Profile:
    return chain(**WORKED, name="worked")


@st.composite
def random_chains(draw, min_stages: int = 1, max_stages: int = 8, *, nograd: bool = False) -> Profile:
    """Chains with small integer sizes and times (so that time comparisons are exact); `nograd`:
    with no-grad forward transients too, often above the recorded forward's (a saved tensor is
    transient there), and no-grad forward times."""
    L = draw(st.integers(min_stages, max_stages))
    small = st.integers(0, 6)
    pos = st.integers(1, 6)
    prof = chain(
        [draw(pos) for _ in range(L + 1)],
        [draw(pos) for _ in range(L)],
        [draw(pos) for _ in range(L)],
        [draw(small) for _ in range(L)],
        [draw(st.integers(0, 3)) for _ in range(L)],
        [draw(st.integers(0, 3)) for _ in range(L)],
        tfn=[draw(st.integers(0, 8)) for _ in range(L)] if nograd else None,
    )
    if nograd:
        for layer in prof.layers:
            layer.forward_nograd_s = float(draw(st.integers(1, layer.forward_s)))
    return prof
