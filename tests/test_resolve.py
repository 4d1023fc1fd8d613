"""The resolver: real environments against an index of every wheel the matrix builds, the
sources it reads (manifest, PEP 503/691 pages, find-links pages, plain directories, HTTP), and
its answers (the wheel and why; exit 3 with every rejection, nearest first)."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import threading
import urllib.request
from urllib.parse import quote

import matrix_counts
import pytest

from mamba_kernels.cli import main as cli
from mamba_kernels.facts import variant
from mamba_kernels.facts.version import __version__
from mamba_kernels.install import environment, resolve
from mamba_kernels.release import index, matrix

WHEELS = [variant.wheel_name(__version__, c) for c in matrix.select()]
FAKE_SHA = "0" * 64


def _no_smi(cmd, timeout):
    return 127, "not found"


def _target(torch, cuda=None, python="3.11", platform="linux_x86_64", abi=None, gpus=("8.0",)):
    return environment.detect(torch=torch, cuda=cuda, python=python, platform_tag=platform, cxx11_abi=abi,
                              gpu_archs=None if gpus is None else list(gpus), runner=_no_smi,
                              toolchain=False)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    """manifest.json listing every wheel of the matrix (by name; no archs recorded)."""
    path = tmp_path_factory.mktemp("idx") / "manifest.json"
    wheels = [{"filename": w, "url": f"https://example.invalid/dl/{w}", "sha256": FAKE_SHA,
               "label": w.split("-")[1].split("+")[1]} for w in WHEELS]
    path.write_text(json.dumps({"schema": 2, "project": "mamba-kernels", "wheels": wheels}))
    return path


@pytest.fixture(scope="module")
def candidates(manifest):
    return resolve.read_sources([str(manifest)])


# (torch, cuda, python, platform, cxx11 abi, gpus) -> the wheel chosen (None: exit 3)
TABLE = [
    # torch 2.1, CUDA 11.8, Python 3.9: the oldest corner
    (("2.1.2+cu118", None, "3.9", "linux_x86_64", None, ("8.6",)),
     "mamba_kernels-0.1.0+cu118torch2.1-cp39-cp39-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"),
    (("2.1.0+cu121", None, "3.11", "linux_x86_64", None, ("9.0",)),
     "mamba_kernels-0.1.0+cu121torch2.1-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"),
    # a plain version with --cuda, as torch.__version__ and torch.version.cuda print them
    (("2.4.1", "12.4", "3.12", "linux_x86_64", None, ("8.0",)),
     "mamba_kernels-0.1.0+cu124torch2.4-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"),
    # both ABIs of torch 2.6
    (("2.6.0+cu124", None, "3.10", "linux_x86_64", False, ("8.0",)),
     "mamba_kernels-0.1.0+cu124torch2.6precxx11-cp310-cp310-manylinux_2_28_x86_64.whl"),
    (("2.6.0+cu126", None, "3.13", "linux_x86_64", True, ("8.0",)),
     "mamba_kernels-0.1.0+cu126torch2.6cxx11-cp313-cp313-manylinux_2_28_x86_64.whl"),
    (("2.6.0+cu124", None, "3.10", "linux_x86_64", None, ("8.0",)),  # ABI from the support table
     "mamba_kernels-0.1.0+cu124torch2.6precxx11-cp310-cp310-manylinux_2_28_x86_64.whl"),
    # Windows (no ABI marker)
    (("2.6.0+cu126", None, "3.12", "win_amd64", None, ("8.9",)),
     "mamba_kernels-0.1.0+cu126torch2.6-cp312-cp312-win_amd64.whl"),
    (("2.7.1+cu118", None, "3.9", "win_amd64", None, ("7.5",)),
     "mamba_kernels-0.1.0+cu118torch2.7-cp39-cp39-win_amd64.whl"),
    # Linux aarch64
    (("2.9.0+cu130", None, "3.12", "linux_aarch64", None, ("9.0",)),
     "mamba_kernels-0.1.0+cu130torch2.9-cp312-cp312-manylinux_2_28_aarch64.whl"),
    # torch 2.9: the newest per-minor wheels (a stable wheel needs torch >= 2.10)
    (("2.9.1+cu130", None, "3.12", "linux_x86_64", None, ("9.0",)),
     "mamba_kernels-0.1.0+cu130torch2.9-cp312-cp312-manylinux_2_28_x86_64.whl"),
    # an NGC container (torch 2.8 pre-release build, CUDA 12.9, cxx11)
    (("2.8.0a0+5228986c39.nv25.06", "12.9", "3.12", "linux_x86_64", None, ("9.0",)),
     "mamba_kernels-0.1.0+cu129torch2.8-cp312-cp312-manylinux_2_28_x86_64.whl"),
    # From torch 2.10 on: the stable wheels (cp310-abi3, one per platform and CUDA 12.6/12.8/13.0).
    # same CUDA major, lower minor: torch's CUDA 13.1 has no wheel, 13.0 runs
    (("2.10.0", "13.1", "3.12", "linux_aarch64", None, ("10.0",)),
     "mamba_kernels-0.1.0+cu130stable2.10-cp310-abi3-manylinux_2_28_aarch64.whl"),
    (("2.10.0+cu126", None, "3.10", "linux_aarch64", None, ("9.0",)),
     "mamba_kernels-0.1.0+cu126stable2.10-cp310-abi3-manylinux_2_28_aarch64.whl"),
    # torch's cu128 build: the 12.8 wheel (Blackwell SASS) over the 12.6 one
    (("2.11.0+cu128", None, "3.13", "linux_x86_64", None, ("10.0",)),
     "mamba_kernels-0.1.0+cu128stable2.10-cp310-abi3-manylinux_2_28_x86_64.whl"),
    # torch's cu126 build: the 12.8 wheel is too new a minor; 12.6's PTX (compute_90) runs on sm 12.0
    (("2.12.0+cu126", None, "3.11", "win_amd64", None, ("12.0",)),
     "mamba_kernels-0.1.0+cu126stable2.10-cp310-abi3-win_amd64.whl"),
    (("2.13.0+cu132", None, "3.12", "win_amd64", None, ("8.6",)),
     "mamba_kernels-0.1.0+cu130stable2.10-cp310-abi3-win_amd64.whl"),
    # the newest: Python 3.14, torch 2.14 / 2.15, CUDA 13.x
    (("2.14.1+cu130", None, "3.14", "linux_x86_64", None, ("12.0",)),
     "mamba_kernels-0.1.0+cu130stable2.10-cp310-abi3-manylinux_2_28_x86_64.whl"),
    (("2.14.1+cu134", None, "3.12", "linux_aarch64", None, ("11.0",)),
     "mamba_kernels-0.1.0+cu130stable2.10-cp310-abi3-manylinux_2_28_aarch64.whl"),
    (("2.15.0", None, "3.14", "linux_x86_64", None, ("9.0",)),  # PyPI torch: CUDA 13.2 from the table
     "mamba_kernels-0.1.0+cu130stable2.10-cp310-abi3-manylinux_2_28_x86_64.whl"),
    # a torch newer than the support table, on a Python newer than any wheel's tag: abi3 serves it
    (("2.16.0", "13.0", "3.15", "linux_x86_64", None, ("9.0",)),
     "mamba_kernels-0.1.0+cu130stable2.10-cp310-abi3-manylinux_2_28_x86_64.whl"),
    # an NGC container of a 2.10 pre-release (CUDA 13.1)
    (("2.10.0a0+b558c986e8.nv25.12", "13.1", "3.12", "linux_x86_64", None, ("9.0",)),
     "mamba_kernels-0.1.0+cu130stable2.10-cp310-abi3-manylinux_2_28_x86_64.whl"),
    # a GPU whose SASS is absent but runs the same-major binary (8.9 on sm_86)
    (("2.14.1+cu130", None, "3.11", "linux_x86_64", None, ("8.9",)),
     "mamba_kernels-0.1.0+cu130stable2.10-cp310-abi3-manylinux_2_28_x86_64.whl"),
    # no GPU visible: the architecture is not checked
    (("2.14.1+cu130", None, "3.11", "linux_x86_64", None, ()),
     "mamba_kernels-0.1.0+cu130stable2.10-cp310-abi3-manylinux_2_28_x86_64.whl"),
    # nothing fits
    (("2.14.1+cu130", None, "3.14t", "linux_x86_64", None, ("9.0",)), None),  # free-threaded: no abi3
    (("2.10.0+cu128", None, "3.9", "linux_x86_64", None, ("9.0",)), None),  # abi3 from CPython 3.10
    (("2.16.0", "14.0", "3.12", "linux_x86_64", None, ("9.0",)), None),  # a CUDA major with no wheel
    (("2.6.0+cu124", None, "3.12", "linux_x86_64", True, ("8.0",)), None),  # cu124 was pre-cxx11 only
    (("2.14.1+cu130", None, "3.11", "linux_x86_64", None, ("6.0",)), None),  # Pascal: not in any list
    (("2.1.2+cu121", None, "3.14", "linux_x86_64", None, ("8.0",)), None),  # torch 2.1 had no cp314
    (("2.12.0", "12.2", "3.11", "linux_x86_64", None, ("8.0",)), None),  # no CUDA 12.x <= 12.2 for 2.12
    (("2.5.1+cpu", None, "3.11", "linux_x86_64", None, ()), None),  # a CPU torch
    (("2.14.1+cu130", None, "3.11", "manylinux_2_17_x86_64", None, ()), None),  # glibc too old
]


def test_the_index_is_the_matrix(candidates):
    assert 0 < len(candidates) == len(WHEELS) == matrix_counts.wheel_counts()["total"]
    assert {c.filename for c in candidates} == set(WHEELS)
    plats = {variant.parse_wheel_name(w).platform for w in WHEELS}
    assert plats == {"linux_x86_64", "linux_aarch64", "win_amd64"}


@pytest.mark.parametrize("env,expected", TABLE, ids=[f"{e[0]}-{e[1]}-{e[2]}-{e[3]}-{e[4]}-{e[5]}"
                                                     for e, _ in TABLE])
def test_real_environments(candidates, env, expected):
    torch, cuda, python, plat, abi, gpus = env
    res = resolve.resolve(candidates, _target(torch, cuda, python, plat, abi, gpus))
    got = res.selected.candidate.filename if res.selected else None
    assert got == expected
    assert len(res.rejected) == len(WHEELS) - (1 if expected else 0)
    assert all(v.reasons for v in res.rejected)
    if expected:
        assert res.selected.candidate.sha256 == FAKE_SHA
        assert res.selected.candidate.url == f"https://example.invalid/dl/{expected}"


def test_why_and_nearest_first(candidates):
    res = resolve.resolve(candidates, _target("2.10.0", "13.1", "3.12", "linux_aarch64", None, ("9.0",)))
    why = "; ".join(res.selected.why)
    assert "CUDA 13.0 runs under torch's CUDA 13.1 (same major, lower minor)" in why
    assert "GPU sm 9.0 in SASS" in why and "support table for CUDA 13.0 on linux_aarch64" in why

    res = resolve.resolve(candidates, _target("2.6.0+cu124", None, "3.12", "linux_x86_64", True))
    first = res.rejected[0]
    assert first.candidate.filename == ("mamba_kernels-0.1.0+cu124torch2.6precxx11-cp312-cp312-"
                                        "manylinux_2_28_x86_64.whl")
    assert first.reasons == ["C++ ABI pre-cxx11 != given torch's cxx11"]
    counts = [len(v.reasons) for v in res.rejected]
    assert counts[:2] == [1, 1] and max(counts) > 1

    res = resolve.resolve(candidates, _target("2.14.1+cu130", None, "3.11", "linux_x86_64", None, ("6.0",)))
    assert res.rejected[0].candidate.filename.startswith("mamba_kernels-0.1.0+cu130stable2.10-cp310-abi3-")
    (reason,) = res.rejected[0].reasons
    assert "GPU sm 6.0 is neither in its SASS" in reason and "compute_120" in reason
    assert "support table for CUDA 13.0 on linux_x86_64 (by file name)" in reason


def _reasons(res, fragment):
    """The reasons of the one rejected candidate whose file name holds ``fragment``."""
    (v,) = [v for v in res.rejected if fragment in v.candidate.filename]
    return v.reasons


def test_stable_wheels_say_why_they_fit(candidates):
    res = resolve.resolve(candidates, _target("2.12.0+cu130", None, "3.13", "linux_x86_64", None, ("9.0",)))
    why = "; ".join(res.selected.why)
    assert "cp310-abi3 serves Python 3.13 (CPython >= 3.10)" in why
    assert ("torch 2.12.0+cu130 is at least 2.10: stable ABI from torch 2.10, CUDA 13.0 serves every "
            "torch from 2.10 on") in why
    assert "CUDA 13.0 is torch's CUDA (exact)" in why and "C++ ABI" not in why


def test_stable_wheels_are_rejected_with_clear_reasons(candidates):
    lin = "+{}stable2.10-cp310-abi3-manylinux_2_28_x86_64"
    # torch 2.9: every stable wheel needs torch >= 2.10; the per-minor wheels are the answer
    res = resolve.resolve(candidates, _target("2.9.1+cu128", None, "3.12", "linux_x86_64", None, ("9.0",)))
    assert "+cu128torch2.9-cp312" in res.selected.candidate.filename
    assert _reasons(res, lin.format("cu128")) == [
        "it needs torch >= 2.10 (stable ABI), the given torch is 2.9"]
    # torch's CUDA 12.6: the 12.8 wheel's minor is too new, the 13.0 one's major differs
    res = resolve.resolve(candidates, _target("2.14.0+cu126", None, "3.12", "linux_x86_64", None, ("9.0",)))
    assert lin.format("cu126") in res.selected.candidate.filename
    assert _reasons(res, lin.format("cu128")) == ["CUDA 12.8 is newer than torch's CUDA 12.6"]
    assert _reasons(res, lin.format("cu130")) == [
        "CUDA 13.0 has another major version than torch's CUDA 12.6"]
    # Python below the abi3 floor, and a free-threaded Python
    res = resolve.resolve(candidates, _target("2.10.0+cu130", None, "3.9", "linux_x86_64", None, ("9.0",)))
    assert res.selected is None
    assert _reasons(res, lin.format("cu130")) == [
        "cp310-abi3 needs CPython >= 3.10, the target is Python 3.9"]
    assert res.rejected[0].candidate.filename.endswith(lin.format("cu130") + ".whl")  # nearest first
    res = resolve.resolve(candidates, _target("2.14.1+cu130", None, "3.14t", "linux_x86_64", None, ("9.0",)))
    assert _reasons(res, lin.format("cu130")) == [
        "cp310-abi3 cannot serve Python 3.14 (free-threaded): the stable ABI (abi3) does not load on a "
        "free-threaded CPython; no wheel of ours is built for it"]
    assert "Python 3.14t (free-threaded)" in resolve.describe_target(res.target)


def test_a_per_minor_wheel_of_the_same_version_is_preferred_to_the_stable_one():
    # The matrix builds no per-minor wheel for torch >= 2.10; an index may still list one (an
    # older release, or a local build). Same CUDA and version: the classic one wins; a newer
    # version wins over either.
    stable = "mamba_kernels-0.1.0+cu130stable2.10-cp310-abi3-manylinux_2_28_x86_64.whl"
    classic = "mamba_kernels-0.1.0+cu130torch2.14-cp312-cp312-manylinux_2_28_x86_64.whl"
    cands = [resolve.Candidate(n, n) for n in (stable, classic)]
    res = resolve.resolve(cands, _target("2.14.1+cu130", None, "3.12"))
    assert res.selected.candidate.filename == classic
    assert res.rejected[0].reasons == [
        f"fits too, but {classic} is preferred: a per-minor build skips the stable ABI's call shim"]
    newer = resolve.Candidate(stable.replace("0.1.0+", "0.2.0+"), "x")
    res = resolve.resolve(cands + [newer], _target("2.14.1+cu130", None, "3.12"))
    assert res.selected.candidate is newer


def test_exact_cuda_first_then_the_closest_lower_minor(tmp_path):
    names = [variant.wheel_name(__version__, c) for c in matrix.select(torch="2.8", python="3.12",
                                                                       platform="linux_x86_64")]
    assert len(names) == 3  # cu126, cu128, cu129
    cands = [resolve.Candidate(n, n) for n in names]
    res = resolve.resolve(cands, _target("2.8.0", "12.9", "3.12"))
    assert "+cu129torch2.8" in res.selected.candidate.filename
    res = resolve.resolve([c for c in cands if "cu129" not in c.filename], _target("2.8.0", "12.9", "3.12"))
    assert "+cu128torch2.8" in res.selected.candidate.filename
    assert "fits too, but" in res.rejected[0].reasons[0] and "cu126" in res.rejected[0].candidate.filename
    newer = resolve.Candidate(names[2].replace("0.1.0+", "0.2.0+"), "x")
    res = resolve.resolve(cands + [newer], _target("2.8.0", "12.9", "3.12"))
    assert res.selected.candidate is newer


def test_arch_list_from_the_manifest_wins(tmp_path):
    name = "mamba_kernels-0.1.0+cu130torch2.14-cp311-cp311-manylinux_2_28_x86_64.whl"
    archs = {"causal_conv1d/_cuda.so": {"sass": ["sm_90"], "ptx": []}}
    m = tmp_path / "manifest.json"
    m.write_text(json.dumps({"schema": 2, "project": "mamba-kernels", "wheels": [
        {"filename": name, "url": name, "sha256": FAKE_SHA, "archs": archs}]}))
    cands = resolve.read_sources([str(m)])
    assert cands[0].url == str(tmp_path / name)  # relative to the manifest
    res = resolve.resolve(cands, _target("2.14.1+cu130", gpus=("8.0",)))
    assert res.selected is None
    assert "arch list from the manifest" in res.rejected[0].reasons[0]
    res = resolve.resolve(cands, _target("2.14.1+cu130", gpus=("9.0",)))
    assert "arch list from the manifest" in "; ".join(res.selected.why)


def _cli(argv, capsys):
    rc = cli.main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_text_json_and_exit_codes(manifest, capsys):
    base = ["resolve", "--index", str(manifest), "--python", "3.12", "--platform", "linux_x86_64"]
    rc, out, _ = _cli(base + ["--torch", "2.6.0+cu126", "--gpu-arch", "8.0,9.0"], capsys)
    assert rc == 0
    assert out.splitlines()[0] == ("mamba_kernels-0.1.0+cu126torch2.6cxx11-cp312-cp312-"
                                   "manylinux_2_28_x86_64.whl")
    assert "CUDA 12.6 is torch's CUDA (exact)" in out and "C++ ABI cxx11 is torch's" in out

    rc, out, _ = _cli(base + ["--torch", "2.6.0", "--cuda", "12.4", "--cxx11-abi", "1", "--json"], capsys)
    assert rc == resolve.EXIT_NO_MATCH == 3
    d = json.loads(out)
    assert d["selected"] is None and d["url"] is None and d["sha256"] is None and d["reason"]
    assert len(d["rejected"]) == len(WHEELS)
    assert d["rejected"][0] == {"file": "mamba_kernels-0.1.0+cu124torch2.6precxx11-cp312-cp312-"
                                        "manylinux_2_28_x86_64.whl",
                                "reasons": ["C++ ABI pre-cxx11 != given torch's cxx11"]}

    rc, out, _ = _cli(base + ["--torch", "2.14.1+cu130", "--gpu-arch", "6.1"], capsys)
    assert rc == 3 and out.startswith("no wheel fits:") and "GPU sm 6.1 is neither" in out
    assert out.count(".whl") == resolve.NEAREST_SHOWN  # the nearest few, by default
    assert f"and {len(WHEELS) - resolve.NEAREST_SHOWN} more (--all" in out
    rc, out, _ = _cli(base + ["--torch", "2.14.1+cu130", "--gpu-arch", "6.1", "--all"], capsys)
    assert rc == 3 and out.count(".whl") == len(WHEELS)  # every candidate listed

    rc, out, _ = _cli(base + ["--torch", "2.14.1+cu130", "--json"], capsys)
    d = json.loads(out)
    assert rc == 0 and d["sha256"] == FAKE_SHA
    assert d["selected"].endswith("+cu130stable2.10-cp310-abi3-manylinux_2_28_x86_64.whl")
    assert set(d) >= {"selected", "url", "sha256", "reason", "rejected"}

    rc, _, err = _cli(base + ["--torch", "2.14", "--gpu-arch", "volta"], capsys)
    assert rc == 2 and "--gpu-arch" in err


def test_plain_directory_by_file_name(tmp_path, capsys):
    for w in WHEELS:
        (tmp_path / w).touch()
    (tmp_path / "README.txt").touch()
    (tmp_path / "causal_conv1d-1.5.0+cu12torch2.4cxx11abiTRUE-cp311-cp311-linux_x86_64.whl").touch()
    rc, out, _ = _cli(["resolve", "--index", str(tmp_path), "--torch", "2.4.1+cu118", "--python", "3.9",
                       "--platform", "linux_x86_64", "--json"], capsys)
    d = json.loads(out)
    assert rc == 0 and d["selected"] == ("mamba_kernels-0.1.0+cu118torch2.4-cp39-cp39-"
                                         "manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
    assert d["url"] == str(tmp_path / d["selected"])
    assert d["sha256"] == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"  # empty file
    assert len(d["rejected"]) == len(WHEELS) - 1  # another project's wheel is no candidate


def test_unreadable_sources_are_one_line(tmp_path, capsys):
    rc, _, err = _cli(["resolve", "--index", str(tmp_path / "nope"), "--torch", "2.14"], capsys)
    assert rc == 2 and err.count("\n") == 1 and "no such file or directory" in err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    rc, _, err = _cli(["resolve", "--index", str(bad), "--torch", "2.14"], capsys)
    assert rc == 2 and "not valid JSON" in err and "Traceback" not in err
    rc, _, err = _cli(["resolve", "--index", "ftp://example.invalid/x", "--torch", "2.14"], capsys)
    assert rc == 2 and "path or an http(s) URL" in err


# ----------------------------------------------------------------------------- over HTTP

@pytest.fixture
def served(tmp_path):
    """A real index (the index writer's output, two variants) on 127.0.0.1, plus a PEP 691 page,
    a malformed page and a hanging path."""
    from test_index import make_wheel

    make_wheel(tmp_path / "in", version="0.1.0+cu130torch2.14", py="cp311", requires="torch==2.14.*")
    make_wheel(tmp_path / "in", version="0.1.0+cu128torch2.9", py="cp311", requires="torch==2.9.*")
    site = tmp_path / "site"
    manifest = index.write_index(tmp_path / "in", site)
    pep691 = {"meta": {"api-version": "1.1"}, "name": "mamba-kernels", "files": [
        {"filename": w["filename"], "url": "wheels/" + quote(w["filename"]),
         "hashes": {"sha256": w["sha256"]}}
        for w in manifest["wheels"]]}
    (site / "pep691.json").write_text(json.dumps(pep691))
    (site / "broken.html").write_text("<html><body><a href=>oops</a><p>nothing here</body>")
    release = threading.Event()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path.startswith("/hang"):
                release.wait(10)
                return
            super().do_GET()

    handler = functools.partial(Handler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", manifest
    release.set()
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("path", ["/", "/manifest.json", "/cu130torch2.14/simple/",
                                  "/cu130torch2.14/simple/mamba-kernels/", "/cu130torch2.14/find-links.html",
                                  "/pep691.json"])
def test_http_index_by_url(served, path, capsys):
    base, manifest = served
    rc, out, err = _cli(["resolve", "--index", base + path, "--torch", "2.14.1+cu130", "--python", "3.11",
                         "--platform", "linux_x86_64", "--gpu-arch", "9.0", "--json"], capsys)
    assert rc == 0, err
    d = json.loads(out)
    want = next(w for w in manifest["wheels"] if w["label"] == "cu130torch2.14")
    assert d["selected"] == want["filename"] and d["sha256"] == want["sha256"]
    assert d["url"] == f"{base}/wheels/{want['filename'].replace('+', '%2B')}"
    with urllib.request.urlopen(d["url"], timeout=10) as r:  # the URL it gives is the file
        assert hashlib.sha256(r.read()).hexdigest() == want["sha256"]


def test_http_failures(served, capsys):
    base, _ = served
    args = ["--torch", "2.14.1+cu130", "--python", "3.11", "--platform", "linux_x86_64"]
    rc, _, err = _cli(["resolve", "--index", base + "/hang", "--timeout", "0.5"] + args, capsys)
    assert rc == 2 and err.startswith("mamba-kernels resolve: --index ") and err.count("\n") == 1
    rc, _, err = _cli(["resolve", "--index", base + "/missing/"] + args, capsys)
    assert rc == 2 and "HTTP 404" in err
    rc, out, err = _cli(["resolve", "--index", base + "/broken.html"] + args, capsys)
    assert rc == 2 and "not an index" in err and "no wheel" not in out  # a page without wheels or links
