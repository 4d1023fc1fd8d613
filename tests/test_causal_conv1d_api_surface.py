"""Every public name of causal-conv1d 1.7.0 imports from the module path consumers use
(the package and its causal_conv1d_interface, causal_conv1d_varlen and cpp_functions
modules), with the original's signatures."""

from __future__ import annotations

import inspect

import torch


def test_package_exports():
    import causal_conv1d
    from causal_conv1d import __version__, causal_conv1d_fn, causal_conv1d_update

    assert set(causal_conv1d.__all__) == {"__version__", "causal_conv1d_fn", "causal_conv1d_update"}
    assert isinstance(__version__, str) and __version__
    assert callable(causal_conv1d_fn) and callable(causal_conv1d_update)


def test_interface_module():
    from causal_conv1d import causal_conv1d_interface as ci
    from causal_conv1d.causal_conv1d_interface import (
        CausalConv1dFn,
        causal_conv1d_fn,
        causal_conv1d_ref,
        causal_conv1d_update,
        causal_conv1d_update_ref,
    )

    assert issubclass(CausalConv1dFn, torch.autograd.Function)
    import causal_conv1d

    assert causal_conv1d.causal_conv1d_fn is ci.causal_conv1d_fn is causal_conv1d_fn
    assert causal_conv1d.causal_conv1d_update is causal_conv1d_update
    params = lambda f: list(inspect.signature(f).parameters)  # noqa: E731
    assert params(causal_conv1d_fn) == [
        "x", "weight", "bias", "seq_idx", "initial_states", "return_final_states", "final_states_out",
        "activation",
    ]
    assert params(causal_conv1d_update) == [
        "x", "conv_state", "weight", "bias", "activation", "cache_seqlens", "conv_state_indices",
    ]
    assert params(causal_conv1d_ref) == [
        "x", "weight", "bias", "initial_states", "return_final_states", "final_states_out", "activation",
        "seq_idx",
    ]
    assert params(causal_conv1d_update_ref) == [
        "x", "conv_state", "weight", "bias", "activation", "cache_seqlens",
    ]
    defaults = inspect.signature(causal_conv1d_fn).parameters
    assert all(defaults[n].default is None for n in ("bias", "seq_idx", "initial_states", "activation"))
    assert defaults["return_final_states"].default is False


def test_varlen_module():
    from causal_conv1d.causal_conv1d_varlen import (
        causal_conv1d_varlen_states,
        causal_conv1d_varlen_states_ref,
    )

    assert list(inspect.signature(causal_conv1d_varlen_states).parameters) == ["x", "cu_seqlens", "state_len"]
    assert callable(causal_conv1d_varlen_states_ref)


def test_cpp_functions_module():
    from causal_conv1d.cpp_functions import (
        causal_conv1d_bwd_function,
        causal_conv1d_fwd_function,
        causal_conv1d_update_function,
    )

    params = lambda f: list(inspect.signature(f).parameters)  # noqa: E731
    assert params(causal_conv1d_fwd_function) == [
        "x", "weight", "bias", "seq_idx", "initial_states", "final_states_out", "silu_activation",
    ]
    assert params(causal_conv1d_bwd_function) == [
        "x", "weight", "bias", "dout", "seq_idx", "initial_states", "dfinal_states", "dx",
        "return_dinitial_states", "silu_activation",
    ]
    assert params(causal_conv1d_update_function) == [
        "x", "conv_state", "weight", "bias", "silu_activation", "cache_seqlens", "conv_state_indices",
    ]
    for f in (causal_conv1d_fwd_function, causal_conv1d_bwd_function, causal_conv1d_update_function):
        assert all(p.default is inspect.Parameter.empty for p in inspect.signature(f).parameters.values())


def test_mamba_ssm_style_import_block():
    """mamba_ssm imports causal_conv1d_fn and cpp_functions in one try block."""
    try:
        from causal_conv1d import causal_conv1d_fn
        from causal_conv1d.cpp_functions import causal_conv1d_fwd_function  # noqa: F401
    except ImportError:  # pragma: no cover - the failure this test guards against
        causal_conv1d_fn = None
    assert causal_conv1d_fn is not None
