"""Environment detection: tags, torch build, GPUs and driver, toolkit; every field overridable."""

from __future__ import annotations

import sys

import pytest
import torch

from mamba_kernels.install import environment as env

SMI = "9.0, 575.57.08, NVIDIA H100 80GB HBM3\n8.6, 575.57.08, NVIDIA RTX A6000\n"


def _runner(smi_rc=127, smi_out=""):
    calls = []

    def run(cmd, timeout):
        calls.append((list(cmd), timeout))
        if cmd[0] == "nvidia-smi":
            return smi_rc, smi_out
        return 127, f"{cmd[0]}: not found"

    run.calls = calls
    return run


@pytest.mark.parametrize("plat,machine,name", [
    ("linux", "x86_64", "linux_x86_64"), ("linux", "aarch64", "linux_aarch64"),
    ("linux", "arm64", "linux_aarch64"), ("win32", "AMD64", "win_amd64"), ("darwin", "arm64", None),
    ("linux", "ppc64le", None),
])
def test_platform_names(plat, machine, name):
    assert env.platform_name(plat, machine) == name


def test_platform_tag_override_follows_glibc():
    plat, tags = env.platform_tags_for("manylinux_2_28_x86_64")
    assert plat == "linux_x86_64"
    assert env.tag_installs("manylinux_2_28_x86_64", tags)
    assert env.tag_installs("manylinux_2_17_x86_64.manylinux2014_x86_64", tags)
    assert not env.tag_installs("manylinux_2_34_x86_64", tags)
    assert not env.tag_installs("manylinux_2_28_aarch64", tags)
    plat, tags = env.platform_tags_for("manylinux2014_aarch64")
    assert plat == "linux_aarch64" and not env.tag_installs("manylinux_2_28_aarch64", tags)
    plat, tags = env.platform_tags_for("linux_aarch64")  # our name: any glibc
    assert env.tag_installs("manylinux_2_28_aarch64", tags) and not env.tag_installs("win_amd64", tags)
    assert env.platform_tags_for("win_amd64") == ("win_amd64", ("win_amd64",))
    assert env.platform_tags_for("Windows")[0] == "win_amd64"
    with pytest.raises(ValueError, match="--platform must be one of"):
        env.platform_tags_for("macosx_14_0_arm64")


def test_this_machines_platform_tags_follow_its_glibc(monkeypatch):
    monkeypatch.setattr(env, "glibc_version", lambda: (2, 28))
    tags = env.local_platform_tags("linux_aarch64")
    assert env.tag_installs("manylinux_2_28_aarch64", tags)
    assert env.tag_installs("manylinux2014_aarch64", tags)
    assert not env.tag_installs("manylinux_2_34_aarch64", tags)
    monkeypatch.setattr(env, "glibc_version", lambda: None)  # musl: no manylinux wheel installs
    assert not env.tag_installs("manylinux_2_17_x86_64", env.local_platform_tags("linux_x86_64"))
    assert env.local_platform_tags("win_amd64") == ("win_amd64",)


@pytest.mark.parametrize("version,cuda", [
    ("2.4.1+cu121", "12.1"), ("2.1.0+cu118", "11.8"), ("2.14.1+cu130", "13.0"), ("2.5.0+cpu", "cpu"),
    ("2.8.0a0+5228986c39.nv25.06", None), ("2.14.1", None),
])
def test_cuda_from_torch_version(version, cuda):
    assert env.cuda_of_torch_version(version) == cuda


def test_gpu_arch_parsing():
    assert env.parse_gpu_archs("8.0,9.0") == ("8.0", "9.0")
    assert env.parse_gpu_archs("80 90 sm_120 8.0") == ("8.0", "9.0", "12.0")
    with pytest.raises(ValueError, match="--gpu-arch"):
        env.parse_gpu_archs("ampere")


def test_nvidia_smi_output():
    gpus, driver = env.parse_nvidia_smi(SMI)
    assert [g.capability for g in gpus] == ["9.0", "8.6"] and driver == "575.57.08"
    assert gpus[0].name == "NVIDIA H100 80GB HBM3"
    assert env.parse_nvidia_smi("NVIDIA-SMI has failed\n") == ((), None)


def test_detect_this_machine_without_initialising_cuda():
    run = _runner(0, SMI)
    t = env.detect(runner=run, toolchain=False)
    assert t.python == f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert t.torch == torch.__version__
    assert t.cxx11_abi == bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    assert t.gpu_archs == ("9.0", "8.6") and t.driver == "575.57.08"
    assert t.sources["gpus"] == "detected (nvidia-smi)"
    assert run.calls[0][1] == env.NVIDIA_SMI_TIMEOUT  # with a timeout
    assert not torch.cuda.is_initialized()  # later forks stay safe
    if sys.platform.startswith("linux"):
        assert t.platform in ("linux_x86_64", "linux_aarch64") and t.platform_tags


def test_detect_without_nvidia_smi_sees_no_gpu():
    t = env.detect(runner=_runner(127), toolchain=False)
    assert t.gpus == () and t.driver is None and t.sources["gpus"] == "none visible (nvidia-smi)"


def test_every_field_can_be_given():
    t = env.detect(torch="2.8.0a0+5228986c39.nv25.06", cuda="12.9.1", python="3.12.3",
                   platform_tag="linux_aarch64", gpu_archs=["9.0"], runner=_runner(0, SMI), toolchain=False)
    assert (t.torch, t.torch_cuda, t.python, t.platform) == ("2.8.0a0+5228986c39.nv25.06", "12.9", "3.12",
                                                             "linux_aarch64")
    assert t.ngc and t.cxx11_abi is True and t.gpu_archs == ("9.0",) and t.driver is None
    assert t.sources["torch"] == t.sources["torch_cuda"] == t.sources["gpus"] == "given"
    assert env.detect(torch="2.6.0", cuda="12.4", cxx11_abi=True, platform_tag="linux_x86_64",
                      runner=_runner(), toolchain=False).cxx11_abi is True


def test_unstated_fields_come_from_the_version_or_the_support_table():
    kw = dict(runner=_runner(), toolchain=False)
    t = env.detect(torch="2.6.0+cu124", platform_tag="linux_x86_64", **kw)
    assert (t.torch_cuda, t.cxx11_abi) == ("12.4", False)  # torch 2.6 cu124: pre-cxx11
    t = env.detect(torch="2.6.0+cu126", platform_tag="linux_x86_64", **kw)
    assert (t.torch_cuda, t.cxx11_abi) == ("12.6", True)
    t = env.detect(torch="2.6.0+cu126", platform_tag="win_amd64", **kw)
    assert t.cxx11_abi is None and t.sources["cxx11_abi"] == "n/a"
    t = env.detect(torch="2.15.0", platform_tag="linux_x86_64", **kw)
    assert t.torch_cuda == "13.2" and "PyPI" in t.sources["torch_cuda"]
    t = env.detect(torch="2.5.1+cpu", platform_tag="linux_x86_64", **kw)
    assert t.torch_cuda is None
    t = env.detect(torch="2.14.1", cuda="none", platform_tag="linux_x86_64", **kw)
    assert t.torch_cuda is None


def test_bad_overrides_name_the_option():
    with pytest.raises(ValueError, match="--torch"):
        env.detect(torch="latest", runner=_runner(), toolchain=False)
    with pytest.raises(ValueError, match="--python"):
        env.detect(python="3", runner=_runner(), toolchain=False)


def test_toolkit_is_found_through_cuda_home(tmp_path):
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "nvcc").write_text("")

    def run(cmd, timeout):
        if cmd[0].endswith("nvcc"):
            return 0, "Cuda compilation tools, release 12.8, V12.8.93\n"
        return 127, ""

    t = env.detect(environ={"CUDA_HOME": str(home)}, runner=run)
    assert (t.cuda_home, t.cuda_home_how, t.nvcc) == (str(home), "CUDA_HOME", "12.8")
    d = t.as_dict()
    assert d["nvcc"] == "12.8" and d["cuda_home"] == str(home) and "sources" in d


def test_snapshot_still_reports():
    info = env.snapshot()
    assert info["torch"]["version"] == torch.__version__ and "backends" in info
