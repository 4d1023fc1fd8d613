"""The support table, pinned fact by fact against docs/COMPAT.md (sections cited): PyTorch's
release lists and, where they are silent (2.1-2.3, 2.15, exact Python ranges), the torch
files on PyPI as read on 2026-11-29."""

import dataclasses
import re
from pathlib import Path

import pytest

from mamba_kernels.facts import support

# docs/COMPAT.md §1.1: CUDA variants published per torch release (Linux x86_64), 2.4 to 2.14;
# 2.1-2.3 from PyTorch's index (cu118, cu121; PyPI's Linux wheel is the 12.1 build);
# 2.15: only the PyPI build (13.2) is confirmed.
CUDA_X86 = {
    "2.1": ("11.8", "12.1"),
    "2.2": ("11.8", "12.1"),
    "2.3": ("11.8", "12.1"),
    "2.4": ("11.8", "12.1", "12.4"),
    "2.5": ("11.8", "12.1", "12.4"),
    "2.6": ("11.8", "12.4", "12.6"),
    "2.7": ("11.8", "12.6", "12.8"),
    "2.8": ("12.6", "12.8", "12.9"),
    "2.9": ("12.6", "12.8", "13.0"),
    "2.10": ("12.6", "12.8", "13.0"),
    "2.11": ("12.6", "12.8", "13.0"),
    "2.12": ("12.6", "13.0", "13.2"),
    "2.13": ("12.6", "13.0", "13.2"),
    "2.14": ("12.6", "13.0", "13.2", "13.4"),
    "2.15": ("13.2",),
}
# docs/COMPAT.md §1.1, Linux aarch64: none before 2.7.
CUDA_AARCH64 = {
    "2.7": ("12.8",),
    "2.8": ("12.9",),
    "2.9": ("12.6", "12.8", "13.0"),
    "2.10": ("12.6", "12.8", "13.0"),
    "2.11": ("12.6", "12.8", "13.0"),
    "2.12": ("12.6", "13.0", "13.2"),
    "2.13": ("12.6", "13.0", "13.2"),
    "2.14": ("12.6", "13.0", "13.2", "13.4"),
    "2.15": ("13.2",),
}
# Python (CPython, not free-threaded): PyPI file lists (cp tags of each release).
PYTHONS = {
    "2.1": ("3.8", "3.11"),
    "2.2": ("3.8", "3.12"),
    "2.3": ("3.8", "3.12"),
    "2.4": ("3.8", "3.12"),
    "2.5": ("3.9", "3.13"),
    "2.6": ("3.9", "3.13"),
    "2.7": ("3.9", "3.13"),
    "2.8": ("3.9", "3.13"),
    "2.9": ("3.10", "3.14"),
    "2.10": ("3.10", "3.14"),
    "2.11": ("3.10", "3.14"),
    "2.12": ("3.10", "3.14"),
    "2.13": ("3.10", "3.14"),
    "2.14": ("3.10", "3.14"),
    "2.15": ("3.11", "3.15"),
}
# Where Windows differs (PyPI file list): torch 2.5.x has no cp313-win_amd64 wheel (Linux has
# cp313); the first Windows cp313 wheel is 2.6.0.
WIN_PYTHONS = {"2.5": ("3.9", "3.12")}
# docs/COMPAT.md §1.3: PyTorch's release lists, PyPI metadata for the rest.
PYPI_CUDA = {
    "2.1": "12.1", "2.2": "12.1", "2.3": "12.1", "2.4": "12.1", "2.5": "12.4", "2.6": "12.4",
    "2.7": "12.6", "2.8": "12.8", "2.9": "12.8", "2.10": "12.8", "2.11": "13.0", "2.12": "13.0",
    "2.13": "13.0", "2.14": "13.0", "2.15": "13.2",
}


def test_releases_cover_2_1_to_2_15_in_order():
    assert [r.torch for r in support.RELEASES] == list(CUDA_X86)


@pytest.mark.parametrize("torch", list(CUDA_X86))
def test_cuda_variants_per_platform(torch):
    rel = support.torch_release(torch)
    assert rel.cuda["linux_x86_64"] == CUDA_X86[torch]
    assert rel.cuda["linux_aarch64"] == CUDA_AARCH64.get(torch, ())
    # docs/COMPAT.md §1.1: no 13.4 build for Windows; 2.15's Windows CUDA builds are unconfirmed.
    expected_win = () if torch == "2.15" else tuple(c for c in CUDA_X86[torch] if c != "13.4")
    assert rel.cuda["win_amd64"] == expected_win


@pytest.mark.parametrize("torch", list(PYTHONS))
def test_python_range_and_pypi_cuda(torch):
    rel = support.torch_release(torch)
    lo, hi = PYTHONS[torch]
    assert rel.pythons[0] == lo and rel.pythons[-1] == hi
    assert len(rel.pythons) == int(hi.split(".")[1]) - int(lo.split(".")[1]) + 1
    assert rel.pypi_cuda == PYPI_CUDA[torch]
    assert rel.pypi_cuda in rel.cuda["linux_x86_64"]


def test_cxx11_abi_per_torch_cuda_platform():
    # docs/COMPAT.md §2: <= 2.5 pre-cxx11; 2.6 mixed (cu126 cxx11, cu118/cu124 pre); >= 2.7 cxx11.
    for torch in ("2.1", "2.4", "2.5"):
        rel = support.torch_release(torch)
        assert all(rel.cxx11_abi(c, "linux_x86_64") is False for c in rel.cuda["linux_x86_64"])
    rel = support.torch_release("2.6")
    assert rel.cxx11_abi("11.8", "linux_x86_64") is False
    assert rel.cxx11_abi("12.4", "linux_x86_64") is False
    assert rel.cxx11_abi("12.6", "linux_x86_64") is True
    assert rel.has_two_abis
    for rel in support.RELEASES:
        if rel.torch != "2.6":
            assert not rel.has_two_abis
        assert rel.cxx11_abi(rel.cuda["linux_x86_64"][0], "win_amd64") is None  # no ABI flag on MSVC
    for torch in ("2.7", "2.10", "2.14"):
        rel = support.torch_release(torch)
        assert all(rel.cxx11_abi(c, "linux_x86_64") is True for c in rel.cuda["linux_x86_64"])
        assert all(rel.cxx11_abi(c, "linux_aarch64") is True for c in rel.cuda["linux_aarch64"])


def test_manylinux_baseline_and_cxx_standard():
    # docs/COMPAT.md §3: torch <= 2.5 manylinux_2_17, >= 2.6 manylinux_2_28.
    # docs/COMPAT.md §4: C++20 from 2.13.
    for rel in support.RELEASES:
        minor = int(rel.torch.split(".")[1])
        assert rel.manylinux == ("manylinux_2_17" if minor <= 5 else "manylinux_2_28")
        assert rel.cxx_std == (20 if minor >= 13 else 17)


def test_default_archs_per_cuda_and_platform():
    # docs/COMPAT.md §5.1 (PyTorch's lists) from sm_75 up; aarch64 drops 7.5 and 8.6, adds 11.0 on CUDA 13.
    assert support.default_archs("11.8", "linux_x86_64") == ("7.5", "8.0", "8.6", "9.0")
    assert support.default_archs("12.6", "win_amd64") == ("7.5", "8.0", "8.6", "9.0")
    assert support.default_archs("12.8", "linux_x86_64")[-2:] == ("10.0", "12.0")
    assert support.default_archs("13.0", "linux_x86_64") == ("7.5", "8.0", "8.6", "9.0", "10.0", "12.0")
    assert support.default_archs("13.0", "linux_aarch64") == ("8.0", "9.0", "10.0", "11.0", "12.0")
    assert support.default_archs("12.6", "linux_aarch64") == ("8.0", "9.0")
    # Newer minor of a known major: the newest list of that major.
    assert support.default_archs("13.6", "linux_x86_64") == support.default_archs("13.4", "linux_x86_64")


def test_cuda_13_has_nothing_below_sm75_anywhere():
    # docs/COMPAT.md §5.2: nvcc 13 no longer targets sm < 75.
    for cuda in ("13.0", "13.2", "13.4"):
        for plat in support.PLATFORMS:
            assert min(float(a) for a in support.default_archs(cuda, plat)) >= 7.5


def test_every_cell_has_an_arch_list():
    for cell in support.cells():
        assert cell.archs, cell


def test_default_archs_bad_input():
    with pytest.raises(ValueError, match="platform must be one of"):
        support.default_archs("13.0", "macosx_arm64")
    with pytest.raises(ValueError, match="no default architecture list for CUDA 10.2"):
        support.default_archs("10.2", "linux_x86_64")
    with pytest.raises(ValueError, match="cuda must look like"):
        support.default_archs("thirteen", "linux_x86_64")


def test_cells_enumerate_exactly_what_torch_shipped():
    cells = [c for c in support.cells() if not c.stable]
    assert len(cells) == len(set(cells))
    # Independent count: per classic release (below the stable-ABI floor 2.10), per platform,
    # CUDA variants x Pythons >= 3.9.
    expected = 0
    for torch, xs in CUDA_X86.items():
        if tuple(int(x) for x in torch.split(".")) >= (2, 10):
            continue
        lo, hi = (int(v.split(".")[1]) for v in PYTHONS[torch])
        pys = len([m for m in range(lo, hi + 1) if m >= 9])
        win = () if torch == "2.15" else tuple(c for c in xs if c != "13.4")
        lo_w, hi_w = (int(v.split(".")[1]) for v in WIN_PYTHONS.get(torch, PYTHONS[torch]))
        pys_w = len([m for m in range(lo_w, hi_w + 1) if m >= 9])
        expected += pys * (len(xs) + len(CUDA_AARCH64.get(torch, ()))) + pys_w * len(win)
    assert len(cells) == expected == 240
    assert all(c.python != "3.8" for c in cells)  # this package needs Python >= 3.9


# docs/COMPAT.md §11: the stable cells, derived independently from the tables above. Per
# platform and CUDA major, one cell per distinct default architecture list (12.6 without
# Blackwell, 12.8 with it; every 13.x minor shares 13.0's list), at its oldest minor; built
# with the newest release that has a cp310 wheel (2.15 starts at 3.11) and a build of exactly
# that CUDA (torch 2.14 for 12.6 and 13.0; 2.11 is the last with a cu128 build), smoke-tested
# with torch 2.10 (the target).
STABLE = {
    (plat, cuda): (build, ("2.10", cuda))
    for plat in ("linux_x86_64", "linux_aarch64", "win_amd64")
    for cuda, build in (("12.6", ("2.14", "12.6")), ("12.8", ("2.11", "12.8")), ("13.0", ("2.14", "13.0")))
}


def test_stable_cells():
    cells = support.stable_cells()
    assert {(c.platform, c.cuda): (c.build_with, c.test_with) for c in cells} == STABLE
    assert len(cells) == 9
    for c in cells:
        assert (c.torch, c.python, c.cxx11_abi, c.stable) == ("2.10", "3.10", None, True)
        assert c.cxx_std == support.torch_release(c.build_with[0]).cxx_std  # the build torch's headers
        assert c.manylinux == (None if c.platform == "win_amd64" else "manylinux_2_28")
    # 485 cells before the stable ABI: the 245 of torch 2.10 to 2.15 gave way to 9.
    assert len(support.cells()) == 240 + 9 == 485 - 245 + 9


def test_the_stable_floor_splits_the_releases():
    assert support.STABLE_ABI_MIN_TORCH == "2.10" and support.STABLE_ABI_PYTHON == "3.10"
    assert [r.torch for r in support.classic_releases()][-1] == "2.9"
    assert [r.torch for r in support.stable_releases()] == ["2.10", "2.11", "2.12", "2.13", "2.14", "2.15"]
    assert not [c for c in support.cells() if not c.stable and c.torch in ("2.10", "2.14", "2.15")]


def test_stable_cells_serve_every_newer_torch_and_python():
    (cell,) = support.cells(torch="2.15", cuda="13.0", platform="linux_x86_64")
    assert cell.stable and cell.serves_torch("2.15") and cell.serves_torch("2.10")
    assert not cell.serves_torch("2.9") and cell.serves_python("3.14") and not cell.serves_python("3.9")
    assert {c.cuda for c in support.cells(torch="2.12", platform="win_amd64")} == {"12.6", "12.8", "13.0"}
    assert support.cells(torch="2.12", python="3.9") == []  # 3.9 is below the abi3 floor
    assert support.cells(torch="2.12", cxx11_abi=True) == []  # stable cells have no C++ ABI
    assert all(not c.stable for c in support.cells(torch="2.9"))


def test_a_new_architecture_list_makes_a_new_stable_cell():
    # A CUDA minor whose list differs from the one before it (as 12.8 added Blackwell) gets a
    # cell; one with the same list (13.2 after 13.0) is served by the older minor's cell.
    x86 = [c.cuda for c in support.stable_cells("linux_x86_64")]
    assert x86 == ["12.6", "12.8", "13.0"]
    assert support.default_archs("12.6", "linux_x86_64") != support.default_archs("12.8", "linux_x86_64")
    assert support.default_archs("13.2", "linux_x86_64") == support.default_archs("13.0", "linux_x86_64")


def test_cell_filters():
    cells = support.cells(torch="2.9", cuda="13.0", python="3.11", platform="linux_x86_64")
    assert cells == [
        support.Cell("2.9", "13.0", "3.11", "linux_x86_64", True, "manylinux_2_28", 17)
    ]
    assert {c.cuda for c in support.cells(torch="2.6", cxx11_abi=False)} == {"11.8", "12.4"}
    assert support.cells(cuda="13.4") == []  # served by the 13.0 stable cells
    assert support.cells(torch="2.1", platform="linux_aarch64") == []
    win = support.cells(platform="win_amd64")
    assert win and all(c.cxx11_abi is None and c.manylinux is None for c in win)


def test_cell_filter_bad_values():
    with pytest.raises(ValueError, match="torch must be one of the supported releases"):
        support.cells(torch="1.13")
    with pytest.raises(ValueError, match="platform must be one of"):
        support.cells(platform="linux")


def test_torch_release_accepts_full_versions():
    assert support.torch_release("2.14.1+cu130").torch == "2.14"
    assert support.torch_release("2.6.0").torch == "2.6"


@pytest.mark.parametrize("torch", list(PYTHONS))
def test_python_range_per_platform(torch):
    rel = support.torch_release(torch)
    for plat in support.PLATFORMS:
        lo, hi = WIN_PYTHONS.get(torch, PYTHONS[torch]) if plat == "win_amd64" else PYTHONS[torch]
        pys = rel.pythons_on(plat)
        assert (pys[0], pys[-1]) == (lo, hi)
        cells = [c for c in support.cells(torch=torch, platform=plat) if not c.stable]
        assert {c.python for c in cells} <= set(pys)


def test_no_torch_2_5_cp313_windows_cell():
    # torch 2.5 published no cp313 win_amd64 wheel; Linux x86_64 keeps cp313.
    assert support.cells(torch="2.5", python="3.13", platform="win_amd64") == []
    assert support.cells(torch="2.5", python="3.13", platform="linux_x86_64")


# The components of NVIDIA's PyPI CUDA toolkits, as each release's ``cuda-toolkit`` metapackage
# pins them (its Requires-Dist), restated. CCCL left the toolkit's numbering after 13.2: the 13.4
# toolkit pins CCCL 13.3.4.3.1 (there is no 13.4 CCCL on PyPI).
TOOLKIT_COMPONENTS = {
    "13.0": ("13.0.2", {"nvidia-cuda-nvcc": "13.0.88", "nvidia-nvvm": "13.0.88", "nvidia-cuda-crt": "13.0.88",
                        "nvidia-cuda-cccl": "13.0.85", "nvidia-cuda-runtime": "13.0.96"}),
    "13.2": ("13.2.2", {"nvidia-cuda-nvcc": "13.2.86", "nvidia-nvvm": "13.2.86", "nvidia-cuda-crt": "13.2.86",
                        "nvidia-cuda-cccl": "13.2.86", "nvidia-cuda-runtime": "13.2.86"}),
    "13.4": ("13.4.3", {"nvidia-cuda-nvcc": "13.4.92", "nvidia-nvvm": "13.4.92", "nvidia-cuda-crt": "13.4.92",
                        "nvidia-cuda-cccl": "13.3.4.3.1", "nvidia-cuda-runtime": "13.4.92"}),
}


def test_pypi_toolkit_pins_match_the_toolkit_release():
    for cuda, (release, comps) in TOOLKIT_COMPONENTS.items():
        tk = support.pypi_toolkit(cuda)
        assert tk.release == release and tk.release.startswith(cuda + ".")
        assert dict(tk.components) == comps
        for pkg, version in tk.components.items():
            # exact versions only: a wildcard (13.4.*) may match nothing (CCCL) or a later build
            assert re.fullmatch(r"\d+(\.\d+)+", version), (pkg, version)
            if pkg != "nvidia-cuda-cccl":
                assert version.startswith(cuda + "."), (cuda, pkg, version)
        assert [r.split("==")[0] for r in tk.requirements()] == list(comps)
        assert all("==" in r and "*" not in r for r in tk.requirements())


def test_every_cuda_13_linux_cell_has_a_pypi_toolkit():
    for cell in support.cells():
        if cell.platform != "win_amd64" and int(cell.cuda.split(".")[0]) >= 13:
            assert support.pypi_toolkit(cell.cuda).release.startswith(cell.cuda + ".")
    with pytest.raises(ValueError, match="no PyPI CUDA toolkit"):
        support.pypi_toolkit("12.6")


def test_msvc_flags_for_old_nvcc():
    # windows-2022 ships MSVC 19.4x; nvcc before 12.4 rejects it and the STL refuses old nvcc.
    assert support.nvcc_needs_msvc_override("11.8") and support.nvcc_needs_msvc_override("12.1")
    assert not any(support.nvcc_needs_msvc_override(c) for c in ("12.4", "12.6", "13.0", "13.2"))


# ----------------------------------------------------------------------------- the data file


def test_the_facts_are_data_and_round_trip_byte_for_byte(tmp_path):
    # mamba_kernels/facts/support.json is read by support.py alone, and is in canonical form: read,
    # written back, it is the same bytes (so ci/torch_watch.py's diffs show only what changed).
    raw = support.DATA_FILE.read_bytes()
    assert support.dump_data(support.read_data()).encode("utf-8") == raw
    copy = tmp_path / "support.json"
    support.write_data(support.read_data(), copy)
    assert copy.read_bytes() == raw
    assert support.write_data(support.read_data(copy), copy) and copy.read_bytes() == raw


def test_every_fact_in_the_module_comes_from_the_data_file():
    data = support.read_data()
    assert [support.release_from_data(e) for e in data["releases"]] == list(support.RELEASES)
    assert support.PLATFORMS == tuple(p["name"] for p in data["platforms"]) and support.MIN_PYTHON == (3, 9)
    assert [dataclasses.asdict(p) for p in support.PLATFORM_RECORDS] == [
        dict(p, machines=tuple(p["machines"])) for p in data["platforms"]]
    assert support.PYPI_CUOBJDUMP == data["pypi_cuobjdump"]
    assert support.LINUX_EXCLUDES == tuple(data["wheel_excludes"]["linux"])
    assert support.WINDOWS_TOOLKITS["13.0"] == "13.0.2"
    # The gcc-toolset a CUDA release needs in manylinux_2_28 (docs/COMPAT.md §7.2): newest GCC it
    # accepts, where the image's own GCC is newer.
    assert support.HOST_GCC == {"11.8": 11, "12.1": 12, "12.4": 13, "12.6": 13}
    assert {k for k in data if not k.startswith("_")} <= set(data["_about"])


def test_every_section_of_the_data_cites_compat_md():
    about = support.read_data()["_about"]
    for key, text in about.items():
        if key != "what":
            assert "docs/COMPAT.md §" in text, key


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["releases"][0].pop("note"), "keys must be"),
        (lambda d: d["releases"][0]["cuda"]["linux_x86_64"].reverse(), "oldest first"),
        (lambda d: d["releases"][0].update(pypi_cuda="9.9"), "not a linux_x86_64 variant"),
        (lambda d: d["releases"][0].update(cxx_std=23), "cxx_std"),
        (lambda d: d["releases"].append(d["releases"][0]), "distinct and oldest first"),
        (lambda d: d["releases"][0]["cuda"].pop("win_amd64"), "one list per platform"),
        (lambda d: d["platforms"][0].pop("runner"), r"platforms\[linux_x86_64\]: keys must be"),
        (lambda d: d["platforms"][1].update(pypi_wheel=True), "exactly one has torch's PyPI wheel"),
        (lambda d: d["platforms"][2].update(default_archs="riscv"), "no such list 'riscv'"),
        (lambda d: d["platforms"].append(d["platforms"][0]), "names must be distinct"),
    ],
)
def test_bad_data_is_refused_before_it_is_written(tmp_path, edit, message):
    data = support.read_data()
    edit(data)
    with pytest.raises(support.DataError, match=message):
        support.write_data(data, tmp_path / "support.json")
    assert not (tmp_path / "support.json").exists()


def test_the_data_file_ships_with_the_package():
    tomllib = pytest.importorskip("tomllib")  # the package itself reads only JSON

    root = Path(__file__).resolve().parent.parent
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    package = ".".join(support.DATA_FILE.parent.relative_to(root).parts)
    assert package in pyproject["packages"]
    assert support.DATA_FILE.name in pyproject["package-data"][package]


# ----------------------------------------------------------------------------- toolkit components


def test_every_windows_cuda_of_the_matrix_has_installer_components():
    # The network installer stops at a name it does not know (docs/COMPAT.md §6.2).
    for cuda in sorted({c.cuda for c in support.cells(platform="win_amd64")}):
        names = support.windows_components(cuda)
        assert names and all(n.endswith(f"_{cuda}") for n in names), cuda
        assert f"nvcc_{cuda}" in names and f"cudart_{cuda}" in names and f"cuobjdump_{cuda}" in names
        # crt and nvvm are separate subpackages only from CUDA 13 on; nvcc_X.Y holds them before
        split = int(cuda.split(".")[0]) >= 13
        assert (f"crt_{cuda}" in names) is split and (f"nvvm_{cuda}" in names) is split, cuda
        assert support.WINDOWS_TOOLKITS[cuda].startswith(cuda + ".")
    with pytest.raises(ValueError, match="no Windows installer components"):
        support.windows_components("12.5")


def test_every_linux_cuda_below_13_of_the_matrix_has_a_toolkit_source():
    for cell in support.cells():
        if cell.platform == "win_amd64" or int(cell.cuda.split(".")[0]) >= 13:
            continue
        arch = "linux-x86_64" if cell.platform == "linux_x86_64" else "linux-sbsa"
        tk = support.linux_toolkit(cell.cuda, cell.manylinux, arch)
        assert tk.source in support.LINUX_TOOLKIT_SOURCES[cell.manylinux]
        if tk.source == "redist":
            assert set(tk.archives) == {"cuda_nvcc", "cuda_cudart", "cuda_cccl"}
            assert all(len(sha) == 64 for _, sha in tk.archives.values())
            assert tk.release.startswith(cell.cuda + ".")
        else:
            mm = cell.cuda.replace(".", "-")
            assert tk.packages == (f"cuda-nvcc-{mm}", f"cuda-cudart-devel-{mm}", f"cuda-cuobjdump-{mm}",
                                   f"cuda-cccl-{mm}")


def test_manylinux2014_cuda_12_4_comes_from_the_archives_not_the_rhel7_repository():
    # NVIDIA's RHEL 7 repository is not known to carry 12.4 (docs/COMPAT.md §6.1); the 9 cells of
    # torch 2.4 and 2.5 with CUDA 12.4 unpack the redistributable archives instead.
    cells = [c for c in support.cells() if c.manylinux == "manylinux_2_17" and c.cuda == "12.4"]
    assert len(cells) == 9
    tk = support.linux_toolkit("12.4", "manylinux_2_17")
    assert tk.source == "redist" and tk.release == "12.4.1"
    assert support.redist_url("cuda_nvcc", *tk.archives["cuda_nvcc"][:1], tk.arch) == (
        "https://developer.download.nvidia.com/compute/cuda/redist/cuda_nvcc/linux-x86_64/"
        "cuda_nvcc-linux-x86_64-12.4.131-archive.tar.xz")
    assert {support.linux_toolkit(c, "manylinux_2_17").source for c in ("11.8", "12.1")} == {"rhel7"}
    with pytest.raises(ValueError, match="no CUDA 12.4 toolkit is known for manylinux_2_17 .linux-sbsa."):
        support.linux_toolkit("12.4", "manylinux_2_17", "linux-sbsa")


def test_component_names_that_do_not_match_their_cuda_are_refused(tmp_path):
    data = support.read_data()
    data["windows_components"]["12.6"] = ["nvcc_12.8"]
    with pytest.raises(support.DataError, match="windows_components.12.6"):
        support.write_data(data, tmp_path / "support.json")


def test_manylinux_2_28_has_gcc_14_and_every_linux_cell_meets_a_gcc_its_nvcc_accepts():
    # pypa/manylinux builds manylinux_2_28 with gcc-toolset-14 (its switch to 15 was reverted);
    # NVIDIA's host compiler tables: 11.8 up to GCC 11, 12.1 up to 12, 12.4/12.6 up to 13,
    # 12.8/12.9 up to 14, 13.0/13.2 up to 15 (docs/COMPAT.md §7.2).
    assert support.IMAGE_GCC == {"manylinux2014": 10, "manylinux_2_28": 14}
    nvidia = {"11.8": 11, "12.1": 12, "12.4": 13, "12.6": 13, "12.8": 14, "12.9": 14, "13.0": 15, "13.2": 15}
    assert {c: support.NVCC_MAX_GCC[c] for c in nvidia} == nvidia
    seen = set()
    for cell in support.cells():
        if cell.platform == "win_amd64":
            continue
        image = "manylinux2014" if cell.manylinux == "manylinux_2_17" else cell.manylinux
        toolset = support.HOST_GCC.get(cell.cuda) if image == "manylinux_2_28" else None
        gcc = toolset or support.IMAGE_GCC[image]
        assert gcc <= support.NVCC_MAX_GCC[cell.cuda], (cell, gcc)
        if image == "manylinux_2_28":
            seen.add((cell.cuda, toolset))
    # CUDA 12.8, 12.9 and 13.0 (every 13.x cell) take the image's own GCC 14; older ones a gcc-toolset
    assert {cu for cu, ts in seen if ts is None} == {"12.8", "12.9", "13.0"}
    assert {(cu, ts) for cu, ts in seen if ts} == {("11.8", 11), ("12.4", 13), ("12.6", 13)}


def test_windows_cells_before_cuda_12_4_build_with_the_14_29_toolset_both_checks_accept():
    # windows-2022 has MSVC 19.44 (Visual Studio 2022 17.14), whose STL wants CUDA 12.4 or newer and
    # which nvcc before 12.4 refuses (it accepts 19.10 to 19.39): those cells select the VS 2019
    # 16.11 toolset (19.29), which the runner's Visual Studio installer adds (docs/COMPAT.md §7.1).
    toolset = support.msvc_toolset("11.8")
    assert toolset == support.msvc_toolset("12.1.1") == support.MSVC_TOOLSETS["14.29"]
    assert (toolset.version, toolset.msc_ver, toolset.vcvars_arg) == ("14.29", 1929, "-vcvars_ver=14.29")
    assert toolset.component == "Microsoft.VisualStudio.Component.VC.14.29.16.11.x86.x64"
    assert support.RUNNER_MSVC == {"windows-2022": 1944}
    assert support.RUNNER_STL_MIN_CUDA == {"windows-2022": "12.4"}
    windows_cudas = {c.cuda for c in support.cells(platform="win_amd64")}
    for cuda in windows_cudas:
        chosen = support.msvc_toolset(cuda)
        msvc = chosen.msc_ver if chosen else support.RUNNER_MSVC["windows-2022"]
        stl_min = chosen.stl_min_cuda if chosen else support.RUNNER_STL_MIN_CUDA["windows-2022"]
        assert support.NVCC_MSVC_OLDEST.get(cuda, 0) <= msvc < support.NVCC_MSVC_REFUSES[cuda], cuda
        assert support.versions.key(stl_min) <= support.versions.key(cuda), cuda
        assert (chosen is not None) == (cuda in ("11.8", "12.1")) == support.nvcc_needs_msvc_override(cuda)
    # the runner's default is no choice for those two: both checks would stop the compile
    assert all(support.RUNNER_MSVC["windows-2022"] >= support.NVCC_MSVC_REFUSES[c] for c in ("11.8", "12.1"))
