"""bench/e2e_ab.py's machinery (CPU, no model): the interleaved rounds, the summaries, the
per-side stand-ins and the check that each row's calls reached its side."""

from __future__ import annotations

import importlib
import os
import sys
import types

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")


@pytest.fixture
def ab(monkeypatch):
    monkeypatch.syspath_prepend(BENCH)  # e2e_ab imports its siblings e2e_mamba and provenance
    for name in ("e2e_ab", "e2e_mamba"):
        sys.modules.pop(name, None)
    module = importlib.import_module("e2e_ab")
    module.CALLS.clear()
    return module


def test_rounds_alternate_the_first_side(ab):
    seen = []
    fns = {"ours": lambda: seen.append("ours"), "orig": lambda: seen.append("orig")}
    switched = []
    times = ab.interleaved(fns, switched.append, 4, lambda: None)
    # warm-up in order, then ours first, orig first, ours first, orig first
    assert seen == ["ours", "orig"] + ["ours", "orig", "orig", "ours"] * 2
    assert switched == seen  # every call had its side switched in just before it
    assert {k: len(v) for k, v in times.items()} == {"ours": 4, "orig": 4}


def test_paired_rounds_rotate_every_side_to_the_front(ab):
    seen = []
    timers = {n: (lambda n=n: seen.append(n) or float(len(seen))) for n in ("a", "b", "c")}
    samples = ab.T.paired_rounds(timers, 4)
    assert seen == list("abc" "bca" "cab" "abc")
    assert samples == {"a": [1.0, 6.0, 8.0, 10.0], "b": [2.0, 4.0, 9.0, 11.0], "c": [3.0, 5.0, 7.0, 12.0]}


def test_summary_ratios(ab):
    times = {"ours": [1.0, 2.0, 3.0], "orig": [2.0, 2.0, 2.0]}
    row = ab.summarise(times)
    assert row["ours"] == (2.0, 1.0, 3.0) and row["orig"] == (2.0, 2.0, 2.0)
    assert row["ratio"] == 1.0 and row["paired"] == 1.0  # per-round ratios 0.5, 1, 1.5
    rate = ab.summarise({"ours": [100.0, 100.0, 100.0], "orig": [200.0, 200.0, 200.0]}, rate_work=10)
    assert rate["ours"][0] == 100.0 and rate["orig"][0] == 50.0  # 10 per 0.1 s, 10 per 0.2 s
    assert rate["ratio"] == 2.0 and rate["paired"] == 2.0  # ours twice the rate


def test_median_interval_ranks_and_coverage(ab):
    # the order statistics of the 95 % interval for the median (n 16: 4th and 13th; n 40: 14th
    # and 27th), the whole range below six values, and, over many draws from a skewed
    # distribution, the true median inside at least 95 % of the time
    import random

    ci = ab.T.median_ci
    assert ci(list(range(1, 17))) == (4, 13)
    assert ci(list(reversed(range(1, 41)))) == (14, 27)
    assert ci([3.0, 1.0, 2.0]) == (1.0, 3.0)
    with pytest.raises(ValueError):
        ci([])
    rng = random.Random(7)
    true_median = 2.0 ** 0.5  # of 2 ** U(0, 1), U uniform
    inside = 0
    for _ in range(2000):
        lo, hi = ci([2.0 ** rng.random() for _ in range(16)])
        inside += lo <= true_median <= hi
    assert inside / 2000 >= 0.95


def test_summary_carries_the_rounds_interval(ab):
    times = {"ours": [float(v) for v in range(1, 17)], "orig": [1.0] * 16}
    row = ab.summarise(times)
    assert row["paired"] == 8.5 and row["paired_ci"] == (4.0, 13.0)
    assert row["rounds"] == times["ours"]  # each round's ratio kept, in order


def test_stand_ins_count_per_side_and_the_check_catches_a_stray_call(ab):
    ours = types.SimpleNamespace(fwd=lambda *a: ("ours", a), bwd=lambda *a: "ours bwd", __file__="/x/ours.py")
    orig = types.SimpleNamespace(fwd=lambda *a: ("orig", a), bwd=lambda *a: "orig bwd", __file__="/y/orig.so")
    sides = {"ours": ab.stand_in("ours", ours), "orig": ab.stand_in("orig", orig)}
    client = types.ModuleType("client")
    switch = ab.Switch(sides, [client])
    switch.use("orig")
    assert client.selective_scan_cuda.fwd(1, 2) == ("orig", (1, 2))
    assert client.selective_scan_cuda.__file__ == "/y/orig.so"
    problems = []
    ab.expect_side("row", "orig", problems)
    assert problems == [] and not ab.CALLS
    switch.use("ours")
    client.selective_scan_cuda.fwd()
    sides["orig"].bwd()  # a call that went to the other side
    ab.expect_side("row", "ours", problems)
    assert len(problems) == 1 and "row (ours)" in problems[0]
    ab.expect_side("empty row", "ours", problems)  # no calls at all: the fast path was not taken
    assert len(problems) == 2


@pytest.mark.parametrize("control", [None, "ours", "orig"])
def test_control_runs_point_both_columns_at_one_side(ab, monkeypatch, control):
    # an A/A run (--control) gives both columns the named side's module, each still counted
    # under its own column, and says so in the report's header; a normal run keeps them apart
    ours = types.SimpleNamespace(fwd=lambda *a: "ours", bwd=lambda *a: "ours bwd", __file__="/x/ours.py")
    orig = types.SimpleNamespace(fwd=lambda *a: "orig", bwd=lambda *a: "orig bwd", __file__="/y/orig.so")
    iface = types.ModuleType("iface")
    iface.selective_scan_cuda = ours
    monkeypatch.setitem(sys.modules, ab.provenance.ORIG_INTERFACE, iface)
    monkeypatch.setattr(ab.provenance, "check_ours_client", lambda root, compiled: ["ours: checked"])
    monkeypatch.setattr(ab.provenance, "load_original_extension", lambda d, name: (orig, "/y/orig.so"))
    sides, lines = ab.load_sides("/y", "cpu", control)
    got = {name: module.fwd() for name, module in sides.items()}
    want = {None: {"ours": "ours", "orig": "orig"}, "ours": {"ours": "ours", "orig": "ours"},
            "orig": {"ours": "orig", "orig": "orig"}}[control]
    assert got == want
    assert dict(ab.CALLS) == {"ours:fwd": 1, "orig:fwd": 1}  # counted per column either way
    assert any("CONTROL RUN" in line for line in lines) == (control is not None)
