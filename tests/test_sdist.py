"""``pip install mamba-kernels`` / ``uv pip install mamba-kernels`` from our sdist, in fresh
virtual environments, as a user in a terminal sees it.

The sdist is built once (``python -m build --sdist``). Each install runs with build isolation
on (the installer's default) under a pseudo-terminal that is the command's controlling
terminal, so the transcript is what a user sees without ``-v``. Nothing reaches the network:
the build requirements (setuptools, wheel, packaging, ninja) come from a wheelhouse filled once
with ``pip download`` (kept in build/sdist-test-wheelhouse), the release index is served on
127.0.0.1, uv runs ``--offline``; pip's and uv's caches are off, so no test reuses another's wheel.

torch: a fresh environment that should have the torch of .venv (2.14.1, CUDA 13.0) gets a .pth
file pointing at .venv's site-packages instead of a 5 GB copy; the tests check that torch's
files there are untouched and that nothing named torch lands in the fresh environment.

The prebuilt wheel of path 1 is a real wheel of this tree (pure build) labelled like a release
for that torch (version, Requires-Dist, platform tag) with one marker file added, listed by
``python -m mamba_kernels index`` like the published index.

Path 2 (a source build) needs a GPU or TORCH_CUDA_ARCH_LIST: the decision is tested against the
real environment (nvcc present, no GPU visible), and a build that build.py refuses shows that the
build runs in the target's interpreter under uv's isolation. The full build (one architecture,
both extensions, 45 s on this 2-core machine, growing with the kernels) is the one slow test,
run with MAMBA_KERNELS_TEST_SOURCE_BUILD=1: scripts/compile_check.sh already compiles the same
sources in every CI run, and the two together would double the CI's compile time.
"""

from __future__ import annotations

import fcntl
import functools
import http.server
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest
import torch

from mamba_kernels.build import plan as build
from mamba_kernels.facts import variant
from mamba_kernels.facts.version import __version__
from mamba_kernels.install import sdist as sdist_install
from mamba_kernels.install.environment import Gpu, Target
from mamba_kernels.runtime import install_record

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
UV = str(BIN / "uv")
TORCH_SITE = Path(torch.__file__).resolve().parents[1]  # .venv's site-packages
WHEELHOUSE = ROOT / "build" / "sdist-test-wheelhouse"
BUILD_REQUIRES = ("setuptools>=77", "wheel", "packaging>=23", "ninja")  # pyproject [build-system]
LABEL = variant.label(torch.__version__, torch.version.cuda)  # cu130torch2.14
PY = f"cp{sys.version_info[0]}{sys.version_info[1]}"
TAG = f"{PY}-{PY}-manylinux_2_28_x86_64"
MARKER = "mamba_kernels/PREBUILT_TEST_MARKER"
COLUMNS = 100
CSI = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])")
LINE = "mamba-kernels: "


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def wheelhouse() -> Path:
    """The build requirements as wheels, for installs without network."""
    have = {p.name.split("-")[0].lower() for p in WHEELHOUSE.glob("*.whl")}
    if not {"setuptools", "wheel", "packaging", "ninja"} <= have:
        WHEELHOUSE.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "-d", str(WHEELHOUSE),
                        *BUILD_REQUIRES], check=True)
    return WHEELHOUSE


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sdist")


@pytest.fixture(scope="module")
def sdist(work) -> Path:
    out = work / "dist"
    subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "-o", str(out), str(ROOT)],
                   check=True, capture_output=True, env={**os.environ, "CUDA_HOME": "/usr/local/cuda"})
    (path,) = out.glob("*.tar.gz")
    return path


# The two kinds of release wheel (docs/COMPAT.md §11): one per torch release (pip's test), and a
# stable-ABI one serving every torch from its target on (uv's test). Each has an index of its own.
CLASSIC = (variant.release_version(__version__, torch.__version__, torch.version.cuda, True),
           variant.torch_requirement(torch.__version__), TAG)
STABLE = (variant.stable_release_version(__version__, torch.version.cuda, "2.10"),
          variant.stable_torch_requirement("2.10"), "cp310-abi3-manylinux_2_28_x86_64")


def labelled(pure: Path, out_dir: Path, kind: Tuple[str, str, str]) -> Path:
    """``pure`` as a release wheel of ``kind`` (version, torch requirement, tag), MARKER added."""
    from wheel.wheelfile import WheelFile

    version, requirement, tag = kind
    old, new = f"mamba_kernels-{__version__}.dist-info", f"mamba_kernels-{version}.dist-info"
    out = out_dir / f"mamba_kernels-{version}-{tag}.whl"
    with WheelFile(pure) as zin, WheelFile(out, "w") as zout:
        for item in zin.infolist():
            if item.filename == f"{old}/RECORD":
                continue
            data, name = zin.read(item), item.filename.replace(old + "/", new + "/")
            if name == f"{new}/METADATA":
                text = data.decode()
                text = re.sub(r"(?m)^Version: .*$", f"Version: {version}", text)
                text = re.sub(r"(?m)^Requires-Dist: torch.*$", f"Requires-Dist: {requirement}", text)
                data = text.encode()
            elif name == f"{new}/WHEEL":
                text = re.sub(r"(?m)^Tag: .*$", f"Tag: {tag}", data.decode())
                data = text.replace("Root-Is-Purelib: true", "Root-Is-Purelib: false").encode()
            zout.writestr(name, data)
        zout.writestr(MARKER, f"from {out.name}\n".encode())
    return out


def index_with(work: Path, name: str, kind: Tuple[str, str, str]):
    """A release index (``python -m mamba_kernels index``) holding one wheel of ``kind``, served on
    127.0.0.1: (its URL, the server)."""
    pure_dir, wheels, site = work / "pure", work / f"wheels-{name}", work / f"site-{name}"
    if not pure_dir.is_dir():
        env = {**os.environ, build.SKIP_BUILD_VAR: "1"}
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "-w", str(pure_dir), str(ROOT)], check=True, env=env, capture_output=True)
    (pure,) = pure_dir.glob("*.whl")
    wheels.mkdir()
    labelled(pure, wheels, kind)
    subprocess.run([sys.executable, "-m", "mamba_kernels", "index", str(wheels), str(site)], check=True,
                   capture_output=True)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/", server


@pytest.fixture(scope="module")
def stable_index_url(work) -> str:
    url, server = index_with(work, "stable", STABLE)
    yield url
    server.shutdown()


@pytest.fixture(scope="module")
def index_url(work) -> str:
    """The index with the classic wheel for .venv's torch (cu130torch2.14)."""
    url, server = index_with(work, "classic", CLASSIC)
    yield url
    server.shutdown()


def closed_port_url() -> str:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connection refused
    return f"http://127.0.0.1:{port}/"


# What a fresh environment gets from .venv to have its torch: torch and what torch imports, not
# our packages, the build tools or the installers (pip would see them as installed there).
NOT_SHARED = re.compile(r"^(mamba_kernels|causal_conv1d|selective_scan|pip|setuptools|wheel|packaging|uv|"
                        r"_distutils_hack|__editable__|_virtualenv|distutils-precedence)|\.pth$", re.I)


@pytest.fixture(scope="module")
def torch_site(work) -> Path:
    """A folder of links to .venv's site-packages entries, minus NOT_SHARED."""
    site = work / "torch-site"
    site.mkdir()
    for entry in TORCH_SITE.iterdir():
        if not NOT_SHARED.search(entry.name):
            (site / entry.name).symlink_to(entry)
    return site


def new_venv(path: Path, torch_site: Optional[Path]) -> Path:
    subprocess.run([UV, "venv", "-q", "--no-config", str(path)], check=True)
    (site,) = path.glob("lib/python*/site-packages")
    if torch_site is not None:
        (site / "_venv_torch.pth").write_text(str(torch_site) + "\n")
    return site


def clean_env(**extra: str) -> Dict[str, str]:
    """No pip/uv configuration but ours; nvcc findable; no colours."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PIP_", "UV_", "MAMBA_KERNELS_", "VIRTUAL_ENV", "TORCH_CUDA"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", UV_NO_CONFIG="1",
               CUDA_HOME="/usr/local/cuda", TERM="xterm-256color")
    env.update(extra)
    return env


def screen(raw: str, columns: int = COLUMNS) -> str:
    """The text a terminal shows after receiving ``raw``: carriage returns, backspaces, line
    wrap, and the cursor moves and erases pip's and uv's progress displays use (CSI A/B/G/K/J;
    colours and other sequences change nothing here)."""
    rows: List[List[str]] = [[]]
    wrapped = set()  # rows that continue on the next (soft wrap), joined in the result
    r = c = 0
    i = 0
    while i < len(raw):
        m = CSI.match(raw, i)
        if m:
            n = int(m.group(1)) if m.group(1).isdigit() else None
            op = m.group(2)
            if op == "A":
                r = max(0, r - (n or 1))
            elif op == "B":
                r += n or 1
            elif op == "G":
                c = (n or 1) - 1
            elif op == "K":
                while len(rows) <= r:
                    rows.append([])
                rows[r] = rows[r][:c] if (n or 0) == 0 else ([] if n == 2 else [" "] * c + rows[r][c:])
            elif op == "J":
                del rows[r + 1:]
                rows[r] = rows[r][:c]
            i = m.end()
            continue
        ch = raw[i]
        i += 1
        while len(rows) <= r:
            rows.append([])
        if ch == "\r":
            c = 0
        elif ch == "\n":
            r, c = r + 1, 0
        elif ch == "\b":
            c = max(0, c - 1)
        elif ch == "\x1b" or ch < " ":
            continue
        else:
            if c >= columns:
                wrapped.add(r)
                r, c = r + 1, 0
                while len(rows) <= r:
                    rows.append([])
            row = rows[r]
            row.extend(" " * (c - len(row) + 1) if len(row) <= c else "")
            row[c] = ch
            c += 1
    lines = [""]
    for k, row in enumerate(rows):
        lines[-1] += "".join(row) if k in wrapped else "".join(row).rstrip()
        if k not in wrapped:
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def in_terminal(cmd: List[str], env: Dict[str, str], timeout: float = 300) -> Tuple[int, str]:
    """Run ``cmd`` with a new pseudo-terminal as its controlling terminal and stdin/stdout/stderr;
    (exit status, the screen it leaves: see :func:`screen`)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, COLUMNS, 0, 0))
    p = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True,
                         preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
    os.close(slave)
    chunks: List[bytes] = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: every holder of the terminal has exited
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    rc = p.wait(timeout=timeout)
    text = screen(b"".join(chunks).decode(errors="replace"))
    if os.environ.get("SDIST_TEST_SCREENS"):  # keep the transcripts (docs/INSTALL.md shows them)
        with open(os.environ["SDIST_TEST_SCREENS"], "a") as f:
            f.write(f"$ {' '.join(cmd)}\n{text}\n")
    return rc, text


def pip_cmd(venv: Path, wheelhouse: Path, sdist: Path, *extra: str) -> List[str]:
    return [str(BIN / "pip"), "--python", str(venv / "bin" / "python"), "install", "--no-cache-dir",
            "--no-index", "--find-links", str(wheelhouse), *extra, str(sdist)]


def uv_cmd(wheelhouse: Path, sdist: Path, *extra: str) -> List[str]:
    return [UV, "pip", "install", "--no-config", "--offline", "--no-cache", "--no-index",
            "--find-links", str(wheelhouse), *extra, str(sdist)]


def installed(site: Path) -> Tuple[Dict[str, object], str, List[str]]:
    """(install record, METADATA, installed file names) of mamba-kernels in ``site``."""
    (info,) = site.glob("mamba_kernels-*.dist-info")
    record = json.loads((info / install_record.RECORD_NAME).read_text())
    files = [ln.split(",")[0] for ln in (info / "RECORD").read_text().splitlines()]
    return record, (info / "METADATA").read_text(), files


def notices(transcript: str) -> List[str]:
    """Our lines on the screen. uv shows a failed build's stderr re-wrapped and indented under
    ``[stderr]``: such a block is joined back into lines."""
    out: List[str] = []
    lines = transcript.splitlines()
    k = 0
    while k < len(lines):
        ln = lines[k].strip()
        k += 1
        if ln == "[stderr]":
            block = []
            while k < len(lines) and lines[k].strip():
                block.append(lines[k].strip())
                k += 1
            out += [LINE + part.strip() for part in " ".join(block).split(LINE) if part.strip()]
        elif ln.startswith(LINE):
            out.append(ln)
    return out


@pytest.fixture(scope="module")
def torch_files():
    """torch's files in .venv, to check that no install touched them."""
    def snapshot():
        base = TORCH_SITE / "torch"
        return {p: p.stat().st_mtime_ns for p in (base / "__init__.py", base / "version.py")}
    before = snapshot()
    yield
    assert snapshot() == before


# ----------------------------------------------------------------------------- the sdist


def test_sdist_declares_no_torch_and_ships_the_backend(sdist):
    import tarfile

    with tarfile.open(sdist) as tf:
        names = tf.getnames()
        pkg_info = tf.extractfile(f"mamba_kernels-{__version__}/PKG-INFO").read().decode()
    assert f"mamba_kernels-{__version__}/build_backend/mamba_kernels_backend.py" in names
    assert f"mamba_kernels-{__version__}/mamba_kernels/install/sdist.py" in names
    assert re.search(r"(?m)^Version: " + re.escape(__version__) + "$", pkg_info)
    assert not re.search(r"(?m)^Requires-Dist: torch", pkg_info), pkg_info[:800]


# ----------------------------------------------------------------------------- path 1


def check_prebuilt(site: Path, transcript: str, kind: Tuple[str, str, str] = CLASSIC) -> None:
    record, metadata, files = installed(site)
    assert record["path"] == "prebuilt", record
    assert record["wheel"] == f"mamba_kernels-{kind[0]}-{kind[2]}.whl"
    assert MARKER in files  # the files come from the prebuilt wheel
    assert (site / MARKER).read_text() == f"from {record['wheel']}\n"
    assert re.search(r"(?m)^Version: " + re.escape(__version__) + "$", metadata)  # the sdist's version
    assert not re.search(r"(?m)^Requires-Dist: torch", metadata)
    assert not list(site.glob("torch*"))  # torch stayed where it was
    assert notices(transcript) == [record["line"]], transcript
    assert f"installed the prebuilt wheel {record['wheel']}" in record["line"]


def test_path1_pip_installs_the_prebuilt_wheel(tmp_path, torch_site, wheelhouse, sdist, index_url,
                                               torch_files):
    venv = tmp_path / "env"
    site = new_venv(venv, torch_site)
    rc, out = in_terminal(pip_cmd(venv, wheelhouse, sdist), clean_env(MAMBA_KERNELS_INDEX=index_url))
    assert rc == 0, out
    check_prebuilt(site, out)
    assert installed(site)[0]["target_found_by"] == "pip (its interpreter)"


def test_path1_uv_installs_the_prebuilt_stable_wheel(tmp_path, torch_site, wheelhouse, sdist,
                                                     stable_index_url, torch_files):
    venv = tmp_path / "env"
    site = new_venv(venv, torch_site)
    env = clean_env(MAMBA_KERNELS_INDEX=stable_index_url, VIRTUAL_ENV=str(venv))
    rc, out = in_terminal(uv_cmd(wheelhouse, sdist), env)
    assert rc == 0, out
    check_prebuilt(site, out, STABLE)
    assert installed(site)[0]["target_found_by"] == f"uv pip (VIRTUAL_ENV={venv})"
    # The installed package runs on the PyTorch path and reports how it was installed.
    py = str(venv / "bin" / "python")
    code = "from mamba_kernels.runtime import install_record as s; print(s.read_record()['path'])"
    got = subprocess.run([py, "-c", code], capture_output=True, text=True, env=clean_env(), cwd=tmp_path)
    assert got.stdout.strip() == "prebuilt", got.stderr


# ----------------------------------------------------------------------------- path 3


def check_pure(site: Path, transcript: str, *reasons: str) -> None:
    record, metadata, files = installed(site)
    assert record["path"] == "pure", record
    assert MARKER not in files
    assert not re.search(r"(?m)^Requires-Dist: torch", metadata)
    assert not list(site.glob("torch*"))
    # the terminal says where to read the line again; the record, which the doctor shows, does not
    assert notices(transcript) == [record["line"] + ". `python -m mamba_kernels doctor` shows this again"], \
        transcript
    assert "doctor" not in record["line"], record["line"]
    for r in reasons:
        assert r in record["line"], (r, record["line"])


def test_path3_pip_without_torch(tmp_path, wheelhouse, sdist, index_url):
    venv = tmp_path / "env"
    site = new_venv(venv, None)
    rc, out = in_terminal(pip_cmd(venv, wheelhouse, sdist), clean_env(MAMBA_KERNELS_INDEX=index_url))
    assert rc == 0, out
    check_pure(site, out, "installed without the CUDA extensions", "no torch in the target environment")


def test_path3_uv_when_the_index_is_unreachable(tmp_path, torch_site, wheelhouse, sdist, torch_files):
    """torch with CUDA and nvcc are there, the index refuses connections, no GPU is visible:
    the pure package, and the one line names both reasons."""
    venv = tmp_path / "env"
    site = new_venv(venv, torch_site)
    url = closed_port_url()
    rc, out = in_terminal(uv_cmd(wheelhouse, sdist, "--python", str(venv / "bin" / "python")),
                          clean_env(MAMBA_KERNELS_INDEX=url))
    assert rc == 0, out
    check_pure(site, out, f"--index {url}", "could not be read", "no GPU is visible")
    record = installed(site)[0]
    assert record["target"]["torch"] == torch.__version__
    # Afterwards the doctor shows the same line, and the fallback warning's note gives the reasons.
    py = str(venv / "bin" / "python")
    doctor = subprocess.run([py, "-m", "mamba_kernels", "doctor"], capture_output=True, text=True,
                            env=clean_env(), cwd=tmp_path)
    assert f"installed     from the sdist: {record['line']}" in doctor.stdout.splitlines(), doctor.stdout
    assert "shows this again" not in doctor.stdout, doctor.stdout  # the doctor does not quote itself
    code = "from mamba_kernels.runtime import install_record as s; print(s.install_note())"
    note = subprocess.run([py, "-c", code],
                          capture_output=True, text=True, env=clean_env(), cwd=tmp_path)
    assert "could not be read" in note.stdout and "no GPU is visible" in note.stdout, note.stderr


def test_path3_pip_when_no_wheel_fits(tmp_path, torch_site, wheelhouse, sdist, work):
    """An index (a plain directory) without a wheel for this torch."""
    empty = work / "empty-index"
    empty.mkdir(exist_ok=True)
    venv = tmp_path / "env"
    site = new_venv(venv, torch_site)
    rc, out = in_terminal(pip_cmd(venv, wheelhouse, sdist), clean_env(MAMBA_KERNELS_INDEX=str(empty)))
    assert rc == 0, out
    check_pure(site, out, f"no wheel in {empty} fits torch {torch.__version__}", "no GPU is visible")


# ----------------------------------------------------------------------------- stopping


def test_uv_target_dir_stops_with_the_command_that_works(tmp_path, wheelhouse, sdist, index_url):
    """``--target DIR`` is no environment: the install stops with one line naming the command;
    that command, run as given with the interpreter filled in, installs."""
    target = tmp_path / "dir"
    cmd = uv_cmd(wheelhouse, sdist, "--python", sys.executable, "--target", str(target))
    env = clean_env(MAMBA_KERNELS_INDEX=index_url)
    rc, out = in_terminal(cmd, env)
    assert rc != 0
    errors = [ln for ln in notices(out) if "error:" in ln]
    assert len(errors) == 1, out
    line = errors[0]
    assert "--target" in line and f"{sdist_install.TARGET_VAR}=/path/to/python uv pip install" in line
    assert line.endswith(str(sdist)), line
    rc, out = in_terminal(cmd, {**env, sdist_install.TARGET_VAR: sys.executable})
    assert rc == 0, out
    (info,) = target.glob("mamba_kernels-*.dist-info")
    assert json.loads((info / install_record.RECORD_NAME).read_text())["path"] == "prebuilt"


def test_pip_target_dir_stops(tmp_path, wheelhouse, sdist, index_url):
    venv = tmp_path / "env"
    new_venv(venv, None)
    rc, out = in_terminal(pip_cmd(venv, wheelhouse, sdist, "--target", str(tmp_path / "dir")),
                          clean_env(MAMBA_KERNELS_INDEX=index_url))
    assert rc != 0
    assert any("error: cannot tell which torch" in ln and "pip install" in ln for ln in notices(out)), out


# ----------------------------------------------------------------------------- finding the target


def test_target_from_uv_command_lines(tmp_path):
    venv = tmp_path / "proj" / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr\n")
    (venv / "bin" / "python").write_text("")
    sub = tmp_path / "proj" / "sub"
    sub.mkdir()
    f = sdist_install.target_from_uv
    assert f(["uv", "pip", "install", "x"], {"VIRTUAL_ENV": "/e"}, "/").python == "/e/bin/python"
    assert f(["uv", "pip", "install", "x"], {"CONDA_PREFIX": "/c"}, "/").python == "/c/bin/python"
    assert f(["uv", "pip", "install", "x"], {}, str(sub)).python == str(venv / "bin" / "python")
    assert f(["uv", "pip", "install", "--python", str(venv), "x"], {"VIRTUAL_ENV": "/e"}, "/").python \
        == str(venv / "bin" / "python")
    assert f(["uv", "pip", "install", f"-p{venv}/bin/python", "x"], {}, "/").python == f"{venv}/bin/python"
    assert f(["uv", "sync"], {"UV_PROJECT_ENVIRONMENT": "/p"}, "/").python == "/p/bin/python"
    for cmd, env, why in [
        (["uv", "pip", "install", "--target", "/d", "x"], {"VIRTUAL_ENV": "/e"}, "--target"),
        (["uv", "pip", "install", "--prefix=/d", "x"], {}, "--prefix"),
        (["uv", "pip", "install", "--system", "x"], {}, "--system"),
        (["uv", "pip", "install", "--python", "3.12", "x"], {}, "version request"),
        (["uv", "pip", "install", "x"], {}, "no environment"),
    ]:
        got = f(cmd, env, "/")
        assert got.python is None and why in (got.problem or ""), (cmd, got)


def test_find_target_pip_uv_and_the_knob(tmp_path):
    f = sdist_install.find_target
    pip = {"PIP_BUILD_TRACKER": "/t"}
    assert f(pip, parent=lambda: (["python", "pip", "install", "x"], {}, "/")).python == sys.executable
    got = f(pip, parent=lambda: (["python", "pip", "install", "-t", "d", "x"], {}, "/"))
    assert got.python is None and "-t" in (got.problem or ""), got
    got = f({**pip, "PIP_TARGET": "/d"}, parent=lambda: None)  # pip's --target from its variable
    assert got.python is None and "--target" in (got.problem or ""), got
    uv_parent = (["/bin/uv", "pip", "install", "x"], {"VIRTUAL_ENV": "/e"}, "/")
    assert f({"UV": "/bin/uv"}, parent=lambda: uv_parent).python == "/e/bin/python"
    assert f({"UV": "/bin/uv"}, parent=lambda: None).python is None  # not Linux: nothing to read
    assert f({sdist_install.TARGET_VAR: sys.executable, "UV": "/bin/uv"}, parent=lambda: None).python \
        == sys.executable
    with pytest.raises(sdist_install.StopInstall, match=sdist_install.TARGET_VAR):
        f({sdist_install.TARGET_VAR: str(tmp_path / "nope")})


# ----------------------------------------------------------------------------- path 2: the decision


def target(torch_v: Optional[str] = "2.14.1+cu130", cuda: Optional[str] = "13.0",
           nvcc: Optional[str] = "13.0", gpus: Tuple[str, ...] = ()) -> Target:
    return Target(python="3.11", platform="linux_x86_64", platform_tags=("linux_x86_64",), torch=torch_v,
                  torch_cuda=cuda, cxx11_abi=True, gpus=tuple(Gpu(i, c) for i, c in enumerate(gpus)),
                  cuda_home="/usr/local/cuda" if nvcc else None, nvcc=nvcc)


@pytest.mark.parametrize("t, env, ok, why", [
    (target(gpus=("9.0",)), {}, True, "for the visible GPUs (sm 9.0)"),
    (target(), {}, False, "no GPU is visible"),
    (target(), {"TORCH_CUDA_ARCH_LIST": "9.0"}, True, "TORCH_CUDA_ARCH_LIST=9.0"),
    (target(), {build.FORCE_BUILD_VAR: "1"}, True, build.FORCE_BUILD_VAR),
    (target(gpus=("9.0",)), {build.SKIP_BUILD_VAR: "1"}, False, build.SKIP_BUILD_VAR),
    (target(torch_v=None, cuda=None, gpus=("9.0",)), {}, False, "no torch"),
    (target(cuda=None, gpus=("9.0",)), {}, False, "CPU-only"),
    (target(nvcc=None, gpus=("9.0",)), {}, False, "nvcc"),
    (target(nvcc="12.8", gpus=("9.0",)), {}, False, "major versions must match"),
])
def test_source_build_decision(t, env, ok, why):
    got, text = sdist_install.source_build_decision(t, env)
    assert (got, why in text) == (ok, True), text


def test_source_build_decision_on_this_machine():
    """The real target here (.venv: torch with CUDA 13.0, nvcc 13.0, no GPU): no source build
    unless asked for."""
    facts = sdist_install.probe_target(sys.executable, str(ROOT), clean_env())
    t = sdist_install.target_of(facts)
    assert t.torch == torch.__version__ and t.nvcc and not t.gpus
    assert sdist_install.source_build_decision(t, {}) == (
        False, "no GPU is visible to build for (set TORCH_CUDA_ARCH_LIST, e.g. '9.0', "
        "or MAMBA_KERNELS_FORCE_BUILD=1 to build without one)")
    assert sdist_install.source_build_decision(t, {"TORCH_CUDA_ARCH_LIST": "9.0"})[0]


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("MAMBA_KERNELS_TEST_SOURCE_BUILD") != "1",
                    reason="a full nvcc build (45 s here); MAMBA_KERNELS_TEST_SOURCE_BUILD=1 runs it")
def test_path2_uv_builds_from_source_for_the_asked_architecture(tmp_path, torch_site, wheelhouse, sdist,
                                                                torch_files):
    venv = tmp_path / "env"
    site = new_venv(venv, torch_site)
    env = clean_env(MAMBA_KERNELS_INDEX=closed_port_url(), VIRTUAL_ENV=str(venv), TORCH_CUDA_ARCH_LIST="9.0",
                    MAX_JOBS="2")
    rc, out = in_terminal(uv_cmd(wheelhouse, sdist), env, timeout=3600)
    assert rc == 0, out
    record, metadata, files = installed(site)
    assert record["path"] == "source", record
    assert any(f.startswith("causal_conv1d/_cuda") for f in files)
    assert notices(out) == [record["line"]]
    assert "for TORCH_CUDA_ARCH_LIST=9.0" in record["line"]
    # The binary was built against the target's torch: it imports there and says so.
    code = ("import json, torch, causal_conv1d._cuda as m; from mamba_kernels.runtime import buildinfo; "
            "print(json.dumps(buildinfo.find_in_file(m.__file__).raw))")
    got = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True,
                         env=clean_env(), cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    info = json.loads(got.stdout.strip().splitlines()[-1])
    assert info["torch_version"] == torch.__version__ and info["sass"] == ["sm_90"], info
    assert not re.search(r"(?m)^Requires-Dist: torch", metadata)


def test_path2_runs_in_the_target_and_a_refused_build_falls_back(tmp_path, torch_site, wheelhouse, sdist):
    """uv, isolation on, no GPU, TORCH_CUDA_ARCH_LIST asks for an architecture nvcc 13 dropped:
    the source build is attempted by the target's interpreter against its torch (the build
    environment has none), build.py refuses the plan, and the install falls back to pure Python
    with that reason. (A build nvcc accepts is the slow test below.)"""
    venv = tmp_path / "env"
    site = new_venv(venv, torch_site)
    env = clean_env(MAMBA_KERNELS_INDEX=closed_port_url(), VIRTUAL_ENV=str(venv), TORCH_CUDA_ARCH_LIST="3.5")
    rc, out = in_terminal(uv_cmd(wheelhouse, sdist), env)
    assert rc == 0, out
    check_pure(site, out, "the source build failed", "cannot compile for 3.5", "could not be read")


def test_torch_requirements_dropped_from_metadata_and_requires_txt():
    """Both text rewrites drop exactly the torch requirements: other ones, unparsable lines, the
    body and (requires.txt) conditional sections stay."""
    from mamba_kernels.install import sdist

    meta = ("Metadata-Version: 2.1\nName: x\nVersion: 0.1\nRequires-Dist: torch>=2.1\n"
            "Requires-Dist: packaging\nRequires-Dist: !!bad\nRequires-Dist: torchvision\n\nbody: torch\n")
    got = sdist._metadata_text(meta, "0.2")
    assert "Version: 0.2\n" in got and "Requires-Dist: torch>" not in got
    assert "Requires-Dist: packaging" in got and "Requires-Dist: !!bad" in got
    assert "Requires-Dist: torchvision" in got and got.endswith("\n\nbody: torch\n")
    req = "torch>=2.1\npackaging\n!!bad\n\n[test]\ntorch\n"
    assert sdist._requires_txt(req) == "packaging\n!!bad\n\n[test]\ntorch\n"
