import os
from unittest import mock

import pytest

from mamba_kernels.runtime import knobs


@pytest.mark.parametrize("raw", ["1", "true", "TRUE", "Yes", "on", " ON "])
def test_true_spellings(raw):
    assert knobs.parse_bool("MAMBA_KERNELS_X", raw) is True


@pytest.mark.parametrize("raw", ["0", "false", "False", "NO", "off"])
def test_false_spellings(raw):
    assert knobs.parse_bool("MAMBA_KERNELS_X", raw) is False


@pytest.mark.parametrize("raw", ["2", "y", "enable", "truee"])
def test_unknown_boolean_is_an_error_naming_the_knob(raw):
    with pytest.raises(ValueError, match=rf"MAMBA_KERNELS_X='{raw}' is not a boolean"):
        knobs.parse_bool("MAMBA_KERNELS_X", raw)


def test_env_bool_default_when_unset_or_empty():
    assert knobs.env_bool("K", default=True, environ={}) is True
    assert knobs.env_bool("K", default=False, environ={"K": ""}) is False
    assert knobs.env_bool("K", default=False, environ={"K": "yes"}) is True


def test_backend_mode():
    assert knobs.backend_mode({}) == "auto"
    assert knobs.backend_mode({knobs.BACKEND_VAR: "Reference"}) == "reference"
    assert knobs.backend_mode({knobs.BACKEND_VAR: "cuda"}) == "cuda"
    with pytest.raises(ValueError, match="MAMBA_KERNELS_BACKEND='triton' is not a backend"):
        knobs.backend_mode({knobs.BACKEND_VAR: "triton"})


def test_binding_choice():
    assert knobs.binding_choice({}) == "auto"
    assert knobs.binding_choice({knobs.BINDING_VAR: " Stable "}) == "stable"
    assert knobs.binding_choice({knobs.BINDING_VAR: "classic"}) == "classic"
    with pytest.raises(ValueError, match=r"BINDING='abi3' is not a binding: use one of auto, stable"):
        knobs.binding_choice({knobs.BINDING_VAR: "abi3"})


def test_process_environment_reads_follow_every_change(monkeypatch):
    # the per-call reads look in os.environ's own store: every way of changing it must show
    name = "MAMBA_KERNELS_TEST_KNOB_READ"
    monkeypatch.delenv(name, raising=False)
    assert knobs.getenv(name) is None
    monkeypatch.setenv(name, "on")
    assert knobs.getenv(name) == "on" and knobs.env_bool(name) is True
    os.environ[name] = "Keep"
    assert knobs.getenv(name) == "Keep"
    del os.environ[name]
    assert knobs.getenv(name) is None and knobs.env_bool(name, default=True) is True
    with mock.patch.dict(os.environ, {knobs.SCAN_STATES_VAR: " RECOMPUTE "}):
        assert knobs.scan_states() == "recompute"
    assert knobs.getenv(knobs.SCAN_STATES_VAR) == os.environ.get(knobs.SCAN_STATES_VAR)


def test_a_replaced_process_environment_is_read_as_it_is(monkeypatch):
    monkeypatch.setattr(os, "environ", {knobs.BACKEND_VAR: "reference"})
    assert knobs.getenv(knobs.BACKEND_VAR) == "reference"
    assert knobs.backend_mode() == "reference"


def test_the_mamba2_kernels_are_off_unless_switched_on():
    assert knobs.mamba2_cuda({}) is True
    assert knobs.mamba2_cuda({knobs.MAMBA2_CUDA_VAR: "on"}) is True
    assert knobs.mamba2_cuda({knobs.MAMBA2_CUDA_VAR: "0"}) is False
    with pytest.raises(ValueError, match="MAMBA_KERNELS_MAMBA2_CUDA='maybe' is not a boolean"):
        knobs.mamba2_cuda({knobs.MAMBA2_CUDA_VAR: "maybe"})
