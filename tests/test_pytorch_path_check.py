"""ci/pytorch_path_check.py, which every wheel's smoke test runs on its cell's torch: it passes
under the test torch, and it reports a function whose result or gradient is off, or that raises."""

from __future__ import annotations

import os

import torch

import selective_scan
from ci import pytorch_path_check
from selective_scan import selective_scan_fn


def test_passes_under_this_torch(monkeypatch):
    monkeypatch.setenv("MAMBA_KERNELS_BACKEND", "auto")
    assert pytorch_path_check.problems() == []
    assert os.environ["MAMBA_KERNELS_BACKEND"] == "auto"  # restored


def test_reports_wrong_results_and_errors(monkeypatch):
    def off(*args, **kwargs):  # right shape, 1 % off
        return selective_scan_fn(*args, **kwargs) * 1.01

    monkeypatch.setattr(selective_scan, "selective_scan_fn", off)
    found = pytorch_path_check.problems()
    assert any(p.startswith("selective_scan_fn (torch.float32): out differs") for p in found), found

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel for this dtype")

    monkeypatch.setattr(selective_scan, "selective_scan_fn", broken)
    found = pytorch_path_check.problems()
    assert "selective_scan_fn (torch.float16): RuntimeError: no kernel for this dtype" in found, found
    assert not any(p.startswith("causal_conv1d") for p in found)
    assert torch.get_default_dtype() == torch.float32
