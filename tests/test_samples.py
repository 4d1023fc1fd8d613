"""Every ``$ python -m mamba_kernels ...`` sample in README.md and docs/ equals what the command
prints (scripts/samples.py; ``python scripts/samples.py --write`` rewrites them from real output)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("samples", ROOT / "scripts" / "samples.py")
samples = importlib.util.module_from_spec(_spec)
sys.modules["samples"] = samples
_spec.loader.exec_module(samples)

ALL = [s for d in samples.documents() for s in samples.find_samples(d)]


def _this_env_is_the_samples() -> str:
    """Why this environment is not the one the ``this-env`` samples show (setup.sh's, no GPU), or ''."""
    import torch

    from mamba_kernels.runtime import dispatch

    if not torch.version.cuda:
        return f"torch {torch.__version__} is not a CUDA build"
    if torch.cuda.is_available():
        return "a GPU is visible"
    built = [k for k in dispatch.EXTENSIONS if dispatch.extension_status(k).module is not None]
    return f"the extensions of {', '.join(built)} are built" if built else ""


def test_there_are_samples_and_every_command_is_in_one():
    assert {s.setup for s in ALL} == set(samples.SETUPS)
    assert [u for d in samples.documents() for u in samples.unmarked_commands(d)] == []


@pytest.mark.parametrize("sample", ALL, ids=[s.where for s in ALL])
def test_sample_is_what_the_command_prints(sample):
    if sample.setup == "this-env":
        why = _this_env_is_the_samples()
        if why:
            pytest.skip(f"the sample shows scripts/setup.sh's environment without a GPU; here {why}")
    diff = samples.differences(sample, samples.run_sample(sample))
    assert diff is None, f"{diff}\n(python scripts/samples.py --write rewrites it from the real output)"


def test_the_check_sees_a_changed_line_and_only_varies_lines_are_free():
    sample = next(s for s in ALL if s.varies)
    real = list(sample.lines)
    varied = next(i for i, ln in enumerate(real) if samples._key(ln) in sample.varies)
    other = next(
        i
        for i, ln in enumerate(real)
        if ln and samples._key(ln) not in sample.varies and not ln.startswith("$ ")
    )
    changed = list(real)
    changed[varied] = samples._key(real[varied]) + " something else entirely"
    assert samples.differences(sample, changed) is None
    changed[other] += " (drifted)"
    assert samples.differences(sample, changed) is not None
