"""bench/e2e_mamba.py's timings: each quantity's median with its fastest and slowest repetition,
and the compare table that prints both sides' ranges (CPU, no model: the timed function is a
stand-in whose durations are known)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

import pytest
import torch

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")


@pytest.fixture
def e2e(monkeypatch):
    monkeypatch.syspath_prepend(BENCH)  # e2e_mamba imports its sibling provenance.py
    sys.modules.pop("e2e_mamba", None)
    return importlib.import_module("e2e_mamba")


def sleeper(durations_ms):
    """A function whose n-th call sleeps durations_ms[n] (the first call is the warm-up)."""
    calls = iter(durations_ms)
    return lambda: time.sleep(next(calls) / 1e3)


# time.sleep never returns early, so each bound below holds however loaded the machine is.


def test_time_records_median_and_range(e2e):
    t = e2e.Timings()
    t.time("step", sleeper([0, 120, 20, 60]), "cpu", 3)  # warm-up, then 120, 20, 60 ms
    lo, hi = t.spread["step"]
    assert lo >= 20 and t["step"] >= 60 and hi >= 120
    assert lo < t["step"] < hi  # the middle call: neither the fastest nor the slowest


def test_rate_turns_the_fastest_call_into_the_highest_rate(e2e):
    t = e2e.Timings()
    t.rate("tokens/s", 100, sleeper([0, 50, 25, 100]), "cpu", 3)  # 100 tokens in 50, 25, 100 ms
    lo, hi = t.spread["tokens/s"]
    assert hi <= 4000 and t["tokens/s"] <= 2000 and lo <= 1000
    assert lo <= t["tokens/s"] <= hi


def _side(label, times, spread=None):
    meta = {"label": label, "modules": {}, "provenance": ["checked"], "problems": [], "sizes": {},
            "gpu": "cpu", "torch": str(torch.__version__)}
    res = {"tensors": {}, "times": times}
    if spread is not None:
        res["spread"] = spread
    return {"meta": meta, "results": {"float32": res}}


def test_compare_prints_both_ranges_and_reads_runs_without_one(e2e, tmp_path, capsys):
    # the base as an older run saved it, without ranges
    torch.save(_side("base", {"block forward": 2.0}), tmp_path / "mamba_ssm-base.pt")
    ours = _side("ours", {"block forward": 1.0}, {"block forward": (0.9, 1.4)})
    torch.save(ours, tmp_path / "mamba_ssm-ours.pt")
    args = argparse.Namespace(dir=str(tmp_path), stack="mamba_ssm", base="base", label="ours")
    assert e2e.cmd_compare(args) == 0
    out = capsys.readouterr().out
    assert "| block forward | 1.000 ms (0.900-1.400) | 2.000 ms | 0.50 |" in out
    assert "the fastest and the slowest" in out


def test_host_profile_splits_the_host_time_by_entry_point(e2e):
    inner = e2e.counting("entry", lambda: time.sleep(0.001))  # a counted kernel entry point

    def step():  # two entry-point calls (2 ms) and 50 ms of other host work per run
        inner()
        inner()
        time.sleep(0.05)

    t = e2e.Timings()
    e2e.host_profile(t, "step", step, "cpu", 3)
    inside = t["step: host time in entry (2 calls)"]
    whole = t["step: host time until the call returns"]
    # sleeps never return early, so the lower bounds hold however loaded the machine is; the
    # entry points' clock must leave the 50 ms outside them out
    assert inside >= 2 and whole >= 52 and inside < 50
    assert "step: GPU kernel time" not in t  # no kernel time off CUDA
    assert not e2e.CLOCK.on and not e2e.CALLS and not e2e.HOST_S
    inner()  # outside a profile the wrappers only count
    assert e2e.CALLS["entry"] == 1 and not e2e.HOST_S
