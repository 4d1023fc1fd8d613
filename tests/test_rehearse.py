"""The release rehearsal (ci/rehearse.py) and its stand-in actions (ci/rehearsal/standins.py).

The stand-ins run here as a runner would run them: inputs in INPUT_* variables, GITHUB_OUTPUT,
GITHUB_PATH and GITHUB_ENV files, a workspace; the rehearsal itself runs act on release.yml
(the whole quick form is .ci/run's; here the plan job with a step added that must fail)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci import rehearse

ROOT = Path(__file__).resolve().parent.parent
STANDINS = ROOT / "ci" / "rehearsal" / "standins.py"


def run_standin(tmp_path: Path, action: str, inputs: dict, **env: str) -> subprocess.CompletedProcess:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    for name in ("output", "path", "env"):
        (tmp_path / name).touch()
    e = {k: v for k, v in os.environ.items() if not k.startswith(("INPUT_", "REHEARSAL_"))}
    e.update(
        GITHUB_WORKSPACE=str(ws),
        GITHUB_OUTPUT=str(tmp_path / "output"),
        GITHUB_PATH=str(tmp_path / "path"),
        GITHUB_ENV=str(tmp_path / "env"),
        RUNNER_TEMP=str(tmp_path / "tmp"),
        REHEARSAL_ARTIFACTS=str(tmp_path / "artifacts"),
        REHEARSAL_CACHE=str(tmp_path / "cache"),
        **env,
    )
    (tmp_path / "tmp").mkdir(exist_ok=True)
    for k, v in inputs.items():
        e["INPUT_" + k.upper().replace("-", "_")] = v
    return subprocess.run(
        [sys.executable, str(STANDINS), action], cwd=ws, env=e, capture_output=True, text=True
    )


def outputs(tmp_path: Path) -> dict:
    return dict(ln.split("=", 1) for ln in (tmp_path / "output").read_text().splitlines() if "=" in ln)


def test_every_action_the_workflows_use_has_a_stand_in():
    refs = rehearse.action_refs(ROOT)
    assert len(refs) >= 8
    args = rehearse.local_repositories(ROOT)  # raises, naming the action, when one lacks a stand-in
    assert len(args) == 2 * len(refs)
    for ref in refs:
        path = ref.split("@")[0]
        assert (rehearse.ACTIONS / path / "action.yml").is_file() or any(
            (rehearse.ACTIONS / path / sub / "action.yml").is_file() for sub in ("restore", "save")
        )


def test_an_action_without_a_stand_in_is_named(tmp_path):
    wf = tmp_path / ".github" / "workflows"
    wf.mkdir(parents=True)
    for name in rehearse.WORKFLOWS:
        (tmp_path / name).write_text((ROOT / name).read_text())
    release = tmp_path / rehearse.WORKFLOWS[0]
    release.write_text(
        release.read_text().replace(
            "      - id: plan\n",
            "      - uses: someone/unknown-action@0123456789abcdef0123456789abcdef01234567\n"
            "      - id: plan\n",
            1,
        )
    )
    with pytest.raises(rehearse.RehearsalError, match="someone/unknown-action@0123"):
        rehearse.local_repositories(tmp_path)


def test_upload_then_download_follow_the_artifact_rules(tmp_path):
    ws = tmp_path / "ws"
    (ws / "wheelhouse").mkdir(parents=True)
    (ws / "wheelhouse" / "a.whl").write_text("a")
    (ws / "wheelhouse" / ".hidden").write_text("h")
    r = run_standin(
        tmp_path,
        "upload-artifact",
        {"name": "wheel-a", "path": "wheelhouse/*.whl", "if-no-files-found": "error"},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in (tmp_path / "artifacts" / "wheel-a").rglob("*")) == ["a.whl"]
    # a name is unique in a run
    r = run_standin(tmp_path, "upload-artifact", {"name": "wheel-a", "path": "wheelhouse/*.whl"})
    assert r.returncode == 1 and "already exists" in r.stdout
    # nothing found: error when asked
    r = run_standin(
        tmp_path, "upload-artifact", {"name": "none", "path": "nowhere/*.whl", "if-no-files-found": "error"}
    )
    assert r.returncode == 1 and "no files were found" in r.stdout
    (ws / "dist").mkdir()
    (ws / "dist" / "b.whl").write_text("b")
    assert run_standin(tmp_path, "upload-artifact", {"name": "wheel-b", "path": "dist/"}).returncode == 0
    # a pattern matching two, not merged: one folder each; merged: together
    r = run_standin(tmp_path, "download-artifact", {"pattern": "wheel-*", "path": "sep"})
    assert r.returncode == 0, r.stdout
    assert sorted(str(p.relative_to(ws / "sep")) for p in (ws / "sep").rglob("*.whl")) == [
        "wheel-a/a.whl",
        "wheel-b/b.whl",
    ]
    r = run_standin(
        tmp_path, "download-artifact", {"pattern": "wheel-*", "path": "merged", "merge-multiple": "true"}
    )
    assert sorted(p.name for p in (ws / "merged").iterdir()) == ["a.whl", "b.whl"]
    # one match goes straight into path; a missing name fails
    run_standin(tmp_path, "download-artifact", {"pattern": "wheel-b", "path": "one"})
    assert [p.name for p in (ws / "one").iterdir()] == ["b.whl"]
    r = run_standin(tmp_path, "download-artifact", {"name": "sdist", "path": "x"})
    assert r.returncode == 1 and "Artifact not found" in r.stdout


def test_cache_restores_the_newest_prefix_and_writes_a_key_once(tmp_path):
    ws = tmp_path / "ws"
    (ws / ".sccache").mkdir(parents=True)
    (ws / ".sccache" / "obj").write_text("1")
    assert run_standin(tmp_path, "cache-save", {"key": "k-1", "path": ".sccache"}).returncode == 0
    (ws / ".sccache" / "obj").write_text("2")
    r = run_standin(tmp_path, "cache-save", {"key": "k-1", "path": ".sccache"})
    assert r.returncode == 0 and "Unable to reserve cache" in r.stdout
    (ws / ".sccache" / "obj").unlink()
    r = run_standin(tmp_path, "cache-restore", {"key": "k-2", "path": ".sccache", "restore-keys": "k-"})
    assert r.returncode == 0 and outputs(tmp_path)["cache-matched-key"] == "k-1"
    assert outputs(tmp_path)["cache-hit"] == "false" and (ws / ".sccache" / "obj").read_text() == "1"


def test_checkout_fetches_the_ref_into_a_clean_workspace(tmp_path):
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "f").write_text("one")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["add", "f"], check=True)
    subprocess.run(git + ["commit", "-qm", "one"], check=True)
    subprocess.run(git + ["tag", "v1"], check=True)
    (repo / "f").write_text("two")
    subprocess.run(git + ["commit", "-qam", "two"], check=True)
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "stale").write_text("left by an earlier job")
    head = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    r = run_standin(tmp_path, "checkout", {"ref": "v1"}, REHEARSAL_ORIGIN=str(repo), GITHUB_SHA=head)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "ws" / "f").read_text() == "one" and not (tmp_path / "ws" / "stale").exists()
    r = run_standin(tmp_path, "checkout", {}, REHEARSAL_ORIGIN=str(repo), GITHUB_SHA=head)
    assert (tmp_path / "ws" / "f").read_text() == "two"
    r = run_standin(tmp_path, "checkout", {"ref": "nope"}, REHEARSAL_ORIGIN=str(repo), GITHUB_SHA=head)
    assert r.returncode == 1 and "is not a commit, tag or branch" in r.stdout


def test_setup_python_gives_a_fresh_interpreter_with_pip_only(tmp_path):
    version = "{}.{}".format(*sys.version_info[:2])
    r = run_standin(tmp_path, "setup-python", {"python-version": version})
    assert r.returncode == 0, r.stdout + r.stderr
    bin_dir = Path((tmp_path / "path").read_text().strip())
    have = subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "list", "--format=json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert {p["name"] for p in json.loads(have)} <= {"pip", "setuptools"}
    missing = subprocess.run([str(bin_dir / "python"), "-c", "import packaging"], capture_output=True)
    assert missing.returncode != 0, "the runner's interpreter has no packaging; neither may the stand-in's"
    r = run_standin(tmp_path, "setup-python", {"python-version": "2.5"})
    assert r.returncode == 1 and "no CPython 2.5" in r.stdout


def test_every_cell_not_built_here_has_a_reason():
    rows = rehearse.cells_not_built([rehearse.CELL])
    from mamba_kernels.release import matrix

    assert len(rows) == len(matrix.select()) - 1
    assert all(why for _, why in rows)


@pytest.mark.skipif(not Path("/usr/bin/git").exists(), reason="needs git")
def test_a_step_added_to_a_job_that_fails_fails_the_rehearsal_and_is_named(tmp_path):
    """act runs release.yml's plan job from a clean clone, with a failing step appended."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ci.rehearse",
            "--work",
            str(tmp_path),
            "--job",
            "plan",
            "--add-step",
            'plan=python -c "import not_a_module"',
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "job release/plan failed at step 'Added by the rehearsal'" in r.stdout


def test_the_rehearsal_installs_the_readme_lines_the_install_test_runs():
    # README's install-commands block is the one copy: the rehearsal and
    # tests/test_install_commands.py must read the same "torch already installed" lines from it
    from test_install_commands import README_COMMANDS

    lines = rehearse.readme_install_lines(ROOT)
    assert lines and lines == README_COMMANDS["torch installed"]


def test_the_release_rehearsal_refuses_a_filesystem_without_room_but_the_plan_job_alone_does_not(
    tmp_path, monkeypatch, capsys
):
    """The disk check: a whole release rehearsal (a torch per environment) asks for DISK_GB free;
    the plan job alone installs no torch and goes on (here it stops at the next step, the tools)."""
    monkeypatch.setattr(rehearse.signal, "signal", lambda *a: None)  # keep pytest's SIGTERM handler
    real = rehearse.shutil.disk_usage
    monkeypatch.setattr(
        rehearse.shutil, "disk_usage", lambda p: real(p)._replace(free=int((rehearse.DISK_GB - 2) * 1e9))
    )
    assert rehearse.main(["--work", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"needs about {rehearse.DISK_GB} GB" in out and str(tmp_path) in out

    def no_tools(work):
        raise rehearse.RehearsalError("past the disk check")

    monkeypatch.setattr(rehearse, "install_tools", no_tools)
    assert rehearse.main(["--work", str(tmp_path), "--job", "plan"]) == 1
    assert "past the disk check" in capsys.readouterr().out
