"""bench/e2e_mamba2.py on the CPU at its tiny sizes: the "ours" side runs mamba_ssm's Mamba2 layer
and a Mamba-2 LM with ``import triton`` failing, proves the modules it ran on, and its saved
results compare cleanly with themselves through bench/e2e_mamba.py's table."""

from __future__ import annotations

import os
import subprocess
import sys

import peer_sources
import pytest
import torch

pytest.importorskip("einops")
BENCH = peer_sources.ROOT / "bench"


@pytest.fixture(scope="module")
def ms_dir(tmp_path_factory):
    return peer_sources.mamba_ssm_src_or_skip(tmp_path_factory)


def bench(*args, cwd):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(peer_sources.ROOT))
    return subprocess.run([sys.executable, *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=300, cwd=str(cwd))


def test_ours_runs_without_triton_and_compares(ms_dir, tmp_path):
    r = bench(BENCH / "e2e_mamba2.py", "run", "--label", "ours", "--dir", tmp_path, "--ms-dir", ms_dir,
              "--tiny", "--device", "cpu", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "provenance ours: triton importable: False" in r.stdout
    ours = peer_sources.ROOT / "selective_scan"
    assert f"provenance ours: mamba_ssm.ops.triton.ssd_combined = {ours}" in r.stdout
    saved = torch.load(tmp_path / "mamba2-ours.pt")
    assert saved["meta"]["problems"] == []
    res = saved["results"]["float32"]
    want = {"block.out", "block.dx", "block.dA_log", "lm.logits", "lm.loss", "gen.tokens"}
    assert want <= set(res["tensors"])
    assert {"Mamba2 layer forward", "Mamba2 layer fwd+bwd", "LM forward", "LM fwd+bwd",
            "generate, tokens/s"} <= set(res["times"])
    c = bench(BENCH / "e2e_mamba.py", "compare", "--stack", "mamba2", "--base", "ours", "--label", "ours",
              "--dir", tmp_path, cwd=tmp_path)
    assert c.returncode == 0, c.stdout + c.stderr
    assert "| block.dx | 0.00e+00 |" in c.stdout and "100.0% of tokens equal" in c.stdout


def test_a_side_not_on_its_modules_measures_nothing(tmp_path):
    # an --ms-dir without mamba_ssm: the import fails before anything is measured
    r = bench(BENCH / "e2e_mamba2.py", "run", "--label", "ours", "--dir", tmp_path, "--ms-dir", tmp_path,
              "--tiny", "--device", "cpu", cwd=tmp_path)
    assert r.returncode == 2 and "PROVENANCE FAILED (ours)" in r.stderr
    assert not (tmp_path / "mamba2-ours.pt").exists()
