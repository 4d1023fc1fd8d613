"""Timing and reporting helpers shared by the bench/ scripts.

Every time is in milliseconds per call. On CUDA a measurement is the median over
repetitions of a CUDA-event-timed loop of calls, after a warm-up; with ``graph=True`` the
same loop is captured once in a CUDA graph and replayed, which leaves out the host (Python
and dispatch) time and so gives the kernels' time. On CPU the loop is timed with
``time.perf_counter``. A call that takes long is repeated fewer times, so that a slow path
(the PyTorch fallback at full size) still finishes in seconds.
"""

from __future__ import annotations

import datetime
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

# a measurement aims at about this much time in the timed repetitions (warm-up excluded)
DEFAULT_BUDGET_MS = 1500.0


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _one_call_ms(fn: Callable[[int], None], device: str) -> float:
    synchronize(device)
    t = time.perf_counter()
    fn(0)
    synchronize(device)
    return 1e3 * (time.perf_counter() - t)


def _counts(first_ms: float, reps: int, inner: int, budget_ms: float) -> tuple[int, int]:
    """Fewer repetitions (at least 3) and shorter loops (at least 1) for slow calls."""
    if first_ms * reps * inner <= budget_ms:
        return reps, inner
    inner = max(1, min(inner, int(budget_ms / max(first_ms * reps, 1e-9))))
    if first_ms * reps * inner > budget_ms:
        reps = max(3, min(reps, int(budget_ms / max(first_ms * inner, 1e-9))))
    return reps, inner


def capture_graph(loop: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """Capture ``loop`` (already warmed up) in a CUDA graph, warming it once more on a side stream."""
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        loop()  # capture needs the work warmed up on the capturing stream (autograd included)
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            loop()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    return g


def time_ms(
    fn: Callable[[int], None],
    n_sets: int,
    *,
    reps: int = 30,
    inner: int = 10,
    graph: bool = False,
    device: str = "cuda",
    warmup: int = 2,
    budget_ms: float = DEFAULT_BUDGET_MS,
) -> float:
    """Median milliseconds of one call; ``fn(i)`` makes the call on input set ``i``.

    Each repetition runs ``inner`` calls, cycling over the ``n_sets`` input sets so that a
    set is not still in L2 when it is used again (given sets larger than L2 together).
    """
    fn(0)  # the first call compiles, autotunes and allocates: not a sample
    first = _one_call_ms(fn, device)
    reps, inner = _counts(first, reps, inner, budget_ms)
    timer = loop_timer(fn, n_sets, inner, device=device, graph=graph,
                       warmup=warmup if first * inner < budget_ms / 4 else 0)
    return statistics.median([timer() for _ in range(reps)])


def paired_rounds(timers: Dict[str, Callable[[], float]], rounds: int) -> Dict[str, List[float]]:
    """Each round calls every timer once (each returns one sample, in ms), the order rotating
    round by round, so that a drift of the machine lands on every side alike; the samples per
    side, in round order. Ratios of one round's samples are what a paired comparison reads."""
    names = list(timers)
    out: Dict[str, List[float]] = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            out[n].append(timers[n]())
    return out


def loop_timer(fn: Callable[[int], None], n_sets: int, inner: int, *, device: str = "cuda",
               graph: bool = False, warmup: int = 1) -> Callable[[], float]:
    """A timer of ``inner`` calls of ``fn`` (cycling over the input sets), run ``warmup`` times
    first; with ``graph`` the calls are captured in a CUDA graph, which the timer replays. Each
    call of the timer is one sample: milliseconds per call, by CUDA events on CUDA (else the
    host clock). What time_ms takes the median of, and what paired_rounds pairs."""
    if graph and device != "cuda":
        raise RuntimeError("CUDA graphs need a CUDA device")

    def loop() -> None:
        for j in range(inner):
            fn(j % n_sets)

    for _ in range(warmup):
        loop()
    synchronize(device)
    run = loop
    if graph:
        g = capture_graph(loop)  # (warms once more on its own stream)
        run = g.replay
        run()
        synchronize(device)

    def timer() -> float:
        if device != "cuda":
            t = time.perf_counter()
            run()
            return 1e3 * (time.perf_counter() - t) / inner
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / inner

    return timer  # its closure keeps the graph alive


def wall_ms(fn: Callable[[int], None], n_sets: int, *, calls: int = 200, reps: int = 5,
            device: str = "cuda", warmup: int = 20) -> float:
    """Per-call milliseconds of ``calls`` back-to-back calls timed on the host clock, with a
    synchronize only at the end (what a Python caller waits for), median over ``reps``."""
    for j in range(warmup):
        fn(j % n_sets)
    synchronize(device)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        for j in range(calls):
            fn(j % n_sets)
        synchronize(device)
        times.append(1e3 * (time.perf_counter() - t) / calls)
    return statistics.median(times)


def n_sets_for(set_bytes: int, l2_bytes: int = 50 * 2 ** 20, most: int = 8) -> int:
    """How many input sets to rotate so that together they are at least 4x the L2 size."""
    need = -(-4 * l2_bytes // max(set_bytes, 1))
    return max(2, min(most, need))


def safe(f: Callable[[], float], notes: Optional[List[str]] = None, what: str = "") -> Optional[float]:
    """``f()``, or None when it raises (a path that cannot be captured, a missing kernel);
    the reason is appended to ``notes``."""
    try:
        return f()
    except Exception as e:  # noqa: BLE001 - report any failure and carry on
        msg = f"{what}: {type(e).__name__}: {' '.join(str(e).split())[:200]}"
        if notes is not None:
            notes.append(msg)
        else:
            print(f"<!-- skipped {msg} -->", flush=True)
        return None


def median_ci(values: Sequence[float], level: float = 0.95) -> Tuple[float, float]:
    """A confidence interval for the median of ``values`` that assumes nothing about their
    distribution: the k-th smallest to the k-th largest value, for the largest k at which the
    median falls outside with probability at most 1 - level (fewer than k of n values lie below
    it with probability P(Binomial(n, 1/2) < k), and as many above). With too few values for the
    level (n <= 5 at 95 %) it is the whole range, which then holds the median less surely."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        raise ValueError("median_ci: no values")
    tail, below, k = (1.0 - level) / 2.0, 0, 0
    for j in range(n):  # below = the number of ways to have at most j values under the median
        below += math.comb(n, j)
        if below / 2 ** n > tail:
            break
        k = j + 1
    k = max(k, 1)
    return xs[k - 1], xs[n - k]


def fmt(v: Optional[float], digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def ratio(theirs: Optional[float], ours: Optional[float]) -> str:
    if theirs is None or ours is None or ours <= 0:
        return "-"
    r = theirs / ours
    return f"{r:.2f}x" if r >= 0.1 else f"{r:.2g}x"


def gpu_description() -> str:
    """GPU name, driver and memory from nvidia-smi (or torch when nvidia-smi is absent)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout.strip().splitlines()[0]
        name, driver, mem = (s.strip() for s in out.split(","))
        return f"{name}, driver {driver}, {mem}"
    except Exception:  # noqa: BLE001 - no nvidia-smi: say what torch knows
        if torch.cuda.is_available():
            return f"{torch.cuda.get_device_name()}, driver unknown"
        return "none"


def git_revision(root: str) -> str:
    try:
        rev = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return rev + (" (with uncommitted changes)" if dirty else "")
    except Exception:  # noqa: BLE001 - not a git checkout (a copy on another machine)
        return "unknown"


def command_line(env_vars: Sequence[str] = ()) -> str:
    """The command that ran this script, with the named environment variables that were set."""
    env = [f"{k}={shlex.quote(os.environ[k])}" for k in env_vars if k in os.environ]
    return " ".join(env + ["python3", *map(shlex.quote, sys.argv)])


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def run_context(root: str, env_vars: Sequence[str] = ()) -> Dict[str, str]:
    """The provenance a bench/results record carries: GPU, date, commit and the command."""
    return {"gpu": gpu_description(), "date": utc_now(), "commit": git_revision(root),
            "command": command_line(env_vars)}
