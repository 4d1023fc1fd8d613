"""The kernels' launch choices follow the running device's multiprocessor count
(csrc/common/device_info.h, the policies' per-SM thresholds). MAMBA_KERNELS_SM_COUNT makes a
process count its GPU as that many SMs, so one GPU shows the choices GPUs of other sizes make:
each case below takes a different decode kernel at 66, 132 and 264 SMs (half an H100, an H100,
twice one), and on a GPU it must launch what scripts/sanitize_cases.predict_decode says for each
count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mamba_kernels.runtime import knobs

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import sanitize_cases as sc  # noqa: E402  (scripts/ is no package)

COUNTS = (66, 132, 264)
# (batch, nheads, dim, dstate, state dtype): rows = batch x heads x dim across the thresholds
CASES = {
    # the decode bench's batch 64 and 128 of Mamba-1's 5120 channels: the row kernel's reach
    "mamba1-batch-64": dict(batch=64, nheads=None, dim=5120, dstate=16, state=sc.F32, act=sc.BF16),
    "mamba1-batch-128": dict(batch=128, nheads=None, dim=5120, dstate=16, state=sc.F32, act=sc.BF16),
    # Mamba-2's step (80 heads of 64, dstate 128) at batch 64
    "mamba2-batch-64": dict(batch=64, nheads=80, dim=64, dstate=128, state=sc.BF16, act=sc.BF16),
    # strided x (no row kernel): the lean kernel's passes, by rows per SM
    "strided-20000": dict(batch=1, nheads=None, dim=20000, dstate=16, state=sc.F32, act=sc.BF16,
                          strided=True),
}


def expected(name: str, sms: int):
    return sc.predict_decode(sc._c(name, "decode", [], **CASES[name]), sms)


def test_the_extensions_read_the_registered_name():
    # csrc reads the variable itself (no torch in device_info.h): the name must be the registry's
    assert f'std::getenv("{knobs.SM_COUNT_VAR}")' in (ROOT / "csrc" / "common" / "device_info.h").read_text()


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_cases_choose_by_the_count(name):
    # without this the GPU test below could pass with the count ignored
    kinds = [tuple(expected(name, sms)) for sms in COUNTS]
    assert len(set(kinds)) >= 2, f"{name}: the same kernel at {COUNTS} SMs: {kinds}"


SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
import sanitize_cases as sc
case = sc._c(sys.argv[2], "decode", json.loads(sys.argv[3]), **json.loads(sys.argv[4]))
sys.exit(sc.verify_cases([case]))
"""


@pytest.mark.gpu
@pytest.mark.parametrize("sms", COUNTS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_step_takes_the_kernel_of_the_count_it_is_given(name, sms):
    kinds = expected(name, sms)
    env = dict(os.environ, **{knobs.SM_COUNT_VAR: str(sms), knobs.BACKEND_VAR: "cuda"})
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT / "scripts"), name, json.dumps(kinds),
                        json.dumps(CASES[name])], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{name} at {sms} SMs, expected {kinds}:\n{r.stdout}{r.stderr}"
    assert "verify " + name + ": ok" in r.stdout
