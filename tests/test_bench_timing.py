"""bench/_timing.py's samplers on CPU: what a timer calls, in which order, and what it refuses."""

from __future__ import annotations

import importlib
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")


@pytest.fixture
def T(monkeypatch):
    monkeypatch.syspath_prepend(BENCH)
    sys.modules.pop("_timing", None)
    return importlib.import_module("_timing")


def test_loop_timer_warms_then_cycles_over_the_sets(T):
    seen = []
    timer = T.loop_timer(seen.append, 3, 4, device="cpu", warmup=2)
    assert seen == [0, 1, 2, 0] * 2  # two warm-up loops of four calls over three sets
    seen.clear()
    ms = timer()
    assert seen == [0, 1, 2, 0] and ms > 0.0  # one sample: one loop, per call


def test_loop_timer_needs_cuda_for_a_graph(T):
    with pytest.raises(RuntimeError, match="CUDA graphs need a CUDA device"):
        T.loop_timer(lambda i: None, 1, 1, device="cpu", graph=True)


def test_time_ms_is_the_median_of_the_timer_samples(T):
    calls = []
    ms = T.time_ms(calls.append, 2, reps=5, inner=3, device="cpu", warmup=1)
    # fn(0) and the first timed call, one warm-up loop, then five samples of three calls each
    assert calls == [0, 0] + [0, 1, 0] + [0, 1, 0] * 5 and ms > 0.0
