"""The release, rehearsed on this machine before it runs on GitHub: the real workflows on a real
Actions engine (act, with this machine as the runner), every action replaced by a stand-in of
ours, GitHub's REST API and PyPI by local servers, and the published index installed from.

  python -m ci.rehearse [--full] [--ref REF] [--work DIR] [--keep]
                        [--add-step JOB=COMMAND] [--job JOB] [--event release|pull_request|torch-watch]

What it does, in order (docs/RELEASING.md, "Rehearsal"):

1. Installs its tools into WORK/tools with pip --require-hashes (ci/rehearsal/tools.txt: act,
   uv, twine, pypiserver, PyYAML) and clones the checkout's REF (default HEAD; uncommitted
   changes are not part of it) into WORK/origin, a clean clone, tagged v<version>.
2. Maps every ``uses:`` of the workflows to its stand-in under ci/rehearsal/actions/ (act's
   --local-repository); an action without one stops the rehearsal, naming it and its workflow.
3. Starts the local GitHub (ci/rehearsal/github_api.py) with faults to survive: a 403 secondary
   rate limit with Retry-After and a 502 on the uploads, a draft of the tag already holding a
   half-uploaded asset; and two local package indexes standing in for PyPI and TestPyPI.
4. Runs release.yml on act for a dispatch from the tag with publish and testpypi, filtered to
   the cells this machine builds: cu130stable2.10-cp310-linux_x86_64, through the same
   ``python -m ci.build_cell`` the workflow calls (driver ``local``: torch and nvcc from PyPI, no
   container). The quick form (the default; what .ci/run runs) builds it for one architecture
   (9.0, by a commit in the rehearsal's clone), the full form (--full) for its whole list.
   Every other cell of the matrix is listed with the reason it is not built here.
5. Checks what GitHub would hold: the Release published with every wheel at its sha256, the
   Pages index listing them, the sdist on the TestPyPI stand-in; then installs from the served
   index with pip and uv into fresh virtual environments, the README's lines as written (torch
   installed first), and runs ``mamba-kernels doctor`` there.
6. Prints a table: job, steps run, result, time; the cells built and skipped with the reason.

--event pull_request runs the pull-request path (one smoke cell per family: their build jobs
are planned and shown, none is built), --event torch-watch the daily watch with a stand-in for
PyPI's answer. --add-step JOB=COMMAND appends a step to a job of release.yml in the clone (a
step that fails must fail the rehearsal, naming that job and step); --job runs one job only.
Exit status 0 only when every job and check passed.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ci import plan, platforms
from ci.rehearsal import github_api, standins
from mamba_kernels.facts import support, variant
from mamba_kernels.install import wheel_metadata
from mamba_kernels.release import matrix

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "ci" / "rehearsal"
ACTIONS = HERE / "actions"
REPO = "mamba-kernels/mamba-kernels"
TOKEN = "ghs_rehearsal_token"
WORKFLOWS = (
    ".github/workflows/release.yml",
    ".github/workflows/build-cells.yml",
    ".github/workflows/torch-watch.yml",
)
# The cell this machine builds (Linux x86_64, CUDA 13 from PyPI) and its quick architecture.
CELL = "cu130stable2.10-cp310-linux_x86_64"
QUICK_ARCH = "9.0"
# Disk the release rehearsal needs at its peak, measured: the cell's build and test environments
# (a torch each, 6 GB), its toolkit and the wheels of the install check, with room to spare.
DISK_GB = 20
# Jobs of release.yml that build and install no torch; run alone (--job) they need no such room.
LIGHT_JOBS = ("plan",)
# Every runner label the workflows use runs here (act's host executor: no container).
RUNNER_LABELS = ("ubuntu-24.04", "ubuntu-24.04-arm", "windows-2022")


class RehearsalError(RuntimeError):
    """The rehearsal cannot go on; one line."""


def say(msg: str) -> None:
    print(f"[rehearse] {msg}", flush=True)


def run(cmd: Sequence[str], **kw) -> subprocess.CompletedProcess:
    kw.setdefault("check", True)
    try:
        return subprocess.run(list(cmd), **kw)
    except subprocess.CalledProcessError as e:
        err = e.stderr or b""
        err = err.decode(errors="replace") if isinstance(err, bytes) else err
        raise RehearsalError(
            f"{' '.join(cmd[:4])} ... failed (exit {e.returncode}): {err.strip()[-400:]}"
        ) from None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------- tools and clone


def load_yaml(text: str) -> dict:
    """A workflow file's data: PyYAML (the rehearsal's tools), else ruamel.yaml (the test extra)."""
    try:
        import yaml  # PyYAML: the rehearsal's tools install it, the test extra does not
    except ImportError:
        from ruamel.yaml import YAML  # the test extra's (check-jsonschema brings it)

        return YAML(typ="safe").load(text)
    return yaml.safe_load(text)


def install_tools(work: Path) -> Path:
    """WORK/tools: a venv of this interpreter with ci/rehearsal/tools.txt (hash-checked)."""
    venv = work / "tools"
    stamp = venv / "tools.txt"
    want = (HERE / "tools.txt").read_text()
    if stamp.is_file() and stamp.read_text() == want:
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    run([sys.executable, "-m", "venv", str(venv)])
    for attempt in range(1, 4):
        r = subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--retries",
                "5",
                "--timeout",
                "60",
                "--require-hashes",
                "-r",
                str(HERE / "tools.txt"),
            ],
            capture_output=True,
            text=True,
        )
        if r.returncode == 0:
            break
        if attempt == 3:
            raise RehearsalError(
                f"the rehearsal's tools did not install (3 attempts): {r.stderr.strip()[-300:]}"
            )
        time.sleep(5 * attempt)
    stamp.write_text(want)
    return venv


def clone(work: Path, ref: str) -> Tuple[Path, str, str]:
    """A clean clone of the checkout at ``ref`` in WORK/origin; (path, commit, version)."""
    origin = work / "origin"
    shutil.rmtree(origin, ignore_errors=True)
    run(["git", "clone", "--quiet", "--no-local", str(ROOT), str(origin)], capture_output=True)
    commit = run(
        ["git", "-C", str(ROOT), "rev-parse", f"{ref}^{{commit}}"], capture_output=True, text=True
    ).stdout.strip()
    if subprocess.run(
        ["git", "-C", str(origin), "cat-file", "-e", f"{commit}^{{commit}}"], stderr=subprocess.DEVNULL
    ).returncode:
        # a commit no branch holds (`git stash create` makes one of the working tree)
        run(
            ["git", "-C", str(origin), "fetch", "--quiet", "--no-tags", str(ROOT), commit],
            capture_output=True,
        )
    run(["git", "-C", str(origin), "checkout", "--quiet", "--detach", commit], capture_output=True)
    run(["git", "-C", str(origin), "config", "uploadpack.allowAnySHA1InWant", "true"])
    for k, v in (("user.name", "rehearsal"), ("user.email", "rehearsal@localhost")):
        run(["git", "-C", str(origin), "config", k, v])
    text = (origin / "mamba_kernels" / "facts" / "version.py").read_text()
    version = re.search(r'__version__\s*=\s*"([^"]+)"', text).group(1)
    return origin, commit, version


def commit_in_clone(origin: Path, message: str) -> None:
    run(["git", "-C", str(origin), "commit", "--quiet", "-am", message], capture_output=True)


def cut_archs(origin: Path) -> None:
    """The quick form: the cell's architecture list cut to QUICK_ARCH in the clone, so that the
    build, the verify steps and the index all agree on it (a sixth of the full build)."""
    path = origin / "mamba_kernels" / "facts" / "support.json"
    data = json.loads(path.read_text())
    data["default_archs"]["x86_64"]["13.0"] = [QUICK_ARCH]
    path.write_text(json.dumps(data, indent=2) + "\n")
    commit_in_clone(origin, f"rehearsal (quick): CUDA 13.0 x86_64 architectures cut to {QUICK_ARCH}")


def host_floor(origin: Path) -> str:
    """Outside the manylinux container this machine's glibc is the wheel's floor (auditwheel
    refuses an older tag for a binary built here), so the clone's Linux cells take the manylinux
    tag of this glibc: the build, the verify steps and the index then agree on it."""
    libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    m = re.fullmatch(r"glibc (\d+)\.(\d+)", libc)
    if not m:
        raise RehearsalError(f"this machine's C library is {libc!r}, not glibc: no manylinux build here")
    tag = f"manylinux_{m.group(1)}_{m.group(2)}"
    path = origin / "mamba_kernels" / "facts" / "support.json"
    data = json.loads(path.read_text())
    for rel in data["releases"]:
        rel["manylinux"] = tag
    path.write_text(json.dumps(data, indent=2) + "\n")
    commit_in_clone(origin, f"rehearsal: Linux cells tagged {tag}, this machine's glibc")
    return tag


def add_step(origin: Path, spec: str) -> Tuple[str, str]:
    """JOB=COMMAND: a step named 'Added by the rehearsal' at the end of release.yml's JOB."""
    job, _, command = spec.partition("=")
    path = origin / WORKFLOWS[0]
    text = path.read_text()
    data = load_yaml(text)
    if job not in data["jobs"] or "steps" not in data["jobs"][job]:
        raise RehearsalError(f"--add-step: release.yml has no job {job!r} with steps")
    name = "Added by the rehearsal"
    lines = text.splitlines(keepends=True)
    start = next(i for i, ln in enumerate(lines) if ln.rstrip() == f"  {job}:")
    end = next(
        (i for i in range(start + 1, len(lines)) if re.match(r"  [A-Za-z_][\w-]*:\s*$", lines[i])), len(lines)
    )
    while lines[end - 1].strip() == "":
        end -= 1
    lines[end:end] = [f"      - name: {name}\n", f"        run: {json.dumps(command)}\n"]
    path.write_text("".join(lines))
    commit_in_clone(origin, f"rehearsal: a step added to {job}")
    return job, name


# ----------------------------------------------------------------------------- stand-ins


def action_refs(origin: Path) -> Dict[str, List[str]]:
    """{owner/repo@ref: [where it is used]} of every remote ``uses:`` in the workflows."""
    refs: Dict[str, List[str]] = {}
    for wf in WORKFLOWS:
        data = load_yaml((origin / wf).read_text())
        for job_name, job in data.get("jobs", {}).items():
            uses = [job.get("uses")] + [s.get("uses") for s in job.get("steps", [])]
            for u in filter(None, uses):
                if u.startswith("./"):
                    continue
                path, _, ref = u.partition("@")
                owner, repo = path.split("/")[:2]
                refs.setdefault(f"{owner}/{repo}@{ref}", []).append(
                    f"{Path(wf).name} job {job_name} ({path})"
                )
    return refs


def local_repositories(origin: Path) -> List[str]:
    args, missing = [], []
    for ref, where in sorted(action_refs(origin).items()):
        owner_repo = ref.split("@")[0]
        folder = ACTIONS / owner_repo
        if not folder.is_dir():
            missing.append(f"{ref} (used by {where[0]})")
        args += ["--local-repository", f"{ref}={folder}"]
    if missing:
        raise RehearsalError(
            "no stand-in for " + "; ".join(missing) + ": add one under ci/rehearsal/actions/"
        )
    return args


# ----------------------------------------------------------------------------- act and its log


@dataclass
class Job:
    name: str
    steps: List[Tuple[str, str]] = field(default_factory=list)
    errors: Dict[str, str] = field(default_factory=dict)  # step -> its last error-like line
    result: str = "?"
    start: float = 0.0
    end: float = 0.0


# A line of a failed step worth quoting: an exception, an error message, a workflow ::error.
ERROR_LINE = re.compile(r"(Error\b|error:|::error|FAIL\b)")
EXCEPTION = re.compile(r"[\w.]*(Error|Exception): ")


def _ts(text: str) -> float:
    return time.mktime(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S"))


def read_log(path: Path) -> Dict[str, Job]:
    """act's --json log: per job its steps' results, its result and its time."""
    jobs: Dict[str, Job] = {}
    for line in path.read_text(errors="replace").splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        name = (e.get("job") or "").strip()
        if not name:
            continue
        job = jobs.setdefault(name, Job(name))
        t = _ts(e["time"]) if "time" in e else 0.0
        job.start = job.start or t
        job.end = max(job.end, t)
        if (
            "stepResult" in e
            and e.get("stage", "Main") == "Main"
            and e.get("step") not in ("Set up job", "Complete job")
        ):
            job.steps.append((e["step"], e["stepResult"]))
        if "jobResult" in e:
            job.result = e["jobResult"]
        msg = str(e.get("msg", "")).strip()
        if e.get("step") and ERROR_LINE.search(msg) and not msg.startswith(("exit status", "❌")):
            line = re.sub(r"\x1b\[[0-9;]*m", "", msg.splitlines()[-1])[:300]
            # a Python exception says more than the driver's "command failed" after it
            if EXCEPTION.match(line) or not EXCEPTION.match(job.errors.get(e["step"], "")):
                job.errors[e["step"]] = line
    return jobs


def stand_in_env(
    tools: Path, origin: Path, work: Path, name: str, api: Optional[github_api.GitHubStandIn] = None
) -> Dict[str, str]:
    """What the stand-ins read (--env for every step): where the repository, the rehearsal's
    interpreter, the run's artifacts and caches are, and the local GitHub when there is one."""
    env = {
        "REHEARSAL_ORIGIN": str(origin),
        "REHEARSAL_PYTHON": str(tools / "bin" / "python"),
        "REHEARSAL_STANDINS": str(HERE / "standins.py"),
        "REHEARSAL_ARTIFACTS": str(work / f"artifacts-{name}"),
        "REHEARSAL_CACHE": str(work / f"cache-{name}"),
        "REHEARSAL_UV": str(tools / "bin" / "uv"),
    }
    shutil.rmtree(work / f"artifacts-{name}", ignore_errors=True)
    if api is not None:
        env.update(
            GITHUB_SERVER_URL=api.url,
            GITHUB_API_URL=api.url,
            GITHUB_REPOSITORY=REPO,
            REHEARSAL_GITHUB_STATE=str(api.state_dir),
        )
    return env


def run_act(
    tools: Path,
    origin: Path,
    work: Path,
    event_name: str,
    event: dict,
    workflow: str,
    env: Dict[str, str],
    variables: Dict[str, str],
    job: Optional[str],
    tag: str,
    extra: Sequence[str] = (),
) -> Tuple[int, Path]:
    name = f"{event_name}-{Path(workflow).stem}"
    ev = work / f"event-{name}.json"
    ev.write_text(json.dumps(event))
    log = work / f"act-{name}.jsonl"
    cmd = [
        str(tools / "bin" / "act"),
        event_name,
        "-e",
        str(ev),
        "-W",
        workflow,
        "--json",
        "--no-skip-checkout",
        "--action-offline-mode",
        "--container-daemon-socket",
        "-",
        "--concurrent-jobs",
        "1",
        "-s",
        f"GITHUB_TOKEN={TOKEN}",
        "--actor",
        "rehearsal",
    ]
    for label in RUNNER_LABELS:
        cmd += ["-P", f"{label}=-self-hosted"]
    cmd += local_repositories(origin)
    for k, v in env.items():
        cmd += ["--env", f"{k}={v}"]
    for k, v in variables.items():
        cmd += ["--var", f"{k}={v}"]
    if job:
        cmd += ["-j", job]
    cmd += list(extra)
    say(f"act {event_name} -W {workflow}{' -j ' + job if job else ''} (log: {log})")
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=origin, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait()
        except BaseException:
            os.killpg(proc.pid, signal.SIGTERM)
            raise
    return rc, log


# ----------------------------------------------------------------------------- the rehearsal


def cells_not_built(built: Sequence[str]) -> List[Tuple[str, str]]:
    """Every other cell of the matrix, with the reason this machine does not build it."""
    rows = []
    for cell in matrix.select():
        cid = matrix.cell_id(cell)
        if cid not in built:
            why = platforms.for_cell(cell).why_not_built_here(cell)
            rows.append((cid, why or "buildable here; one cell of this toolchain is built and stands for it"))
    return rows


def summarise_not_built(rows: Sequence[Tuple[str, str]]) -> List[str]:
    count: Dict[str, int] = {}
    for _, why in rows:
        count[why] = count.get(why, 0) + 1
    return [f"  {n:4d} cells  {why}" for why, n in sorted(count.items(), key=lambda kv: -kv[1])]


def table(jobs: Dict[str, Job]) -> List[str]:
    out = [f"{'job':58s} {'steps':>5s}  {'result':8s} {'time':>6s}"]
    for j in jobs.values():
        out.append(f"{j.name[:58]:58s} {len(j.steps):5d}  {j.result:8s} {j.end - j.start:5.0f}s")
    return out


def failures(jobs: Dict[str, Job]) -> List[str]:
    """One line per failed job: the step that failed and the last error it printed."""
    lines = []
    for j in jobs.values():
        if j.result == "failure":
            bad = [s for s, r in j.steps if r == "failure"]
            if not bad:
                lines.append(f"job {j.name} failed")
                continue
            why = j.errors.get(bad[0])
            lines.append(f"job {j.name} failed at step {bad[0]!r}" + (f": {why}" if why else ""))
    return lines


def start_pypi(tools: Path, root: Path, name: str) -> Tuple[str, subprocess.Popen]:
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proc = subprocess.Popen(
        [
            str(tools / "bin" / "pypi-server"),
            "run",
            "-p",
            str(port),
            "-i",
            "127.0.0.1",
            "-P",
            ".",
            "-a",
            ".",
            str(root),
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(root.parent / f"{name}.log", "w"),
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return url, proc
        except OSError:
            time.sleep(0.1)
    raise RehearsalError(f"the local {name} index did not start (log: {root.parent / f'{name}.log'})")


def readme_install_lines(origin: Path) -> List[str]:
    """The README's 'torch already installed' lines (pip, uv), as written."""
    text = (origin / "README.md").read_text()
    block = text.split("<!-- install-commands", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [
        ln.strip() for ln in block.split("\n\n")[0].splitlines() if ln.strip() and not ln.startswith("#")
    ]
    if len(lines) != 2:
        raise RehearsalError(f"README's install-commands block: expected a pip and a uv line, got {lines}")
    return lines


def site_base(line: str) -> str:
    m = re.search(r"--index-url (\S+?)cu\d+(stable|torch)[\w.]*/simple/", line)
    if not m:
        raise RehearsalError(f"README line has no variant index URL: {line}")
    return m.group(1)


def install_check(tools: Path, work: Path, origin: Path, site: str, torch_spec: str) -> List[str]:
    """pip and uv into fresh venvs from the served index, then doctor: problems (empty: fine).

    Long: the install check's steps in the order a user takes them (the torch wheels once, then pip and
    uv into fresh venvs, then the doctor), each with its own failure line.
    """
    problems = []
    wheels = work / "torch-wheels"
    if not wheels.is_dir():
        say(f"downloading {torch_spec} and its dependencies once for the install check")
        run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--retries",
                "5",
                "-d",
                str(wheels),
                torch_spec,
            ],
            capture_output=True,
        )
    for line in readme_install_lines(origin):
        tool = "uv" if line.startswith("uv ") else "pip"
        venv = work / f"install-{tool}"
        shutil.rmtree(venv, ignore_errors=True)
        run([sys.executable, "-m", "venv", str(venv)])
        py = str(venv / "bin" / "python")
        written = line.replace(site_base(line), site.rstrip("/") + "/")
        if tool == "pip":
            pre = [
                py,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-index",
                "--find-links",
                str(wheels),
                torch_spec,
            ]
            cmd = [py, "-m"] + written.split()
        else:
            uv = str(tools / "bin" / "uv")
            pre = [
                uv,
                "pip",
                "install",
                "--quiet",
                "--python",
                py,
                "--no-index",
                "--find-links",
                str(wheels),
                torch_spec,
            ]
            cmd = [uv] + written.split()[1:] + ["--python", py]
        env = dict(
            os.environ, PIP_CONFIG_FILE=os.devnull, UV_NO_CONFIG="1", UV_CACHE_DIR=str(work / "uv-cache")
        )
        run(pre, env=env, capture_output=True)
        say(f"{tool}: {written}")
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=work)
        if r.returncode != 0:
            problems.append(f"{tool}: `{written}` failed: {(r.stderr or r.stdout).strip()[-400:]}")
            shutil.rmtree(venv, ignore_errors=True)
            continue
        doc = subprocess.run(
            [str(venv / "bin" / "mamba-kernels"), "doctor"], capture_output=True, text=True, cwd=work
        )
        (work / f"doctor-{tool}.txt").write_text(doc.stdout + doc.stderr)
        build = next((ln for ln in doc.stdout.splitlines() if ln.startswith("build")), "")
        if doc.returncode != 0 or "no problems found" not in doc.stdout.splitlines():
            problems.append(f"{tool}: doctor exit {doc.returncode}: {doc.stdout.strip()[-400:]}")
        elif "stable" not in build:
            problems.append(f"{tool}: doctor does not report the release wheel: {build}")
        else:
            say(f"{tool}: doctor: {build}")
        shutil.rmtree(venv, ignore_errors=True)  # a torch each: one at a time on disk
    for folder in (wheels, work / "uv-cache"):
        shutil.rmtree(folder, ignore_errors=True)
    return problems


def check_release(api: github_api.GitHubStandIn, tag: str, wheels: Sequence[Path]) -> List[str]:
    state = api.state()
    rels = [r for r in state.get("repos", {}).get(REPO, {}).get("releases", []) if r["tag_name"] == tag]
    if len(rels) != 1:
        return [f"GitHub stand-in holds {len(rels)} releases of {tag}, expected one"]
    rel = rels[0]
    problems = [] if not rel["draft"] else [f"release {tag} is still a draft"]
    have = {a["name"]: a for a in rel["assets"]}
    for w in wheels:
        a = have.get(w.name)
        if (
            a is None
            or a.get("digest") != f"sha256:{wheel_metadata.sha256_of(w)}"
            or a.get("state") != "uploaded"
        ):
            problems.append(f"release {tag}: {w.name} missing or not this run's ({a and a.get('digest')})")
    return problems


def rehearse_release(args: argparse.Namespace, work: Path, tools: Path) -> int:
    origin, commit, version = clone(work, args.ref)
    floor = host_floor(origin)
    if not args.full:
        cut_archs(origin)
    added = add_step(origin, args.add_step) if args.add_step else None
    tag = f"v{version}"
    run(["git", "-C", str(origin), "tag", "-f", tag], capture_output=True)
    say(f"rehearsing {tag} of {commit[:12]} ({'full' if args.full else 'quick'}, {floor}) in {origin}")

    state = work / "github"
    shutil.rmtree(state, ignore_errors=True)
    api = github_api.GitHubStandIn(state, token=TOKEN).start()
    procs = []
    try:
        cell = matrix.find_cell(CELL)
        expected = re.sub(r"manylinux_\d+_\d+", floor, variant.wheel_name(version, cell))
        seed_faults(api, tag, expected)
        pypi, p1 = start_pypi(tools, work / "pypi" / "packages", "pypi")
        testpypi, p2 = start_pypi(tools, work / "testpypi" / "packages", "testpypi")
        procs += [p1, p2]
        py310 = standins.find_python(cell.python)
        driver = [
            "--toolkit",
            "pypi",
            "--torch-index",
            "pypi",
            "--test-torch",
            "build",
            "--python",
            str(py310),
            "--work",
            str(work / "cells"),
        ]
        env = stand_in_env(tools, origin, work, "release", api)
        env["REHEARSAL_PYPI"] = json.dumps(
            {
                "https://upload.pypi.org/legacy/": pypi + "/",
                "https://test.pypi.org/legacy/": testpypi + "/",
            }
        )
        artifacts = Path(env["REHEARSAL_ARTIFACTS"])
        event = release_event(tag, cell)
        t0 = time.time()
        rc, log = run_act(
            tools,
            origin,
            work,
            "workflow_dispatch",
            event,
            WORKFLOWS[0],
            env,
            {"CELL_DRIVER": "local", "CELL_DRIVER_ARGS": " ".join(driver)},
            args.job,
            tag,
        )
        jobs = read_log(log)
        problems = failures(jobs)
        if rc != 0 and not problems:
            problems.append(f"act exited {rc} (log: {log})")
        wheels = sorted((artifacts).glob("wheel-*/*.whl"))
        shutil.rmtree(work / "cells", ignore_errors=True)  # the cell's build and test environments
        if added and not problems:
            problems.append(f"the added step in job {added[0]} did not fail the rehearsal")
        if not problems and not args.job:
            problems += check_published(api, tools, work, origin, state, tag, wheels)
        print()
        print(f"release.yml (workflow_dispatch from {tag}), {time.time() - t0:.0f} s")
        return report(jobs, wheels, args.full, added, problems)
    finally:
        api.stop()
        for p in procs:
            p.terminate()

def seed_faults(api: github_api.GitHubStandIn, tag: str, expected: str) -> None:
    """What the release job must get through: a half-done publish of an earlier attempt (the
    draft holds this wheel's name, half-uploaded) and the API's transient refusals."""
    api.seed_release(REPO, tag, [(expected, b"half", "starter")])
    api.set_faults(
        [
            {
                "method": "POST",
                "path_contains": "/assets",
                "status": 403,
                "retry_after": 1,
                "body": "You have exceeded a secondary rate limit",
            },
            {"method": "POST", "path_contains": "/assets", "status": 502},
            {"method": "PATCH", "path_contains": "/releases/", "status": 429, "retry_after": 1},
        ]
    )


def release_event(tag: str, cell) -> dict:
    """The workflow_dispatch event of the release, from the tag, for the cell built here."""
    return {
        "ref": f"refs/tags/{tag}",
        "ref_name": tag,
        "ref_type": "tag",
        "repository": {
            "full_name": REPO,
            "name": REPO.split("/")[1],
            "owner": {"login": REPO.split("/")[0]},
            "default_branch": "main",
        },
        "inputs": {
            "torch": "2.10",
            "cuda": "13.0",
            "python": "",
            "os": "",
            "platform": cell.platform,
            "publish": "true",
            "testpypi": "true",
        },
    }


def check_published(api, tools: Path, work: Path, origin: Path, state: Path, tag: str,
                    wheels: List[Path]) -> List[str]:
    """After a green run: the release's assets, abi3audit on the stable-ABI wheels, the Pages
    index, the sdist on the TestPyPI stand-in, every injected fault reached, then the install
    check against the served index: problems (empty: fine)."""
    problems = check_release(api, tag, wheels)
    for w in (w for w in wheels if "-abi3-" in w.name):  # cibuildwheel's default audit
        audit = subprocess.run(
            [str(tools / "bin" / "abi3audit"), "--strict", "--report", str(w)],
            capture_output=True,
            text=True,
        )
        (work / "abi3audit.json").write_text(audit.stdout)
        if audit.returncode != 0:
            problems.append(f"abi3audit --strict: {w.name}: {(audit.stderr or audit.stdout)[-400:]}")
        else:
            say(f"abi3audit --strict: {w.name}: no violations")
    manifest = state / "pages" / REPO / "manifest.json"
    listed = (
        {w["filename"] for w in json.loads(manifest.read_text())["wheels"]}
        if manifest.is_file()
        else set()
    )
    problems += [f"the Pages index does not list {w.name}" for w in wheels if w.name not in listed]
    sdists = list((work / "testpypi" / "packages").glob("mamba_kernels-*.tar.gz"))
    if not sdists:
        problems.append("the sdist did not reach the TestPyPI stand-in")
    uploads = [r for r in api.requests() if r[0] == "POST" and "/assets" in r[1]]
    say(
        f"GitHub stand-in: {len(uploads)} upload requests ({', '.join(r[2] for r in uploads)}), "
        f"{len(api.faults_left())} injected faults not reached"
    )
    problems += [f"injected fault not reached: {f}" for f in api.faults_left()]
    if not problems:
        problems += install_check(tools, work, origin, f"{api.url}/pages/{REPO}/", "torch==2.14.1")
    return problems


def report(jobs, wheels: List[Path], full: bool, added, problems: List[str]) -> int:
    """The jobs' table, the cells built and not built here, the problems; the exit status (an
    added step that failed the rehearsal, as it should, is a pass)."""
    print("\n".join(table(jobs)))
    print(
        f"\ncells built here: {', '.join(w.name for w in wheels) or 'none'}"
        f"{'' if full else f' (quick: architectures {QUICK_ARCH})'}"
    )
    print("cells not built here:")
    print("\n".join(summarise_not_built(cells_not_built([CELL]))))
    if added:
        named = [p for p in problems if added[1] in p]
        if named:
            print(f"\nOK: the added step failed the rehearsal: {named[0]}")
            return 0
    for p in problems:
        print(f"FAIL {p}")
    print("rehearsal: " + ("FAILED" if problems else "OK"))
    return 1 if problems else 0



def rehearse_pull_request(args: argparse.Namespace, work: Path, tools: Path) -> int:
    """The pull-request path: plan one smoke cell per family; the build jobs are listed (-n)."""
    origin, commit, _ = clone(work, args.ref)
    env = stand_in_env(tools, origin, work, "pr")
    event = {
        "pull_request": {"number": 1, "head": {"ref": "topic", "sha": commit}, "base": {"ref": "main"}},
        "repository": {"full_name": REPO},
    }
    rc, log = run_act(tools, origin, work, "pull_request", event, WORKFLOWS[0], env, {}, "plan", "")
    jobs = read_log(log)
    print("\n".join(table(jobs)))
    smoke = plan.select("pull_request")
    print(f"\nthe pull request's smoke cells ({len(smoke)}, one per toolchain family; not built here):")
    for cell in smoke:
        why = (
            platforms.for_cell(cell).why_not_built_here(cell)
            or "buildable here (python -m ci.rehearse builds one)"
        )
        print(f"  {matrix.cell_id(cell):40s} {why}")
    problems = failures(jobs) or ([] if rc == 0 else [f"act exited {rc}"])
    for p in problems:
        print(f"FAIL {p}")
    print("rehearsal (pull_request): " + ("FAILED" if problems else "OK"))
    return 1 if problems else 0


def pypi_answer(new: str = "2.16.0") -> dict:
    """A stand-in for PyPI's JSON for torch: every release of the table, and ``new``, a release it
    lacks, with CPython 3.11-3.13 wheels on each platform and CUDA 13.2 as its default."""
    # each platform's wheel tag, as a stable cell of it has it (manylinux_2_28_x86_64, win_amd64)
    tags = sorted({variant.platform_tag(c).split(".")[0] for c in support.stable_cells()})
    releases = {
        f"{r.torch}.0": [{"filename": f"torch-{r.torch}.0-cp311-cp311-manylinux_2_28_x86_64.whl"}]
        for r in support.RELEASES
    }
    releases[new] = [
        {"filename": f"torch-{new}-cp3{m}-cp3{m}-{tag}.whl"} for m in (11, 12, 13) for tag in tags
    ]
    return {
        "info": {
            "version": new,
            "requires_python": ">=3.11",
            "requires_dist": ["nvidia-cuda-runtime==13.2.51; platform_system == 'Linux'"],
        },
        "releases": releases,
    }


def serve_folder(folder: Path) -> Tuple[str, object]:
    """A plain HTTP server of ``folder`` on 127.0.0.1 in a thread: (base URL, server)."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a):  # noqa: D102
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server


SMOKE_STEP = "Install the new torch and the published stable wheel, import both extensions"


def rehearse_torch_watch(args: argparse.Namespace, work: Path, tools: Path) -> int:
    """torch-watch.yml on a dispatch, PyPI answering with a torch release the table lacks: the
    watch proposes it (the branch pushed to the local GitHub), the smoke and build jobs run
    where they can, and the pull request is opened (a draft when one of them failed)."""
    origin, commit, _ = clone(work, args.ref)
    run(["git", "-C", str(origin), "branch", "-f", "main", commit], capture_output=True)
    state = work / "github-tw"
    shutil.rmtree(state, ignore_errors=True)
    api = github_api.GitHubStandIn(state, token=TOKEN).start()
    bare = github_api.init_git(state, REPO, origin)
    pypi_dir = work / "pypi-answer"
    pypi_dir.mkdir(exist_ok=True)
    (pypi_dir / "torch.json").write_text(json.dumps(pypi_answer()))
    pypi_url, pypi_server = serve_folder(pypi_dir)
    try:
        env = stand_in_env(tools, bare, work, "torch-watch", api)
        event = {"ref": "refs/heads/main", "repository": {"full_name": REPO, "default_branch": "main"}}
        rc, log = run_act(
            tools,
            origin,
            work,
            "workflow_dispatch",
            event,
            WORKFLOWS[2],
            env,
            {"TORCH_WATCH_PYPI_URL": f"{pypi_url}/torch.json"},
            args.job,
            "",
            extra=["--matrix", "platform:linux_x86_64"],
        )
        jobs = read_log(log)
        print("\ntorch-watch.yml (workflow_dispatch), PyPI answering torch 2.16.0")
        print("\n".join(table(jobs)))
        problems = []
        by_id = {j.name.split("/")[-1].strip(): j for j in jobs.values()}
        for must in ("watch", "propose"):
            job = next((j for n, j in by_id.items() if n == must), None)
            if job is None or job.result != "success":
                problems.append(f"job {must}: {job.result if job else 'did not run'}")
        problems += [p for p in failures(jobs) if "/smoke" not in p and " smoke-" not in p]
        branch = "torch-watch/torch-2.16"
        shown = subprocess.run(
            ["git", "-C", str(bare), "show", f"{branch}:mamba_kernels/facts/support.json"],
            capture_output=True,
            text=True,
        )
        if shown.returncode != 0 or '"torch": "2.16"' not in shown.stdout:
            problems.append(f"the branch {branch} with torch 2.16 in support.json is not on the local GitHub")
        pulls = api.state().get("repos", {}).get(REPO, {}).get("pulls", [])
        if len(pulls) != 1 or pulls[0]["head"]["ref"] != branch:
            problems.append(f"expected one pull request from {branch}, the local GitHub holds {len(pulls)}")
        else:
            pr = pulls[0]
            print(f"\npull request #{pr['number']} {pr['title']!r}, draft: {pr['draft']}")
            print("\n".join("  " + ln for ln in pr["body"].splitlines()[-4:]))
            smoke_failed = any(j.result == "failure" for n, j in jobs.items() if "smoke" in n)
            if smoke_failed and not pr["draft"]:
                problems.append("a smoke test failed but the pull request is not a draft")
        # A smoke job installs the new torch from PyTorch's index, which this machine cannot reach:
        # it may fail there and only there.
        for j in (j for n, j in jobs.items() if "smoke" in n and j.result == "failure"):
            bad = [st for st, r in j.steps if r == "failure"]
            if bad[:1] == [SMOKE_STEP]:
                why = j.errors.get(SMOKE_STEP, "")[-160:]
                print(f"{j.name}: failed at its torch install, as expected here (...{why})")
            else:
                problems += [f"smoke {p}" for p in failures({j.name: j})]
        for p in problems:
            print(f"FAIL {p}")
        print("rehearsal (torch-watch): " + ("FAILED" if problems or rc not in (0, 1) else "OK"))
        return 1 if problems else 0
    finally:
        api.stop()
        pypi_server.shutdown()


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ci.rehearse", description=__doc__.split("\n\n")[0])
    p.add_argument("--full", action="store_true", help="build the cell for its whole architecture list")
    p.add_argument("--ref", default="HEAD", help="the commit of this checkout to rehearse (default HEAD)")
    p.add_argument("--work", default=str(ROOT / "ci-work" / "rehearsal"), help="the rehearsal's folder")
    p.add_argument("--event", choices=("release", "pull_request", "torch-watch"), default="release")
    p.add_argument("--add-step", metavar="JOB=COMMAND", help="append a step to a job of release.yml")
    p.add_argument("--job", help="run only this job of release.yml (act -j)")
    p.add_argument(
        "--clean", action="store_true", help="remove the work folder after a pass (kept on failure)"
    )
    args = p.parse_args(argv)
    # A SIGTERM (CI stopping) unwinds like an interrupt: act's process group and the servers stop.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(work).free / 1e9
    if args.event == "release" and args.job not in LIGHT_JOBS and free < DISK_GB:
        print(
            f"rehearse: error: {free:.0f} GB free on the filesystem of {work}; the release rehearsal "
            f"needs about {DISK_GB} GB there (--work elsewhere, or free some space)"
        )
        return 1
    t0 = time.time()
    try:
        tools = install_tools(work)
        if Path(sys.prefix).resolve() != tools.resolve():  # go on with the tools' interpreter (PyYAML)
            os.execv(
                str(tools / "bin" / "python"),
                [
                    str(tools / "bin" / "python"),
                    "-m",
                    "ci.rehearse",
                    *(sys.argv[1:] if argv is None else argv),
                ],
            )
        rehearsal = {
            "release": rehearse_release,
            "pull_request": rehearse_pull_request,
            "torch-watch": rehearse_torch_watch,
        }[args.event]
        rc = rehearsal(args, work, tools)
    except RehearsalError as e:
        print(f"rehearse: error: {e}")
        return 1
    print(f"rehearse: {time.time() - t0:.0f} s in all")
    if rc == 0 and args.clean:
        shutil.rmtree(work, ignore_errors=True)
    elif rc:
        print(f"rehearse: logs and the clone kept in {work}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
