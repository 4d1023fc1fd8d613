import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mamba_kernels


def _run(*args, env=None):
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "mamba_kernels", *args], capture_output=True, text=True, env=full_env
    )


def test_version():
    r = _run("--version")
    assert r.returncode == 0
    assert r.stdout.strip() == f"mamba-kernels {mamba_kernels.__version__}"


def test_info_json_reports_torch_and_backends():
    import torch

    r = _run("info", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["mamba_kernels"] == mamba_kernels.__version__
    assert info["torch"]["version"] == torch.__version__
    assert set(info["backends"]) == {"causal_conv1d", "selective_scan"}
    for b in info["backends"].values():
        assert b["backend"] in {"cuda", "reference", "error"} and b["reason"]


def test_info_text_names_each_kernel():
    r = _run("info", env={"MAMBA_KERNELS_BACKEND": "reference", "MAMBA_KERNELS_SCAN_STATES": "recompute"})
    assert r.returncode == 0, r.stderr
    assert "backend mode  reference" in r.stdout and "scan states   recompute" in r.stdout
    assert "causal_conv1d" in r.stdout and "selective_scan" in r.stdout


def test_bad_knob_is_a_one_line_error():
    r = _run("info", env={"MAMBA_KERNELS_BACKEND": "bogus"})
    assert r.returncode == 2
    assert "MAMBA_KERNELS_BACKEND='bogus' is not a backend" in r.stderr
    assert "Traceback" not in r.stderr


def test_no_verb_prints_help_and_fails():
    r = _run()
    assert r.returncode == 2
    assert "usage" in r.stderr.lower()


def test_console_script_points_at_program():
    # pyproject's declaration, loaded as an installer's script would load it (the installed
    # metadata may come from another checkout of the project)
    tomllib = pytest.importorskip("tomllib")
    from importlib.metadata import EntryPoint

    from mamba_kernels.cli import main as cli

    scripts = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    value = scripts["project"]["scripts"]["mamba-kernels"]
    ep = EntryPoint(name="mamba-kernels", value=value, group="console_scripts")
    assert ep.load() is cli.program


def test_program_returns_mains_status_and_then_ignores_ctrl_c():
    # CPython restores the default SIGINT handler while it shuts down; a Ctrl-C after the verb
    # would then kill the process (status -2) instead of letting it report its own status
    code = ("import signal, sys; sys.argv = ['mamba-kernels']; from mamba_kernels.cli.main import program; "
            "c = program(); print(c, signal.getsignal(signal.SIGINT) is signal.SIG_IGN)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parent.parent)
    assert r.stdout.split() == ["2", "True"], r.stdout + r.stderr


def test_output_into_a_closed_pipe_stops_quietly():
    p = subprocess.Popen(
        [sys.executable, "-m", "mamba_kernels", "matrix", "--json"],  # ~200 KB: over a pipe buffer
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    p.stdout.read(10)
    p.stdout.close()  # like `| head -c 10`
    err = p.stderr.read().decode()
    p.wait()
    assert "Traceback" not in err


def test_info_shows_the_build_label_and_the_index(tmp_path):
    from mamba_kernels.facts import release_index, variant

    r = _run("info", "--json", env={release_index.ENV_VAR: f"{tmp_path} https://mirror.example/x/"})
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["index"]["indexes"] == [str(tmp_path), "https://mirror.example/x/"]
    assert d["index"]["from"] == release_index.ENV_VAR
    if d["index"]["label"] is not None:  # the per-variant page of the first site root that has one
        assert d["index"]["url"] == f"https://mirror.example/x/{d['index']['label']}/simple/"
    else:
        assert d["index"]["why"]
    b = d["build"]
    if b["label"] is None:
        assert "without a compiled extension" in b["how"]
    else:
        variant.parse_label(b["label"])
    env = dict(os.environ)
    env.pop(release_index.ENV_VAR, None)
    r = subprocess.run([sys.executable, "-m", "mamba_kernels", "info"], capture_output=True, text=True,
                       env=env)
    assert r.returncode == 0, r.stderr
    assert f"index         {release_index.RELEASE_INDEX} (the release index)" in r.stdout
    assert "\nbuild         " in r.stdout and "\nwheels here   " in r.stdout


def test_install_and_download_document_their_exit_codes():
    for verb in ("install", "download"):
        r = _run(verb, "--help")
        assert r.returncode == 0
        text = " ".join(r.stdout.split())
        assert "3 no wheel fits" in text and "5 the file did not verify" in text and "--dry-run" in text


def test_download_needs_a_destination():
    r = _run("download", "--torch", "2.14.1")
    assert r.returncode == 2 and "--dest" in r.stderr


def test_an_invalid_build_knob_is_named_by_info_and_doctor():
    """MAMBA_KERNELS_BINDING is read only by a build; info and doctor still say it is wrong."""
    env = {"MAMBA_KERNELS_BINDING": "fast"}
    r = _run("info", env=env)
    assert r.returncode == 0, r.stderr
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("build knobs")]
    want = "MAMBA_KERNELS_BINDING='fast' is not a binding: use one of auto, stable, classic"
    assert line and want in line[0], r.stdout
    d = _run("doctor", "--json", env=env)
    report = json.loads(d.stdout)
    p = [p for p in report["problems"] if p["what"] == "a build knob is not valid"]
    assert p and "MAMBA_KERNELS_BINDING='fast'" in p[0]["why"] and not p[0]["broken"], report["problems"]
    assert "build knobs" not in _run("info").stdout  # a valid environment adds no line
