"""Every public name of the selective_scan package, at the module paths mamba_ssm uses,
with mamba_ssm's positional order and defaults."""

from __future__ import annotations

import importlib
import inspect

import pytest

import mamba_kernels

SURFACE = {
    "selective_scan": [
        "selective_scan_fn",
        "selective_scan_ref",
        "mamba_inner_fn",
        "mamba_inner_ref",
        "selective_state_update",
        "__version__",
    ],
    "selective_scan.selective_scan_interface": [
        "SelectiveScanFn",
        "selective_scan_fn",
        "selective_scan_ref",
        "MambaInnerFn",
        "mamba_inner_fn",
        "mamba_inner_ref",
        "rms_norm_forward",
    ],
    "selective_scan.selective_state_update": ["selective_state_update"],
}


@pytest.mark.parametrize("module,names", SURFACE.items())
def test_names_import(module, names):
    mod = importlib.import_module(module)
    for name in names:
        assert hasattr(mod, name), f"{module}.{name}"


def test_version_is_the_package_version():
    import selective_scan

    assert selective_scan.__version__ == mamba_kernels.__version__


def params(fn):
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


E = inspect.Parameter.empty


def test_signatures_follow_mamba_ssm():
    from selective_scan.selective_scan_interface import (
        mamba_inner_fn,
        mamba_inner_ref,
        rms_norm_forward,
        selective_scan_fn,
        selective_scan_ref,
    )
    from selective_scan.selective_state_update import selective_state_update

    scan = [
        ("u", E),
        ("delta", E),
        ("A", E),
        ("B", E),
        ("C", E),
        ("D", None),
        ("z", None),
        ("delta_bias", None),
        ("delta_softplus", False),
        ("return_last_state", False),
    ]
    assert params(selective_scan_fn) == scan
    assert params(selective_scan_ref) == scan
    inner = [
        ("xz", E),
        ("conv1d_weight", E),
        ("conv1d_bias", E),
        ("x_proj_weight", E),
        ("delta_proj_weight", E),
        ("out_proj_weight", E),
        ("out_proj_bias", E),
        ("A", E),
        ("B", None),
        ("C", None),
        ("D", None),
        ("delta_bias", None),
        ("B_proj_bias", None),
        ("C_proj_bias", None),
        ("delta_softplus", True),
    ]
    assert params(mamba_inner_ref) == inner
    assert params(mamba_inner_fn) == inner + [
        ("checkpoint_lvl", 1),
        ("b_rms_weight", None),
        ("c_rms_weight", None),
        ("dt_rms_weight", None),
        ("b_c_dt_rms_eps", 1e-6),
    ]
    assert params(selective_state_update) == [
        ("state", E),
        ("x", E),
        ("dt", E),
        ("A", E),
        ("B", E),
        ("C", E),
        ("D", None),
        ("z", None),
        ("dt_bias", None),
        ("dt_softplus", False),
        ("state_batch_indices", None),
    ]
    assert params(rms_norm_forward) == [
        ("x", E),
        ("weight", E),
        ("bias", E),
        ("eps", 1e-6),
        ("is_rms_norm", True),
    ]


def test_autograd_functions():
    import torch

    from selective_scan.selective_scan_interface import MambaInnerFn, SelectiveScanFn

    assert issubclass(SelectiveScanFn, torch.autograd.Function)
    assert issubclass(MambaInnerFn, torch.autograd.Function)
