import pytest
import torch


def pytest_collection_modifyitems(config, items):
    """GPU tests are marked ``gpu`` and skipped when no CUDA device is visible."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _mamba2_kernels_on(request, monkeypatch):
    """GPU tests run the Mamba-2 ops' compiled kernels whatever MAMBA_KERNELS_MAMBA2_CUDA says in
    the environment that runs them (its default is on: mamba_kernels/runtime/knobs.py)."""
    if "gpu" in request.keywords:
        monkeypatch.setenv("MAMBA_KERNELS_MAMBA2_CUDA", "1")


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """Isolated dispatch state, and a temp dir on sys.path for fake extensions and installs."""
    from mamba_kernels.runtime import dispatch, knobs

    monkeypatch.setattr(dispatch, "_status", {})
    monkeypatch.setattr(dispatch, "_warned", set())
    monkeypatch.setattr(dispatch, "EXTENSIONS", dict(dispatch.EXTENSIONS))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(knobs.BACKEND_VAR, raising=False)
    return tmp_path
