"""The stable build's limited API: what setup.py hands setuptools for a stable build (the flags
of each extension, the abi3 file name, the wheel tag) all name CPython 3.10, and a classic build
names none. Plans a real build with this machine's torch and CUDA toolkit (nothing is
compiled but nvcc's probe); no GPU needed."""

import os
from pathlib import Path

import pytest

from mamba_kernels.build import binding as build_binding
from mamba_kernels.build import setup_glue
from mamba_kernels.facts import support, variant

ROOT = Path(__file__).resolve().parent.parent
NVCC = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"
needs_nvcc = pytest.mark.skipif(not NVCC.is_file(), reason=f"{NVCC} is needed")
DEFINE = "-DPy_LIMITED_API=0x030A0000"


@pytest.fixture
def cpp_extension(monkeypatch):
    """torch's extension builder, with the names setup_kwargs sets put back afterwards, and the
    process environment (setup_kwargs exports the build's) restored."""
    cpp_extension = pytest.importorskip("torch.utils.cpp_extension")
    for name in ("CUDA_HOME", "min_supported_cpython"):
        if hasattr(cpp_extension, name):
            monkeypatch.setattr(cpp_extension, name, getattr(cpp_extension, name))
    saved = dict(os.environ)
    yield cpp_extension
    os.environ.clear()
    os.environ.update(saved)


def _tree(tmp_path: Path) -> Path:
    """A source tree with one kernel and both bindings' files (empty: only planned)."""
    for f in ("causal_conv1d/fwd.cu", "causal_conv1d/host.cpp", "causal_conv1d/stable/binding.cpp",
              "causal_conv1d/classic/binding.cpp", "common/stable/errors.cpp", "common/classic/errors.cpp"):
        path = tmp_path / "csrc" / f
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    return tmp_path


def _kwargs(root: Path, binding: str) -> dict:
    env = dict(os.environ, MAMBA_KERNELS_FORCE_BUILD="1", TORCH_CUDA_ARCH_LIST="9.0",
               CUDA_HOME=str(NVCC.parent.parent), MAMBA_KERNELS_BINDING=binding)
    return setup_glue.setup_kwargs(str(root), env)


@needs_nvcc
def test_stable_setup_defines_the_limited_api_where_the_tags_promise_it(tmp_path, cpp_extension):
    kwargs = _kwargs(_tree(tmp_path), "stable")
    (ext,) = kwargs["ext_modules"]
    assert ext.py_limited_api is True  # the .abi3 file name
    assert kwargs["options"]["bdist_wheel"]["py_limited_api"] == variant.python_tag(support.STABLE_ABI_PYTHON)
    for kind in ("cxx", "nvcc"):
        assert ext.extra_compile_args[kind].count(DEFINE) == 1, (kind, ext.extra_compile_args[kind])
    # torch (>= 2.7) appends its own Py_LIMITED_API to such an extension: the same value as ours
    limited = build_binding.LIMITED_API
    assert getattr(cpp_extension, "min_supported_cpython", limited) == limited


@needs_nvcc
def test_classic_setup_has_no_limited_api(tmp_path, cpp_extension):
    pytest.importorskip("torch")
    kwargs = _kwargs(_tree(tmp_path), "classic")
    (ext,) = kwargs["ext_modules"]
    assert not ext.py_limited_api and "options" not in kwargs
    for kind in ("cxx", "nvcc"):
        assert not any("Py_LIMITED_API" in x for x in ext.extra_compile_args[kind]), kind
