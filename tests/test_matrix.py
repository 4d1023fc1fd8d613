"""The build-matrix generator and the ``matrix`` verb.

Expected values are written out here from docs/COMPAT.md (sections named) and PyTorch's
conventions, not computed with the code under test.
"""

from __future__ import annotations

import json
import re

import matrix_counts
import pytest

from ci import cell_fields
from mamba_kernels.cli import main as cli
from mamba_kernels.facts import support, variant
from mamba_kernels.release import matrix


def run(capsys, *argv):
    code = cli.main(["matrix", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_every_cell_has_a_unique_id_and_wheel_name():
    cells = matrix.select()
    ids = [matrix.cell_id(c) for c in cells]
    wheels = [variant.wheel_name("0.1.0", c) for c in cells]
    assert len(set(ids)) == len(ids) == len(cells)
    assert len(set(wheels)) == len(wheels)
    for i in ids:
        assert re.fullmatch(r"cu\d{3}(torch\d+\.\d+(cxx11|precxx11)?-cp3\d+|stable2\.10-cp310)-"
                            r"(linux_x86_64|linux_aarch64|win_amd64)", i)


def test_find_cell_round_trips_and_rejects_unknown_ids():
    for c in matrix.select(torch="2.6") + matrix.select(binding="stable"):
        assert matrix.find_cell(matrix.cell_id(c)) == c
    with pytest.raises(ValueError, match=r"cell must be a cell id.*'cu999torch9.9-cp311-linux_x86_64'"):
        matrix.find_cell("cu999torch9.9-cp311-linux_x86_64")


def test_wheel_names_parse_back_to_their_cell():
    for c in matrix.select():
        info = variant.parse_wheel_name(variant.wheel_name("0.1.0", c))
        assert (info.variant.torch, info.variant.cuda, info.python, info.platform) == (
            c.torch, c.cuda, c.python, c.platform)
        assert info.variant.stable == info.abi3 == c.stable


# (torch, platform) -> (CUDA variants, number of CPython versions >= 3.9): docs/COMPAT.md §1, with
# Windows lacking 13.4 and aarch64 CUDA builds only from torch 2.7.
PINNED = {
    ("2.4", "linux_x86_64"): (("11.8", "12.1", "12.4"), 4),  # 3.9-3.12 (3.8 below our floor)
    ("2.4", "linux_aarch64"): ((), 0),
    ("2.6", "linux_x86_64"): (("11.8", "12.4", "12.6"), 5),
    ("2.7", "linux_aarch64"): (("12.8",), 5),
    ("2.8", "win_amd64"): (("12.6", "12.8", "12.9"), 5),
    ("2.9", "linux_aarch64"): (("12.6", "12.8", "13.0"), 5),  # 3.10-3.14
}
# From torch 2.10 on (docs/COMPAT.md §11) every release is served by the same stable cells:
# one cp310-abi3 wheel per platform for CUDA 12.6 (no Blackwell SASS), 12.8 (with it) and
# 13.0 (every 13.x minor has its list).
STABLE_CUDAS = ("12.6", "12.8", "13.0")


@pytest.mark.parametrize("torch", ["2.10", "2.12", "2.14", "2.15"])
@pytest.mark.parametrize("platform", support.PLATFORMS)
def test_releases_from_2_10_are_served_by_the_stable_cells(torch, platform):
    cells = matrix.select(torch=torch, platform=platform)
    assert tuple(c.cuda for c in cells) == STABLE_CUDAS
    assert all(c.stable and c.torch == "2.10" and c.python == "3.10" for c in cells)
    assert [matrix.cell_id(c) for c in cells] == [
        f"cu{cu.replace('.', '')}stable2.10-cp310-{platform}" for cu in STABLE_CUDAS]


@pytest.mark.parametrize("key", sorted(PINNED))
def test_cells_per_torch_and_platform_match_reference(key):
    torch, platform = key
    cudas, n_py = PINNED[key]
    cells = matrix.select(torch=torch, platform=platform)
    assert tuple(dict.fromkeys(c.cuda for c in cells)) == cudas
    assert len(cells) == len(cudas) * n_py
    assert all(c.torch == torch and c.platform == platform for c in cells)


def test_torch_2_6_linux_carries_both_abis_in_labels():
    ids = {matrix.cell_id(c) for c in matrix.select(torch="2.6", python="3.11", os="linux")}
    assert ids == {"cu118torch2.6precxx11-cp311-linux_x86_64", "cu124torch2.6precxx11-cp311-linux_x86_64",
                   "cu126torch2.6cxx11-cp311-linux_x86_64"}
    assert [c.cuda for c in matrix.select(torch="2.6", os="linux", abi="cxx11", python="3.9")] == ["12.6"]


def test_filters_combine_and_validate():
    cells = matrix.select(cuda="12.1")
    assert cells and {c.torch for c in cells} == {"2.1", "2.2", "2.3", "2.4", "2.5"}
    assert {c.platform for c in matrix.select(os="windows")} == {"win_amd64"}
    assert {c.platform for c in matrix.select(arch="aarch64")} == {"linux_aarch64"}
    assert not [c for c in matrix.select(os="windows") if c.cuda == "13.4"]  # docs/COMPAT.md §1.1
    assert {c.python for c in matrix.select(torch="2.9")} == {"3.10", "3.11", "3.12", "3.13", "3.14"}
    assert {c.python for c in matrix.select(torch="2.14")} == {"3.10"}  # cp310-abi3
    stable = matrix_counts.stable_count()
    assert stable > 0 and len(matrix.select(torch="2.14", python="3.13")) == stable  # abi3 serves 3.13
    assert len(matrix.select(binding="stable")) == stable
    assert not [c for c in matrix.select(binding="classic") if c.stable or c.torch == "2.10"]
    for kwargs, message in [
        ({"os": "macos"}, r"os must be one of linux, windows, got 'macos'"),
        ({"arch": "ppc64le"}, r"arch must be one of .*got 'ppc64le'"),
        ({"cuda": "12.3"}, r"cuda must be one of .*got '12.3'"),
        ({"python": "3.8"}, r"python must be one of .*got '3.8'"),
        ({"torch": "1.13"}, r"torch must be one of .*got '1.13'"),
        ({"abi": "cxx98"}, r"abi must be one of cxx11, pre-cxx11, got 'cxx98'"),
        ({"binding": "abi3"}, r"binding must be one of classic, stable, got 'abi3'"),
    ]:
        with pytest.raises(ValueError, match=message):
            matrix.select(**kwargs)


def test_a_torch_newer_than_the_table_gets_the_stable_cells(capsys):
    """The stable wheels serve every torch from their target on (the resolver accepts
    --torch 2.16.0+cu130): matrix --torch 2.16 lists them instead of refusing (issue 17)."""
    newest = support.RELEASES[-1].torch
    newer = f"{newest.split('.')[0]}.{int(newest.split('.')[1]) + 1}"
    stable = matrix.select(binding="stable")
    assert matrix.select(torch=newer) == stable == matrix.select(torch=newest)
    assert support.cells(torch=f"{newer}.0+cu130", cuda="13.0") == [c for c in stable if c.cuda == "13.0"]
    assert support.served_torch(f"{newer}.0+cu130") == newer and support.served_torch("2.9.1") == "2.9"
    assert matrix.select(torch=newer, binding="classic") == []
    code, out, _ = run(capsys, "--torch", newer, "--wheels")
    assert code == 0 and len(out.splitlines()) == len(stable)
    for older in ("2.0", "1.13", "nonsense"):  # older than the table, or no release at all
        with pytest.raises(ValueError, match=r"torch must be one of the supported releases .*or a newer"):
            matrix.select(torch=older)


def test_ci_fields_of_one_linux_cell():
    (cell,) = matrix.select(torch="2.9", cuda="13.0", python="3.11", platform="linux_x86_64")
    f = cell_fields.ci_fields(cell, "0.1.0")
    assert f["id"] == "cu130torch2.9-cp311-linux_x86_64"
    assert f["wheel"] == "mamba_kernels-0.1.0+cu130torch2.9-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert (f["label"], f["binding"], f["stable"], f["wheel_tags"]) == (
        "cu130torch2.9", "classic", False, "cp311-cp311")
    # PyTorch's cu130 list (docs/COMPAT.md §5.1), from sm_75, PTX for the newest.
    assert f["arch_list"] == "7.5;8.0;8.6;9.0;10.0;12.0+PTX"
    assert f["torch_index"] == f["test_torch_index"] == "https://download.pytorch.org/whl/cu130"
    assert (f["build_torch"], f["build_torch_cuda"], f["test_torch"], f["test_torch_cuda"]) == (
        "2.9", "13.0", "2.9", "13.0")
    assert f["torch_requirement"] == "torch==2.9.*"
    assert (f["runner"], f["cibw_build"], f["cibw_archs"], f["cibw_image"]) == (
        "ubuntu-24.04", "cp311-manylinux_x86_64", "x86_64", "manylinux_2_28")
    assert f["toolkit"] == "pypi"
    assert f["build_timeout_minutes"] < f["timeout_minutes"] <= 360  # hosted runners stop at 6 h


def test_ci_fields_of_the_stable_cells():
    (cell,) = matrix.select(binding="stable", cuda="12.8", platform="linux_x86_64")
    f = cell_fields.ci_fields(cell, "0.1.0")
    assert f["id"] == "cu128stable2.10-cp310-linux_x86_64"
    assert f["wheel"] == "mamba_kernels-0.1.0+cu128stable2.10-cp310-abi3-manylinux_2_28_x86_64.whl"
    assert (f["label"], f["binding"], f["stable"], f["wheel_tags"]) == (
        "cu128stable2.10", "stable", True, "cp310-abi3")
    assert f["describe"] == "stable ABI from torch 2.10, CUDA 12.8"
    assert f["torch_requirement"] == "torch>=2.10"
    # Built with nvcc 12.8 against torch 2.11's cu128 build (the newest release with one: the
    # build writes torch's CUDA into the label), smoke-tested on torch 2.10's cu128 build.
    assert (f["build_torch"], f["build_torch_cuda"], f["torch_index"]) == (
        "2.11", "12.8", "https://download.pytorch.org/whl/cu128")
    assert (f["test_torch"], f["test_torch_cuda"], f["test_torch_index"]) == (
        "2.10", "12.8", "https://download.pytorch.org/whl/cu128")
    assert (f["cibw_build"], f["cibw_image"], f["toolkit"]) == (
        "cp310-manylinux_x86_64", "manylinux_2_28", "nvidia-repo")
    assert f["arch_list"] == "7.5;8.0;8.6;9.0;10.0;12.0+PTX"  # Blackwell from CUDA 12.8
    (win,) = matrix.select(binding="stable", cuda="13.0", platform="win_amd64")
    f = cell_fields.ci_fields(win, "0.1.0")
    assert f["wheel"] == "mamba_kernels-0.1.0+cu130stable2.10-cp310-abi3-win_amd64.whl"
    assert (f["cibw_build"], f["toolkit"], f["build_torch"], f["test_torch"]) == (
        "cp310-win_amd64", "nvidia-installer", "2.14", "2.10")


def test_ci_fields_of_old_linux_aarch64_and_windows_cells():
    (old,) = matrix.select(torch="2.4", cuda="12.1", python="3.9", platform="linux_x86_64")
    f = cell_fields.ci_fields(old, "0.1.0")
    assert f["cibw_image"] == "manylinux2014"  # glibc 2.17 baseline for torch <= 2.5 (docs/COMPAT.md §3)
    assert f["wheel"].endswith("-cp39-cp39-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
    assert f["toolkit"] == "nvidia-repo" and f["torch_index"].endswith("/cu121")
    (arm,) = matrix.select(torch="2.9", cuda="13.0", python="3.12", platform="linux_aarch64")
    f = cell_fields.ci_fields(arm, "0.1.0")
    assert (f["runner"], f["cibw_build"], f["arch_list"]) == (
        "ubuntu-24.04-arm", "cp312-manylinux_aarch64", "8.0;9.0;10.0;11.0;12.0+PTX")
    (win,) = matrix.select(torch="2.9", cuda="12.6", python="3.13", platform="win_amd64")
    f = cell_fields.ci_fields(win, "0.1.0")
    assert (f["runner"], f["cibw_build"], f["cibw_image"], f["toolkit"]) == (
        "windows-2022", "cp313-win_amd64", None, "nvidia-installer")
    assert f["wheel"] == "mamba_kernels-0.1.0+cu126torch2.9-cp313-cp313-win_amd64.whl"


def test_github_matrix_fits_per_platform_and_refuses_oversize():
    for platform in support.PLATFORMS:
        cells = matrix.select(platform=platform)
        m = cell_fields.github_matrix(cells)
        assert len(m["include"]) == len(cells) <= cell_fields.GITHUB_MATRIX_LIMIT
    everything = matrix.select()
    assert 0 < len(everything) == matrix_counts.wheel_counts()["total"] <= cell_fields.GITHUB_MATRIX_LIMIT
    with pytest.raises(ValueError, match="at most 256 cells"):
        cell_fields.github_matrix(everything + everything)


def test_cli_wheels_with_filters(capsys):
    code, out, _ = run(capsys, "--wheels", "--torch", "2.9", "--cuda", "13.0", "--python", "3.11",
                       "--os", "linux", "--arch", "x86_64")
    assert code == 0
    assert out.splitlines() == ["mamba_kernels-0.1.0+cu130torch2.9-cp311-cp311-manylinux_2_28_x86_64.whl"]
    code, out, _ = run(capsys, "--wheels", "--torch", "2.14", "--cuda", "13.0", "--python", "3.11",
                       "--os", "linux", "--arch", "x86_64")
    assert code == 0
    assert out.splitlines() == ["mamba_kernels-0.1.0+cu130stable2.10-cp310-abi3-manylinux_2_28_x86_64.whl"]


def test_ci_github_output_is_one_line_of_json(capsys):
    code = cell_fields.main(["--github", "--torch", "2.4", "--os", "windows"])
    out = capsys.readouterr().out
    assert code == 0 and out.count("\n") == 1
    m = json.loads(out)
    assert len(m["include"]) == 12 and {e["cibw_platform"] for e in m["include"]} == {"windows"}
    assert cell_fields.main(["--json", "--cuda", "12.3"]) == 2  # no such variant
    assert "cuda must be one of" in capsys.readouterr().err
    assert cell_fields.main(["--json", "--torch", "2.4", "--cuda", "13.0"]) == 1  # no such cell
    assert "no cell matches" in capsys.readouterr().err


def test_the_wheels_matrix_verb_carries_no_ci_plumbing(capsys):
    # runner labels, cibuildwheel fields, indexes and time limits are ci/cell_fields.py's alone
    code, out, _ = run(capsys, "--json", "--torch", "2.9", "--platform", "win_amd64")
    (planned, *_) = json.loads(out)["cells"]
    (cell,) = matrix.select(torch="2.9", cuda=planned["cuda"], python=planned["python"], platform="win_amd64")
    ci_only = set(cell_fields.ci_fields(cell)) - set(planned)
    assert code == 0 and ci_only == {"torch_index", "test_torch_index", "toolkit", "runner", "cibw_platform",
                                     "cibw_archs", "cibw_build", "cibw_image", "timeout_minutes",
                                     "build_timeout_minutes"}
    assert planned == matrix.cell_fields(cell)
    with pytest.raises(SystemExit):
        run(capsys, "--github")


def test_cli_json_and_counts_agree(capsys):
    code, out, _ = run(capsys, "--json", "--torch", "2.9")
    data = json.loads(out)
    assert code == 0 and data["counts"]["total"] == len(data["cells"]) == 45
    code, out, _ = run(capsys, "--counts", "--torch", "2.9")
    assert json.loads(out) == {"linux_x86_64": 15, "linux_aarch64": 15, "win_amd64": 15, "total": 45}


def test_cli_table_and_markdown(capsys):
    code, out, _ = run(capsys, "--torch", "2.9", "--os", "windows")
    assert code == 0 and out.splitlines()[-1] == "15 cells: linux_x86_64 0, linux_aarch64 0, win_amd64 15"
    code, out, _ = run(capsys, "--torch", "2.14", "--os", "windows")
    assert code == 0 and out.splitlines()[-1] == "3 cells: linux_x86_64 0, linux_aarch64 0, win_amd64 3"
    assert "2.10+  12.8  3.10+   win_amd64      stable" in out
    code, out, _ = run(capsys, "--markdown", "--torch", "2.9")
    assert "| 2.9 | win_amd64 | 12.6, 12.8, 13.0 | 3.10–3.14 | n/a | 15 |" in out
    assert out.strip().splitlines()[-1].endswith("**45** |")
    code, out, _ = run(capsys, "--markdown")
    assert ("| 2.10 and newer (stable ABI) | win_amd64 | 12.6, 12.8, 13.0 | 3.10 and newer (abi3) "
            "| n/a | 3 |") in out
    n = matrix_counts.wheel_counts()
    per_platform = ", ".join(f"{p} {n[p]}" for p in support.PLATFORMS)
    assert n["total"] > 0 and out.strip().splitlines()[-1] == (
        f"| **total** | {per_platform} | | | | **{n['total']}** |")


def test_cli_errors(capsys):
    code, _, err = run(capsys, "--os", "solaris")
    assert code == 2 and "os must be one of linux, windows, got 'solaris'" in err
    code, _, err = run(capsys, "--torch", "2.4", "--cuda", "13.0")
    assert code == 1 and "no cell matches" in err


def test_releasing_shows_the_generated_table_and_readme_the_counts():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    assert matrix.markdown_table(matrix.select()) in (root / "docs" / "RELEASING.md").read_text()
    readme = " ".join((root / "README.md").read_text().split())
    n = matrix.counts(matrix.select())
    assert f"the release builds {n['total']} wheels in all" in readme


def test_ci_fields_into_a_closed_pipe_stop_quietly():
    import subprocess
    import sys
    from pathlib import Path

    p = subprocess.Popen([sys.executable, "-m", "ci.cell_fields", "--json"],  # ~300 KB
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         cwd=Path(__file__).resolve().parent.parent)
    p.stdout.read(10)
    p.stdout.close()  # like `| head -c 10`
    err = p.stderr.read().decode()
    p.wait()
    assert "Traceback" not in err
