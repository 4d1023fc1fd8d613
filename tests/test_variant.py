"""Labels, wheel file names and the compatibility rules (mamba_kernels.facts.variant)."""

import pytest
from packaging.utils import parse_wheel_filename
from packaging.version import Version

from mamba_kernels.facts import support, variant, versions


@pytest.mark.parametrize(
    "torch, cuda, abi, expected",
    [
        ("2.14.1+cu130", "13.0", True, "cu130torch2.14"),
        ("2.1.2", "11.8", False, "cu118torch2.1"),
        ("2.11", "13.0", True, "cu130torch2.11"),
        ("2.6.0+cu126", "12.6", True, "cu126torch2.6cxx11"),
        ("2.6.0", "12.4", False, "cu124torch2.6precxx11"),
        ("2.6.0", "12.6", None, "cu126torch2.6"),  # Windows: no ABI
    ],
)
def test_label_and_parse_round_trip(torch, cuda, abi, expected):
    text = variant.label(torch, cuda, abi)
    assert text == expected
    back = variant.parse_label("+" + text)
    mm = ".".join(torch.split("+")[0].split(".")[:2])
    assert (back.torch, back.cuda) == (mm, cuda)
    assert back.cxx11_abi == (abi if mm == "2.6" else None)


def test_labelled_versions_are_pep440_and_already_normal():
    # METADATA and the file name must agree: the label must survive normalisation unchanged.
    for cell in support.cells(python="3.11"):
        full = variant.release_version("0.1.0", cell.torch, cell.cuda, cell.cxx11_abi)
        assert str(Version(full)) == full


def test_release_version_and_torch_pin():
    assert variant.release_version("0.1.0", "2.14.1", "13.0", True) == "0.1.0+cu130torch2.14"
    assert variant.torch_requirement("2.14.1+cu130") == "torch==2.14.*"
    with pytest.raises(ValueError, match="version must be a public version"):
        variant.release_version("0.1.0+local", "2.14", "13.0")


def test_bad_labels():
    for bad in ("cu13torch2.14", "cu130-torch2.14", "torch2.14", "cu130torch2", "cu130torch2.14cxx03"):
        with pytest.raises(ValueError, match="label must look like"):
            variant.parse_label(bad)
    with pytest.raises(ValueError, match="cuda minor must be a single digit"):
        variant.label("2.14", "12.10")
    with pytest.raises(ValueError, match="torch must look like"):
        variant.label("latest", "13.0")


@pytest.mark.parametrize(
    "cell, expected",
    [
        (
            support.Cell("2.14", "13.0", "3.11", "linux_x86_64", True, "manylinux_2_28", 20),
            "mamba_kernels-0.1.0+cu130torch2.14-cp311-cp311-manylinux_2_28_x86_64.whl",
        ),
        (
            support.Cell("2.4", "11.8", "3.9", "linux_x86_64", False, "manylinux_2_17", 17),
            "mamba_kernels-0.1.0+cu118torch2.4-cp39-cp39-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        ),
        (
            support.Cell("2.6", "12.4", "3.10", "linux_x86_64", False, "manylinux_2_28", 17),
            "mamba_kernels-0.1.0+cu124torch2.6precxx11-cp310-cp310-manylinux_2_28_x86_64.whl",
        ),
        (
            support.Cell("2.13", "13.2", "3.14", "linux_aarch64", True, "manylinux_2_28", 20),
            "mamba_kernels-0.1.0+cu132torch2.13-cp314-cp314-manylinux_2_28_aarch64.whl",
        ),
        (
            support.Cell("2.12", "12.6", "3.12", "win_amd64", None, None, 17),
            "mamba_kernels-0.1.0+cu126torch2.12-cp312-cp312-win_amd64.whl",
        ),
    ],
)
def test_wheel_name(cell, expected):
    assert variant.wheel_name("0.1.0", cell) == expected


def test_every_cell_wheel_name_parses_back_with_packaging_and_ours():
    names = [variant.wheel_name("0.1.0", c) for c in support.cells()]
    assert len(set(names)) == len(names)  # one file per cell
    for cell, name in zip(support.cells(), names):
        dist, version, _, tags = parse_wheel_filename(name)
        assert dist == "mamba-kernels" and str(version).startswith("0.1.0+")
        assert {t.interpreter for t in tags} == {variant.python_tag(cell.python)}
        info = variant.parse_wheel_name(name)
        assert info.version == "0.1.0" and info.python == cell.python
        assert info.platform == cell.platform
        assert (info.variant.torch, info.variant.cuda) == (cell.torch, cell.cuda)


def test_parse_unlabelled_and_bad_wheel_names():
    info = variant.parse_wheel_name("mamba_kernels-0.1.0-cp311-cp311-linux_x86_64.whl")
    assert info.variant is None and info.platform == "linux_x86_64"
    with pytest.raises(ValueError, match="filename must look like"):
        variant.parse_wheel_name("mamba_kernels-0.1.0-py3-none-any.whl")
    with pytest.raises(ValueError, match="filename must look like"):
        variant.parse_wheel_name("mamba_kernels-0.1.0.tar.gz")


def test_mismatches_follow_the_design_rules():
    built = variant.Variant("2.14", "13.0", True)
    assert variant.mismatches(built, "2.14.1+cu130", "13.0", True) == []
    assert variant.mismatches(built, "2.14.0", "13.2", True) == []  # newer CUDA minor at runtime is fine
    assert variant.mismatches(built, "2.13.0", "13.0", True) == ["torch 2.14 != running torch 2.13"]
    assert "newer than torch's CUDA 12.9" not in " ".join(variant.mismatches(built, "2.14", "12.9", True))
    assert "another major version" in " ".join(variant.mismatches(built, "2.14", "12.9", True))
    newer = variant.mismatches(variant.Variant("2.14", "13.2"), "2.14", "13.0", True)
    assert "newer than torch's CUDA" in newer[0]
    assert "C++ ABI cxx11 != running torch's pre-cxx11" in variant.mismatches(built, "2.14", "13.0", False)
    assert variant.mismatches(variant.Variant("2.14", "13.0", None), "2.14", "13.0", False) == []
    assert "no CUDA" in variant.mismatches(built, "2.14.1+cpu", None, True)[0]


def test_arch_runs():
    assert variant.arch_runs(["sm_80", "sm_90"], [], "9.0")
    assert variant.arch_runs(["sm_80"], [], "8.6")  # same major, higher minor: binary compatible
    assert not variant.arch_runs(["sm_86"], [], "8.0")
    assert not variant.arch_runs(["sm_90"], [], "10.0")
    assert variant.arch_runs(["sm_90"], ["compute_90"], "12.0")  # PTX JIT upwards
    assert not variant.arch_runs(["sm_120"], ["compute_120"], "9.0")
    assert variant.arch_runs(["sm_90a"], [], "9.0") and not variant.arch_runs(["sm_90a"], [], "10.0")


# ----------------------------------------------------------------------------- stable labels


@pytest.mark.parametrize(
    "cuda, target, expected",
    [("13.0", "2.10", "cu130stable2.10"), ("12.8", "2.10.1+cu128", "cu128stable2.10"),
     ("12.6", "2.13", "cu126stable2.13")],
)
def test_stable_label_round_trip(cuda, target, expected):
    text = variant.stable_label(cuda, target)
    assert text == expected
    back = variant.parse_label("+" + text)
    assert back == variant.Variant(versions.minor(target), cuda, None, stable=True)
    assert variant.variant_label(back) == text
    assert back.describe() == f"stable ABI from torch {versions.minor(target)}, CUDA {cuda}"


def test_describe_both_kinds():
    assert variant.describe_label("cu130stable2.10") == "stable ABI from torch 2.10, CUDA 13.0"
    assert variant.describe_label("+cu126torch2.6precxx11") == "torch 2.6, CUDA 12.6, C++ ABI pre-cxx11"
    assert variant.describe_label("cu126torch2.12") == "torch 2.12, CUDA 12.6"


def test_bad_stable_labels():
    for bad in ("cu130stable2", "cu13stable2.10", "cu130stable", "cu130-stable2.10", "cu130Stable2.10",
                "cu130stable2.10abi3"):
        with pytest.raises(ValueError, match=r"label must look like .*'cu130stable2.10'"):
            variant.parse_label(bad)
    with pytest.raises(ValueError, match="a stable label's target_torch must be at least 2.10"):
        variant.parse_label("cu130stable2.9")
    with pytest.raises(ValueError, match="a stable label has no C\\+\\+ ABI marker"):
        variant.parse_label("cu130stable2.10cxx11")
    with pytest.raises(ValueError, match="target_torch must be at least 2.10 .* got '2.9.1'"):
        variant.stable_label("13.0", "2.9.1")
    with pytest.raises(ValueError, match="target_torch must look like"):
        variant.stable_label("13.0", "newest")
    with pytest.raises(ValueError, match="cuda minor must be a single digit"):
        variant.stable_label("12.10", "2.10")


def test_stable_release_version_and_requirement():
    full = variant.stable_release_version("0.1.0", "13.0", "2.10")
    assert full == "0.1.0+cu130stable2.10" and str(Version(full)) == full
    assert variant.stable_torch_requirement("2.10.0") == "torch>=2.10"
    with pytest.raises(ValueError, match="version must be a public version"):
        variant.stable_release_version("0.1.0+x", "13.0", "2.10")


def test_stable_wheel_names():
    cell = support.Cell("2.10", "12.8", "3.10", "linux_aarch64", None, "manylinux_2_28", 20, stable=True)
    name = variant.wheel_name("0.1.0", cell)
    assert name == "mamba_kernels-0.1.0+cu128stable2.10-cp310-abi3-manylinux_2_28_aarch64.whl"
    _, version, _, tags = parse_wheel_filename(name)
    assert str(version) == "0.1.0+cu128stable2.10"
    assert {(t.interpreter, t.abi) for t in tags} == {("cp310", "abi3")}
    info = variant.parse_wheel_name(name)
    assert info.abi3 and info.python == "3.10" and info.variant.stable and info.platform == "linux_aarch64"
    assert variant.cell_torch_requirement(cell) == "torch>=2.10"
    for bad in ("mamba_kernels-0.1.0+cu128stable2.10-cp310-cp310-win_amd64.whl",
                "mamba_kernels-0.1.0+cu128torch2.8-cp310-abi3-win_amd64.whl"):
        with pytest.raises(ValueError, match="pair a stable label with the cpXY-abi3 tags"):
            variant.parse_wheel_name(bad)


def test_mismatches_of_a_stable_binary():
    built = variant.parse_label("cu128stable2.10")
    assert variant.mismatches(built, "2.10.0+cu128", "12.8", True) == []
    assert variant.mismatches(built, "2.15.0", "12.9", False) == []  # any newer torch, either C++ ABI
    assert variant.mismatches(built, "2.9.1", "12.8", True) == [
        "it needs torch >= 2.10 (stable ABI), the running torch is 2.9"]
    assert variant.mismatches(built, "2.14.1", "12.6", True) == ["CUDA 12.8 is newer than torch's CUDA 12.6"]
    assert "another major version" in variant.mismatches(built, "2.14.1", "13.0", True)[0]
