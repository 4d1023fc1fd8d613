"""ci/torch_watch.py and .github/workflows/torch-watch.yml: a new torch release is noticed,
smoke-tested with the published stable wheels (or, when it adds cells, built) on every platform
before merge, and proposed once."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from test_workflows import ROOT, outputs, run_step, step, workflow

from ci import build_cell, cell_fields, torch_watch
from mamba_kernels.facts import support
from mamba_kernels.release import matrix


def _vkey(v: str):
    return tuple(int(x) for x in v.split("."))


def _pypi(tmp_path=None, windows=True):
    newest = max((r.torch for r in torch_watch.support.RELEASES), key=_vkey)
    major, minor = map(int, newest.split("."))
    new = f"{major}.{minor + 1}.0"
    files = [
        {"filename": f"torch-{new}-cp3{m}-cp3{m}-manylinux_2_28_x86_64.whl"} for m in (11, 12, 13, 14, 15)
    ]
    files += [{"filename": f"torch-{new}-cp3{m}-cp3{m}-manylinux_2_28_aarch64.whl"} for m in (11, 12)]
    if windows:
        files += [{"filename": f"torch-{new}-cp3{m}-cp3{m}-win_amd64.whl"} for m in (11, 12, 13)]
    pypi = {
        "info": {
            "requires_python": ">=3.11",
            "requires_dist": ["filelock", "cuda-toolkit[cublas,cudart]==13.2.1; platform_system == 'Linux'"],
        },
        "releases": {new: files, f"{newest}.0": [{"filename": "x.whl"}], f"{major}.{minor + 2}.0rc1": files},
    }
    if tmp_path is not None:
        (tmp_path / "pypi.json").write_text(json.dumps(pypi))
    return pypi, new, f"{major}.{minor + 1}"


def test_finds_a_new_release_and_proposes_an_entry(tmp_path):
    pypi, new, mm = _pypi()
    assert torch_watch.newest_missing(pypi) == new
    f = torch_watch.facts(pypi, new)
    assert f["pythons"] == ["3.11", "3.12", "3.13", "3.14", "3.15"] and f["pypi_cuda"] == "13.2"
    data = tmp_path / "support.json"
    shutil.copyfile(support.DATA_FILE, data)
    before = data.read_text()
    assert torch_watch.apply(torch_watch.release_entry(f), data) == data
    after = data.read_text()
    entries = support.read_data(data)["releases"]
    assert [e["torch"] for e in entries] == [r.torch for r in support.RELEASES] + [mm]
    # The diff is the new entry alone: every old line is kept but the previous last entry's
    # closing "}", which gains a comma; the rest is added lines.
    old, new_ = before.splitlines(), after.splitlines()
    head = next(i for i, (x, y) in enumerate(zip(old, new_)) if x != y)
    tail = next(i for i, (x, y) in enumerate(zip(reversed(old), reversed(new_))) if x != y)
    tail = min(tail, len(old) - head - 1)
    assert head + tail == len(old) - 1 and (old[head], new_[head]) == ("    }", "    },")
    added = new_[head + 1 : len(new_) - tail]
    assert added[0] == "    {" and f'      "torch": "{mm}",' in added and len(added) < 25
    assert support.dump_data(support.read_data(data)) == after
    assert torch_watch.newest_missing({"releases": {f"{new[:-2]}.1": pypi["releases"][new]}}) is not None


def test_the_proposed_entry_has_a_cell_on_every_platform_pypi_has_wheels_for():
    pypi, new, mm = _pypi()
    rel = support.release_from_data(torch_watch.release_entry(torch_watch.facts(pypi, new)))
    assert rel.torch == mm
    for platform in ("linux_x86_64", "linux_aarch64", "win_amd64"):
        assert rel.cuda[platform] == ("13.2",), platform
    assert rel.pythons_on("win_amd64") == ("3.11", "3.12", "3.13")
    assert rel.pythons_on("linux_aarch64") == ("3.11", "3.12")
    assert rel.pythons_on("linux_x86_64")[-1] == "3.15"
    pypi, new, _ = _pypi(windows=False)
    rel = support.release_from_data(torch_watch.release_entry(torch_watch.facts(pypi, new)))
    assert rel.cuda["win_amd64"] == ()


def _tree(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def test_apply_edits_only_the_data_file_never_code(tmp_path):
    # A copy of the packages, run as the workflow runs it (from the repository's root): the one
    # file that changes is mamba_kernels/facts/support.json, and `changed=` names it for the commit step.
    repo = tmp_path / "repo"
    for package in ("mamba_kernels", "ci"):
        shutil.copytree(ROOT / package, repo / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd"))
    _, _, mm = _pypi(tmp_path)
    before = _tree(repo)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "ci.torch_watch", "--pypi-json",
                        str(tmp_path / "pypi.json"), "--apply", "--github-output", str(out)],
                       capture_output=True, text=True, cwd=repo)
    assert r.returncode == torch_watch.NEW_RELEASE, r.stdout + r.stderr
    after = _tree(repo)
    assert set(after) == set(before)
    changed = sorted(k for k in before if before[k] != after[k])
    assert changed == ["mamba_kernels/facts/support.json"]
    got = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert got["changed"] == "mamba_kernels/facts/support.json" and got["torch"] == mm
    # The edited table loads, has the new release, and is canonical.
    r = subprocess.run([sys.executable, "-c", "from mamba_kernels.facts import support as s; "
                        "print(s.RELEASES[-1].torch, len(s.cells(torch=s.RELEASES[-1].torch)) > 0, "
                        "s.dump_data(s.read_data()) == s.DATA_FILE.read_text())"],
                       capture_output=True, text=True, cwd=repo)
    assert r.stdout.split() == [mm, "True", "True"], r.stdout + r.stderr


def test_outputs_for_the_workflow(tmp_path):
    _, _, mm = _pypi(tmp_path)
    out = tmp_path / "out"
    prs = tmp_path / "prs.json"
    prs.write_text(json.dumps([{"number": 3, "state": "CLOSED", "headRefName": "torch-watch/20261201"}]))
    rc = torch_watch.main(["--pypi-json", str(tmp_path / "pypi.json"), "--proposed", str(prs),
                           "--github-output", str(out)])
    assert rc == torch_watch.NEW_RELEASE
    got = dict(line.split("=", 1) for line in out.read_text().splitlines())
    smoke = json.loads(got.pop("smoke"))["include"]
    assert got == {"new": "true", "torch": mm, "branch": f"torch-watch/torch-{mm}", "changed": "",
                   "n_smoke": str(len(smoke)), "build": "[]", "n_build": "0", "problem": ""}
    # PyPI's CUDA 13.2 build on each platform it has wheels for, served by the 13.0 stable wheel
    assert [(t["platform"], t["torch_cuda"], t["cell"]) for t in smoke] == [
        (p, "13.2", f"cu130stable2.10-cp310-{p}") for p in ("linux_x86_64", "linux_aarch64", "win_amd64")]


def test_a_release_from_2_10_on_needs_a_smoke_test_not_new_cells():
    pypi, new, mm = _pypi()
    entry = torch_watch.release_entry(torch_watch.facts(pypi, new))
    entry["cuda"] = {"linux_x86_64": ["12.6", "12.9", "13.2"], "linux_aarch64": ["13.0"], "win_amd64": []}
    todo = torch_watch.plan(entry)
    assert todo["build"] == []
    got = [(t["platform"], t["torch_cuda"], t["label"], t["python"], t["torch_index"]) for t in todo["smoke"]]
    assert got == [
        ("linux_x86_64", "12.6", "cu126stable2.10", "3.15", "https://download.pytorch.org/whl/cu126"),
        ("linux_x86_64", "12.9", "cu128stable2.10", "3.15", "https://download.pytorch.org/whl/cu129"),
        ("linux_x86_64", "13.2", "cu130stable2.10", "3.15", "https://download.pytorch.org/whl/cu132"),
        ("linux_aarch64", "13.0", "cu130stable2.10", "3.12", "https://download.pytorch.org/whl/cu130"),
    ]
    assert all(t["torch_requirement"] == f"torch=={mm}.*" for t in todo["smoke"])
    assert all(matrix.find_cell(t["cell"]).stable for t in todo["smoke"])


def test_a_cuda_variant_with_a_new_architecture_list_adds_a_stable_cell(monkeypatch):
    pypi, new, mm = _pypi()
    entry = torch_watch.release_entry(torch_watch.facts(pypi, new))
    entry["cuda"] = {"linux_x86_64": ["13.0", "13.6"], "linux_aarch64": [], "win_amd64": []}
    entry["pypi_cuda"] = "13.0"
    entry["pythons"] = ["3.10"] + entry["pythons"]  # a stable cell builds on cp310
    # A CUDA 13.6 that adds an architecture (as 12.8 added Blackwell) needs its own wheel.
    x86 = support._DEFAULT_ARCHS["x86_64"]
    monkeypatch.setitem(support._DEFAULT_ARCHS, "x86_64", dict(x86, **{"13.6": x86["13.4"] + ("13.0",)}))
    todo = torch_watch.plan(entry)
    assert todo["build"] == ["cu136stable2.10-cp310-linux_x86_64"]
    assert [(t["torch_cuda"], t["label"]) for t in todo["smoke"]] == [("13.0", "cu130stable2.10")]


def test_a_release_below_2_10_would_build_its_classic_cells():
    entry = dict(support.read_data()["releases"][8])  # torch 2.9
    todo = torch_watch.plan(entry)
    assert todo["smoke"] == [] and todo["build"] == [matrix.cell_id(c) for c in matrix.select(torch="2.9")]


def test_an_unknown_cuda_major_is_reported_not_a_crash(tmp_path):
    pypi, new, mm = _pypi(tmp_path)
    pypi["info"]["requires_dist"] = ["cuda-toolkit[cudart]==14.0.1; platform_system == 'Linux'"]
    (tmp_path / "pypi.json").write_text(json.dumps(pypi))
    out, body = tmp_path / "out", tmp_path / "body.md"
    rc = torch_watch.main(["--pypi-json", str(tmp_path / "pypi.json"), "--github-output", str(out),
                           "--body", str(body)])
    assert rc == torch_watch.NEW_RELEASE
    got = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert got["n_smoke"] == got["n_build"] == "0"
    assert got["problem"].startswith("the matrix cannot place it: no default architecture list for CUDA 14.0")
    assert "complete mamba_kernels/facts/support.json before merging" in body.read_text()


@pytest.mark.parametrize("state", ["OPEN", "CLOSED", "MERGED"])
def test_a_release_proposed_before_is_never_proposed_again(tmp_path, state, capsys):
    _, _, mm = _pypi(tmp_path)
    before = torch_watch.SUPPORT_DATA.read_bytes()
    prs = tmp_path / "prs.json"
    prs.write_text(json.dumps([{"number": 41, "state": state, "headRefName": f"torch-watch/torch-{mm}",
                                "url": "https://example.invalid/pull/41"}]))
    out = tmp_path / "out"
    rc = torch_watch.main(["--pypi-json", str(tmp_path / "pypi.json"), "--apply", "--proposed", str(prs),
                           "--github-output", str(out), "--body", str(tmp_path / "body.md")])
    assert rc == 0
    assert "new=false" in out.read_text().splitlines()
    assert "#41" in capsys.readouterr().out
    assert torch_watch.SUPPORT_DATA.read_bytes() == before and not (tmp_path / "body.md").exists()


def test_the_workflow_builds_only_the_cells_a_release_adds(tmp_path):
    wf = workflow("torch-watch.yml")
    jobs = wf["jobs"]
    assert jobs["build"]["uses"] == "./.github/workflows/build-cells.yml"
    assert jobs["build"]["with"] == {"matrix": "${{ needs.plan.outputs.matrix }}",
                                     "ref": "${{ needs.watch.outputs.branch }}"}
    assert "needs.watch.outputs.n_build != '0'" in jobs["plan"]["if"]
    assert {"build", "smoke"} <= set(jobs["propose"]["needs"])
    checkout = jobs["plan"]["steps"][0]
    assert checkout["with"]["ref"] == "${{ needs.watch.outputs.branch }}"
    ids = ["cu130stable2.10-cp310-linux_x86_64", "cu118torch2.4-cp39-win_amd64",
           "cu118torch2.4-cp312-win_amd64"]
    r = run_step(step(wf, "plan", "plan"), tmp_path, {"TORCH": "2.16", "BUILD": json.dumps(ids)})
    assert r.returncode == 0, r.stdout + r.stderr
    cells = json.loads(outputs(tmp_path)["matrix"])["include"]
    # one per platform and CUDA variant: the newest Python of the classic ones
    assert sorted(c["id"] for c in cells) == [
        "cu118torch2.4-cp312-win_amd64", "cu130stable2.10-cp310-linux_x86_64"]
    assert cells == [cell_fields.ci_fields(matrix.find_cell(c["id"])) for c in cells]


def test_the_workflow_smoke_tests_the_published_stable_wheels_on_the_new_torch():
    wf = workflow("torch-watch.yml")
    smoke = wf["jobs"]["smoke"]
    assert smoke["strategy"]["matrix"] == "${{ fromJSON(needs.watch.outputs.smoke) }}"
    assert "needs.watch.outputs.n_smoke != '0'" in smoke["if"]
    assert smoke["runs-on"] == "${{ matrix.runner }}"
    assert smoke["steps"][0]["with"]["ref"] == "${{ needs.watch.outputs.branch }}"
    run = smoke["steps"][-1]["run"]
    env = smoke["steps"][-1]["env"]
    assert env["TORCH_INDEX"] == "${{ matrix.torch_index }}" and env["CELL"] == "${{ matrix.cell }}"
    assert '"torch==${TORCH}.*" --index-url="$TORCH_INDEX"' in run
    assert 'python -m mamba_kernels install --python-exe "$py"' in run  # the release index, verified
    assert 'check-installed "$CELL" --torch "$TORCH"' in run
    # from a folder holding only the check's sources, so that mamba_kernels is the installed one
    assert f'cp -R {" ".join(build_cell.CHECK_SOURCES)} "$RUNNER_TEMP/check/"' in run
    assert run.index('cd "$RUNNER_TEMP/check"') < run.index("-m ci.build_cell check-installed")
    watch_outputs = wf["jobs"]["watch"]["outputs"]
    assert {"smoke", "n_smoke", "build", "n_build", "problem"} <= set(watch_outputs)
    opener = step(wf, "propose", "Open the pull request")
    assert opener["env"]["SMOKE"] == "${{ needs.smoke.result }}" and "$PROBLEM" in opener["run"]


def test_the_pull_request_uses_the_app_token_when_configured():
    wf = workflow("torch-watch.yml")
    app = step(wf, "propose", "app")
    assert app["uses"].startswith("actions/create-github-app-token@")
    assert app["if"] == "vars.TORCH_WATCH_APP_CLIENT_ID != ''"
    assert app["with"]["private-key"] == "${{ secrets.TORCH_WATCH_APP_PRIVATE_KEY }}"
    opener = step(wf, "propose", "Open the pull request")
    assert opener["env"]["GH_TOKEN"] == "${{ steps.app.outputs.token || github.token }}"
    assert "Allow GitHub Actions to create and approve pull requests" not in opener["run"]  # in the docs
    assert "--draft" in opener["run"]
    watch = step(wf, "watch", "watch")
    assert "--proposed" in watch["run"]
    listing = step(wf, "watch", "List earlier proposals")
    assert "python -m ci.pulls list" in listing["run"]  # every state: ci/pulls.py asks for state=all


def test_pulls_lists_every_state_and_opens_a_draft_against_the_github_stand_in(tmp_path, monkeypatch):
    """ci/pulls.py over HTTP against the rehearsal's GitHub stand-in, as the workflow calls it."""
    from ci import pulls, release_assets
    from ci.rehearsal import github_api

    with github_api.GitHubStandIn(tmp_path / "gh") as gh:
        monkeypatch.setenv("GITHUB_API_URL", gh.url)
        api = release_assets.http_api("t")
        assert pulls.list_pulls(api, "o/r") == []
        body = tmp_path / "body.md"
        body.write_text("the body")
        monkeypatch.setenv("GH_TOKEN", "t")
        assert pulls.main(["open", "--repo", "o/r", "--head", "torch-watch/torch-2.16", "--title", "T",
                           "--body-file", str(body), "--draft"]) == 0
        got = pulls.list_pulls(api, "o/r")
        want = [(1, "OPEN", "torch-watch/torch-2.16")]
        assert [(p["number"], p["state"], p["headRefName"]) for p in got] == want
        stored = gh.state()["repos"]["o/r"]["pulls"][0]
        assert stored["draft"] is True and stored["body"] == "the body" and stored["base"]["ref"] == "main"
        assert torch_watch.earlier_proposal(got, "torch-watch/torch-2.16") is not None
        monkeypatch.delenv("GH_TOKEN")
        monkeypatch.delenv("GITHUB_TOKEN", raising=False)
        assert pulls.main(["list", "--repo", "o/r"]) == 1
