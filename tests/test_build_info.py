"""Build metadata: the generated header, the source revision, and the runtime guard that
compares an extension's BUILD_INFO with the running torch."""

import json
import platform
import shlex
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from mamba_kernels.build import archs as build_archs
from mamba_kernels.build import build_info as binfo
from mamba_kernels.build import torch_env
from mamba_kernels.facts import release_index
from mamba_kernels.runtime import buildinfo, dispatch


def sample_info(**over):
    plan = build_archs.ArchPlan(*build_archs.parse_arch_list("8.0;9.0+PTX"), "x")
    facts = torch_env.TorchFacts("2.14.1+cu130", "13.0", True, "/nowhere")
    info = binfo.build_info(
        torch=facts, nvcc_version="13.0", cxx11_abi=True, host_compiler='gcc 12.2.0 "quoted" \\ path',
        cxx_std=20, arch_plan=plan, platform="linux_x86_64", revision="abc123", release=True,
        version="0.1.0+cu130torch2.14",
    )
    info.update(over)
    return info


def stable_info(**over):
    plan = build_archs.ArchPlan(*build_archs.parse_arch_list("9.0"), "x")
    facts = torch_env.TorchFacts("2.14.1+cu130", "13.0", True, "/nowhere")
    info = binfo.build_info(
        torch=facts, nvcc_version="13.0", cxx11_abi=True, host_compiler="gcc 12.2.0", cxx_std=20,
        arch_plan=plan, platform="linux_x86_64", revision="abc123", release=True,
        version="0.1.0+cu130stable2.10", binding="stable",
    )
    info.update(over)
    return json.dumps(info)


def test_the_written_record_is_the_schema():
    # one definition (buildinfo.SCHEMA): the build writes exactly its keys, in its order, and
    # the reader accepts what the build writes
    for info in (sample_info(), json.loads(stable_info())):
        assert list(info) == [f.key for f in buildinfo.SCHEMA]
        assert buildinfo.parse(json.dumps(info)).raw == info
    assert set(buildinfo.STABLE_KEYS) <= set(buildinfo.FIELDS)
    with pytest.raises(ValueError, match=r"missing \['cuda_major'\], unknown \['cuda'\]"):
        buildinfo.record(**{**{k: v for k, v in sample_info().items() if k != "cuda_major"}, "cuda": 13})


def test_build_info_records_binding_target_and_cuda_major():
    classic = sample_info()
    assert (classic["binding"], classic["stable_target"], classic["cuda_major"]) == ("classic", None, 13)
    stable = json.loads(stable_info())
    assert (stable["binding"], stable["stable_target"], stable["cuda_major"]) == ("stable", "2.10", 13)
    parsed = buildinfo.parse(stable_info())
    assert parsed.stable and parsed.stable_target == "2.10"
    assert parsed.variant.stable and parsed.variant.torch == "2.10"
    assert "the stable ABI from torch 2.10 (built against torch 2.14.1+cu130)" in parsed.describe()


@pytest.mark.parametrize("running", ["2.10.0+cu130", "2.11.0+cu130", "2.14.1+cu130", "2.15.0+cu132"])
def test_stable_binary_runs_on_every_torch_from_its_target(running):
    """No torch-minor rule for a stable binary: any torch >= its target with its CUDA major."""
    cuda = "13.2" if running.endswith("cu132") else "13.0"
    assert buildinfo.check_text("causal_conv1d._cuda", stable_info(), running, cuda, True) is None
    # the stable ABI is C: the C++ ABI does not matter
    assert buildinfo.check_text("causal_conv1d._cuda", stable_info(), running, cuda, False) is None


def test_stable_binary_refuses_a_torch_older_than_its_target():
    msg = buildinfo.check_text("causal_conv1d._cuda", stable_info(), "2.9.1+cu130", "13.0", True)
    assert "causal_conv1d._cuda was built for the stable ABI from torch 2.10" in msg
    assert "it needs torch >= 2.10 (stable ABI), the running torch is 2.9" in msg
    assert "'mamba-kernels==0.1.0+cu130torch2.9'" in msg  # the classic wheel serves torch 2.9


def test_stable_binary_refuses_another_cuda_major():
    msg = buildinfo.check_text("selective_scan._cuda", stable_info(), "2.11.0+cu128", "12.8", True)
    assert "CUDA 13.0 has another major version than torch's CUDA 12.8" in msg
    assert "'mamba-kernels==0.1.0+cu128stable2.10'" in msg


def test_stable_binary_refuses_free_threaded_python(monkeypatch):
    monkeypatch.setattr(buildinfo, "free_threaded", lambda: True)
    msg = buildinfo.check_text("causal_conv1d._cuda", stable_info(), "2.14.1+cu130", "13.0", True)
    assert "it is a stable-ABI (abi3) module, which a free-threaded CPython cannot load" in msg
    assert "Fix: use a CPython build with the GIL" in msg and "MAMBA_KERNELS_BINDING=classic" in msg
    # a classic binary is not an abi3 module: free threading is no reason to refuse it
    assert buildinfo.check_text("m", json.dumps(sample_info()), "2.14.1+cu130", "13.0", True) is None


def test_classic_binary_keeps_the_exact_minor_rule():
    msg = buildinfo.check_text("m", json.dumps(sample_info()), "2.15.0+cu130", "13.0", True)
    assert "torch 2.14 != running torch 2.15" in msg


@pytest.mark.parametrize(
    "over, error",
    [
        ({"binding": "pybind"}, "binding must be 'classic' or 'stable'"),
        ({"stable_target": None}, "stable_target must be a string like '2.10'"),
        ({"stable_target": "2"}, "stable_target must be a string like '2.10'"),
    ],
)
def test_stable_metadata_schema(over, error):
    data = json.loads(stable_info())
    data.update(over)
    with pytest.raises(ValueError, match=error):
        buildinfo.parse(json.dumps(data))


def test_build_info_fields():
    info = sample_info()
    assert info["torch_version"] == "2.14.1+cu130" and info["torch_cuda"] == "13.0"
    assert info["nvcc_version"] == "13.0" and info["cxx11_abi"] is True
    assert info["cxx_standard"] == "c++20" and info["source_revision"] == "abc123"
    assert info["sass"] == ["sm_80", "sm_90"] and info["ptx"] == ["compute_90"]
    assert info["package_version"] == "0.1.0+cu130torch2.14"


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
def test_header_is_a_c_string_holding_the_json(tmp_path):
    info = sample_info()
    (tmp_path / binfo.BUILD_INFO_HEADER).write_text(binfo.build_info_header(info))
    (tmp_path / "main.cpp").write_text(
        '#include <cstdio>\n#include "mamba_kernels_build_info.h"\n'
        "int main() { std::fputs(MAMBA_KERNELS_BUILD_INFO, stdout); return 0; }\n"
    )
    exe = tmp_path / "main"
    subprocess.run(["c++", "-I", str(tmp_path), str(tmp_path / "main.cpp"), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == info


def test_write_if_changed_keeps_mtime(tmp_path):
    path = tmp_path / "gen" / "h.h"
    binfo.write_if_changed(str(path), "a")
    before = path.stat().st_mtime_ns
    binfo.write_if_changed(str(path), "a")
    assert path.stat().st_mtime_ns == before
    binfo.write_if_changed(str(path), "b")
    assert path.read_text() == "b"


def test_source_revision_git_sdist_unknown(tmp_path):
    assert binfo.source_revision(str(tmp_path)) == "unknown"
    (tmp_path / binfo.REVISION_FILE).write_text("deadbeef\n")
    assert binfo.source_revision(str(tmp_path)) == "deadbeef"
    if shutil.which("git"):
        repo = tmp_path / "repo"
        repo.mkdir()
        git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run(git + ["init", "-q"], check=True)
        (repo / "f").write_text("1")
        subprocess.run(git + ["add", "f"], check=True)
        subprocess.run(git + ["commit", "-qm", "x"], check=True)
        head = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        assert binfo.source_revision(str(repo)) == head
        (repo / "f").write_text("2")
        assert binfo.source_revision(str(repo)) == head + "-dirty"


# ----------------------------------------------------------------------------- the guard


def test_matching_info_passes():
    text = json.dumps(sample_info())
    assert buildinfo.check_text("causal_conv1d._cuda", text, "2.14.1+cu130", "13.0", True) is None
    assert buildinfo.check_text("causal_conv1d._cuda", text, "2.14.0+cu132", "13.2", True) is None


def test_torch_mismatch_names_built_running_and_fix():
    msg = buildinfo.check_text("causal_conv1d._cuda", json.dumps(sample_info()), "2.13.0+cu130", "13.0", True)
    assert "causal_conv1d._cuda was built for torch 2.14.1+cu130, CUDA 13.0 (nvcc 13.0), cxx11 ABI" in msg
    assert "running environment has torch 2.13.0+cu130, CUDA 13.0, cxx11 ABI" in msg
    assert "torch 2.14 != running torch 2.13" in msg
    # torch >= 2.10 is served by the stable-ABI wheel of its CUDA major
    assert "pip install --no-deps --force-reinstall 'mamba-kernels==0.1.0+cu130stable2.10'" in msg
    msg = buildinfo.check_text("m", json.dumps(sample_info()), "2.9.1+cu128", "12.8", True)
    assert "'mamba-kernels==0.1.0+cu128torch2.9'" in msg
    assert "MAMBA_KERNELS_FORCE_BUILD=1 pip install --no-build-isolation" in msg


def _pasted_pip(fix: str) -> list:
    """The pip command of a fix as a user pastes it: up to the ', or rebuild' alternative."""
    return shlex.split(fix.split(", or rebuild")[0])


def test_fix_command_names_the_variant_index(monkeypatch):
    """Without --index-url the pinned local version is on no index pip reads (issue 17)."""
    monkeypatch.delenv(release_index.ENV_VAR, raising=False)
    argv = _pasted_pip(buildinfo.fix_command("2.14.1+cu130", "13.0", True, "0.1.0"))
    assert argv == ["pip", "install", "--no-deps", "--force-reinstall",
                    "mamba-kernels==0.1.0+cu130stable2.10",
                    "--index-url", f"{release_index.RELEASE_INDEX}cu130stable2.10/simple/"]
    argv = _pasted_pip(buildinfo.fix_command("2.9.1+cu128", "12.8", True, "0.1.0"))
    assert argv[-2:] == ["--index-url", f"{release_index.RELEASE_INDEX}cu128torch2.9/simple/"]
    # an index with no per-variant pages (a wheel folder): the resolver's command, which reads it
    monkeypatch.setenv(release_index.ENV_VAR, "/nowhere/wheelhouse")
    fix = buildinfo.fix_command("2.14.1+cu130", "13.0", True, "0.1.0")
    assert fix.startswith("python -m mamba_kernels install (")
    assert "mamba-kernels==0.1.0+cu130stable2.10" in fix


def test_fix_command_works_when_pasted(monkeypatch, tmp_path):
    """pip resolves the pasted command against a site ``index`` wrote (dry run: nothing installed)."""
    from test_index import make_wheel

    from mamba_kernels.release import index

    make_wheel(tmp_path / "in", version="0.1.0+cu130stable2.10", py="cp310", abi="abi3",
               plat=f"manylinux_2_17_{platform.machine()}", requires="torch>=2.10")
    index.write_index(tmp_path / "in", tmp_path / "site")
    monkeypatch.setenv(release_index.ENV_VAR, str(tmp_path / "site"))
    argv = _pasted_pip(buildinfo.fix_command("2.14.1+cu130", "13.0", True, "0.1.0"))
    assert argv[:2] == ["pip", "install"] and "--index-url" in argv
    r = subprocess.run([sys.executable, "-m", "pip", *argv[1:], "--dry-run", "--quiet", "--report", "-",
                        "--disable-pip-version-check"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert [i["metadata"]["version"] for i in json.loads(r.stdout)["install"]] == ["0.1.0+cu130stable2.10"]


def test_cuda_and_abi_mismatches():
    text = json.dumps(sample_info())
    msg = buildinfo.check_text("m", text, "2.14.1+cu126", "12.6", True)
    assert "another major version" in msg and "another CUDA major than torch's 12.6" in msg
    assert "'mamba-kernels==0.1.0+cu126stable2.10'" in msg
    msg = buildinfo.check_text("m", json.dumps(sample_info(torch_cuda="13.2")), "2.14.1", "13.0", True)
    assert "CUDA 13.2 is newer than torch's CUDA 13.0" in msg
    msg = buildinfo.check_text("m", text, "2.14.1", "13.0", False)
    assert "C++ ABI cxx11 != running torch's pre-cxx11" in msg
    msg = buildinfo.check_text("m", text, "2.14.1+cpu", None, True)
    assert "no CUDA" in msg and "install a CUDA build of torch" in msg


def test_missing_or_broken_metadata_is_a_mismatch():
    assert "carries no build metadata" in buildinfo.check_text("m", None, "2.14.1", "13.0", True)
    assert "not JSON" in buildinfo.check_text("m", "{not json", "2.14.1", "13.0", True)
    msg = buildinfo.check_text("m", "{}", "2.14.1", "13.0", True)
    assert "lacks torch_version, torch_cuda, nvcc_version, cxx11_abi" in msg
    with pytest.raises(ValueError, match="cxx11_abi must be true, false or null"):
        buildinfo.parse(json.dumps(sample_info(cxx11_abi="yes")))
    with pytest.raises(ValueError, match="must be a JSON object"):
        buildinfo.parse("[1]")


def test_check_module_against_the_running_torch():
    good = types.ModuleType("fake_good")
    good.BUILD_INFO = buildinfo.matching_build_info()
    assert buildinfo.check_module(good) is None
    bad = types.ModuleType("fake_bad")
    old = sample_info(torch_version="2.1.2+cu118", torch_cuda="11.8", nvcc_version="11.8")
    bad.BUILD_INFO = json.dumps(old)
    msg = buildinfo.check_module(bad)
    assert msg.startswith("fake_bad was built for torch 2.1.2+cu118")
    assert f"running environment has torch {torch.__version__}" in msg
    assert buildinfo.check_module(types.ModuleType("fake_none")).startswith("fake_none carries no build")


def test_dispatch_treats_a_mismatched_extension_as_unavailable(fresh):
    tmp_path = fresh
    stale = json.dumps(sample_info(torch_version="2.1.2+cu118", torch_cuda="11.8", nvcc_version="11.8"))
    (tmp_path / "mk_stale_ext.py").write_text(f"BUILD_INFO = {stale!r}\n")
    (tmp_path / "mk_fresh_ext.py").write_text(f"BUILD_INFO = {buildinfo.matching_build_info()!r}\n")
    sys.modules.pop("mk_stale_ext", None)
    sys.modules.pop("mk_fresh_ext", None)
    dispatch.EXTENSIONS["causal_conv1d"] = "mk_stale_ext"
    dispatch.EXTENSIONS["selective_scan"] = "mk_fresh_ext"
    report = dispatch.backends()
    assert report["causal_conv1d"]["backend"] == "reference"
    assert "mk_stale_ext was built for torch 2.1.2+cu118" in report["causal_conv1d"]["reason"]
    assert report["selective_scan"]["backend"] == "cuda"
    with pytest.warns(RuntimeWarning) as record:
        assert dispatch.use_cuda("causal_conv1d", "cuda") is False
    text = str(record[0].message)
    assert text.count("Fix:") == 1 and "mamba-kernels==0.1.0+" in text


def test_build_info_is_found_in_a_binary_whatever_its_key_order():
    """ci/build_cell.py's verify reads BUILD_INFO out of a wheel's binary through
    buildinfo.find_in_binary, the one parser: other JSON-like strings and the key order do not
    matter (the old pattern needed cxx11_abi first and torch_version last)."""
    info = {"torch_version": "2.14.1+cu130", "format": 1, "torch_cuda": "13.0", "nvcc_version": "13.0",
            "cxx11_abi": True, "sass": ["sm_90"], "ptx": [], "platform": "linux_x86_64"}
    blob = (b"\x7fELF\x00junk{\"not\": \"ours\"}\x00{broken\x00"
            + json.dumps(info).encode() + b"\x00tail{\"cxx11_abi\":true}\x00")
    found = buildinfo.find_in_binary(blob)
    assert found is not None and found.raw == info
    assert buildinfo.find_in_binary(b"\x00{\"a\": 1}\x00no info here\x00") is None


def test_the_rebuild_hint_names_the_source_this_install_came_from(tmp_path):
    """An editable or local-folder install is rebuilt from its checkout (direct_url.json, else the
    folder the running package lives in), never from ``.``, which is wherever the reader stands;
    an install from anything else, from the sdist. Asked from two folders: the answer is the same."""
    import mamba_kernels

    root = Path(mamba_kernels.__file__).resolve().parents[1]
    from_checkout = (root / "pyproject.toml").is_file() and 'name = "mamba-kernels"' in (
        root / "pyproject.toml").read_text()
    answers = set()
    for cwd in (tmp_path, root):
        code = ("from mamba_kernels.runtime import buildinfo as b; "
                "print(b.installed_source()[1]); print(b.rebuild_command('9.0'))")
        r = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        answers.add(r.stdout)
    (answer,) = answers
    what, cmd = answer.splitlines()
    assert cmd.startswith("TORCH_CUDA_ARCH_LIST=9.0 MAMBA_KERNELS_FORCE_BUILD=1 pip install "
                          "--no-build-isolation --no-deps --force-reinstall ")
    assert not cmd.endswith(" .")
    if from_checkout:
        assert what == f"the checkout {root}" and cmd.endswith(str(root)), answer
    else:
        assert what == "the sdist" and cmd.endswith(" mamba-kernels"), answer
