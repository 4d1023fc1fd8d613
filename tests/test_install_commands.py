"""The install commands users are given, run as written against an index served on 127.0.0.1.

Single source: the commands are read from README.md's "After the first release" block (the one
after the ``<!-- install-commands`` marker); docs/RELEASING.md "Installing" points there instead of
repeating them.
Each line runs as a shell would run it, in a new virtual environment, with only two strings
replaced (the label, ``cu130stable2.10``, stays: the stable wheel serves the torch used here):

- the release index (``release_index.RELEASE_INDEX``) -> the index this test writes with
  ``python -m mamba_kernels index`` and serves over HTTP;
- ``https://download.pytorch.org/whl/cu130`` -> a stand-in for PyTorch's index, served alongside:
  torch 2.13.0+cpu and its dependencies, as ``pip download`` finds them with this machine's pip
  configuration (on this machine: a CPU wheel on local disk; elsewhere set
  ``PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu``). A CUDA torch would cost
  gigabytes per environment; the commands do not depend on which build of torch it is.

Our wheel: a real build of this tree with ``MAMBA_KERNELS_SKIP_CUDA_BUILD=1`` (pure Python; the
build cannot label a wheel without compiling, since ``MAMBA_KERNELS_RELEASE`` requires the
extensions), then labelled like the stable release wheel of the matrix's CUDA 13.0 cell for this
platform: its file name (``variant.wheel_name``: ``0.1.0+cu130stable2.10``, ``cp310-abi3``, the
release's platform tag), the version in METADATA, ``Requires-Dist`` exactly
``build.install_requires`` for a stable release (``torch>=2.10``, which torch 2.13 meets); RECORD
is rewritten to match. So the requirements tested are the ones a release wheel carries.

The labels, examples and requirements of README's table of which index to take are checked
against the resolver on the matrix's wheel names.

Exercised (pip from the new environment's own ``python -m venv`` bootstrap, and uv; their
configuration files and ``PIP_*``/``UV_*`` variables ignored, so nothing but the served indexes
can supply a package):

- "fresh environment" lines: really install torch and its dependencies from the stand-in and our
  wheel from the variant index;
- "torch already installed" lines: run after torch was put in the environment (with uv, from the
  same files) and must add only mamba-kernels, leaving torch's files untouched; run without torch
  they must fail, which is what the fresh-environment lines are for;
- afterwards each environment imports the packages, runs ``causal_conv1d_fn`` and
  ``python -m mamba_kernels info --json``.

Not exercised: PyTorch's real index (unreachable from the test machine) and a CUDA build of torch.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import http.server
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from pathlib import Path
from typing import Dict, List

import pytest
from wheel_files import write_wheel

from mamba_kernels.build import binding as build_binding
from mamba_kernels.build import plan as build
from mamba_kernels.facts import release_index, support, variant
from mamba_kernels.facts.version import __version__
from mamba_kernels.install import environment, resolve
from mamba_kernels.release import matrix

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MARKER = "<!-- install-commands:"
DOC_SITE = release_index.RELEASE_INDEX  # the one name of the release index
DOC_LABEL = "cu130stable2.10"
DOC_TORCH_INDEX = "https://download.pytorch.org/whl/cu130"
TEST_TORCH = "2.13.0+cpu"  # the stable wheel's requirement (torch>=2.10) accepts it
# the one a release builds: cu130stable2.10
TEST_LABEL = variant.stable_label("13.0", build_binding.STABLE_TARGET)
CASES = ("torch installed", "fresh")
SHIPPED = ("mamba_kernels", "causal_conv1d", "selective_scan")  # [tool.setuptools] packages
# Imports allowed beyond the wheel's requirements: setup.py's helpers (build time) and the release
# tooling behind the `index` and `matrix` verbs (run in CI, where the build tools are installed).
# test_runtime_works_without_build_tools checks that the run-time paths never reach them.
TOOL_IMPORTS = {
    "mamba_kernels/build/setup_glue.py": {"setuptools"},
    "mamba_kernels/release/index.py": {"packaging"},
    "mamba_kernels/release/wheel_check.py": {"packaging"},
    "mamba_kernels/release/published.py": {"packaging"},
    # a wheel's torch pin, read by `install` and by the index writer (both with packaging)
    "mamba_kernels/install/wheel_metadata.py": {"packaging"},
    "mamba_kernels/release/matrix.py": {"packaging"},
    "mamba_kernels/install/sdist.py": {"packaging", "wheel"},  # the sdist's build backend, at build time
    # `install` reads a wheel's torch pin with packaging, else pip's vendored copy, else a clear error
    "mamba_kernels/install/installer.py": {"packaging", "pip"},
    # --torch is checked with packaging's version parser, else pip's copy, else a plain character check
    "mamba_kernels/facts/variant.py": {"packaging", "pip"},
}


# ----------------------------------------------------------------------------- the documented lines


def documented_commands(path: Path) -> Dict[str, List[str]]:
    """{"torch installed": [...], "fresh": [...]}: the command lines of the marked bash block."""
    text = path.read_text(encoding="utf-8")
    assert text.count(MARKER) == 1, f"{path.name} must have exactly one {MARKER!r} block"
    start = text.index("```bash\n", text.index(MARKER)) + len("```bash\n")
    block = text[start : text.index("```", start)]
    out: Dict[str, List[str]] = {case: [] for case in CASES}
    case = None
    for line in block.splitlines():
        if line.startswith("# torch already installed"):
            case = "torch installed"
        elif line.startswith("# fresh environment"):
            case = "fresh"
        elif line.strip() and not line.startswith("#"):
            assert case is not None, f"{path.name}: command before a '# torch already installed' or " \
                                     f"'# fresh environment' comment: {line!r}"
            out[case].append(line.strip())
    return out


README_COMMANDS = documented_commands(ROOT / "README.md")


def command(case: str, installer: str) -> str:
    lines = [c for c in README_COMMANDS[case] if shlex.split(c)[0] == installer]
    assert len(lines) == 1, f"README must give one {installer} command for {case!r}, got {lines}"
    return lines[0]


def test_the_commands_are_written_once():
    """README.md holds the commands; the other documents point there instead of copying them."""
    for doc in sorted((ROOT / "docs").glob("*.md")):
        text = doc.read_text(encoding="utf-8")
        assert MARKER not in text, f"{doc.name} repeats README's install commands"
        for line in (ln for c in README_COMMANDS.values() for ln in c):
            assert line not in text, f"{doc.name} repeats {line!r}"


def test_documented_commands_have_the_expected_shape():
    variant_url = f"{DOC_SITE}{DOC_LABEL}/simple/"
    cuda_tag = "cu" + variant.parse_label(DOC_LABEL).cuda.replace(".", "")
    assert DOC_TORCH_INDEX.endswith("/" + cuda_tag)  # torch's index for the label's CUDA version
    for case in CASES:
        for installer in ("pip", "uv"):
            argv = shlex.split(command(case, installer))
            verb = ["pip", "install"] if installer == "pip" else ["uv", "pip", "install"]
            assert argv[: len(verb)] == verb and argv[len(verb)] == "mamba-kernels"
            opts = dict(zip(argv[len(verb) + 1 :: 2], argv[len(verb) + 2 :: 2]))
            want = {"--index-url": variant_url}
            if case == "fresh":
                want["--extra-index-url"] = DOC_TORCH_INDEX
            assert opts == want, argv
    assert sum(len(v) for v in README_COMMANDS.values()) == 4
    # the tested wheel carries the documented label: the lines run with that label as written
    assert TEST_LABEL == DOC_LABEL


# ----------------------------------------------------------------------------- which index to take


def _doc_section(path: Path, heading: str) -> str:
    text = path.read_text(encoding="utf-8")
    start = text.index(heading + "\n")
    end = text.find("\n#", start + len(heading))
    return text[start : end if end >= 0 else len(text)]


def documented_choices() -> List[tuple]:
    """(example torch versions, label, requirement) of each row of README's table of which index
    to take, e.g. ((``2.14.1+cu130``, ...), ``cu130stable2.10``, ``torch>=2.10``)."""
    rows = []
    for line in _doc_section(ROOT / "README.md", "## After the first release").splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cols) == 3 and not cols[0].startswith(("---", "your torch")):
            examples = tuple(re.findall(r"`(\d+\.\d+\.\d+\+cu\d+)`", cols[0]))
            (label,) = re.findall(r"`(cu\d+(?:torch|stable)[\d.]+\w*)`", cols[1])
            (requirement,) = re.findall(r"`(torch[^`]+)`", cols[2])
            assert examples, f"README table row without an example torch version: {line!r}"
            rows.append((examples, label, requirement))
    return rows


def test_the_documented_index_is_the_resolvers_choice():
    """Each example torch of README's table, resolved against every wheel the matrix builds
    (Linux x86_64, Python 3.11, no GPU), gets a wheel of the row's label, which requires what the
    row says; the rows cover every stable label and one per-minor label; the command block's
    label is the table's for torch 2.14 built for CUDA 13.0."""
    rows = documented_choices()
    candidates = [resolve.Candidate(filename=variant.wheel_name(__version__, c), url="file")
                  for c in matrix.select()]
    for examples, label, requirement in rows:
        for torch in examples:
            target = environment.detect(torch=torch, python="3.11", platform_tag="linux_x86_64",
                                        gpu_archs=[], runner=lambda cmd, timeout: (127, ""),
                                        toolchain=False)
            chosen = resolve.resolve(candidates, target).selected
            assert chosen is not None, f"README's table: no wheel fits torch {torch}"
            built = variant.parse_wheel_name(chosen.candidate.filename).variant
            assert variant.variant_label(built) == label, (torch, chosen.candidate.filename)
            want = variant.stable_torch_requirement(built.torch) if built.stable else \
                variant.torch_requirement(built.torch)
            assert requirement == want, (torch, requirement, want)
    labels = {label for _, label, _ in rows}
    stable = {variant.cell_label(c) for c in support.stable_cells()}
    assert stable <= labels and labels - stable, f"table labels {sorted(labels)}, stable {sorted(stable)}"
    assert any(label == DOC_LABEL and "2.14.1+cu130" in ex for ex, label, _ in rows)


# ----------------------------------------------------------------------------- what the wheel requires


def _imports(path: Path) -> set:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_shipped_code_imports_only_what_the_wheel_requires():
    """Every import in the shipped packages is the standard library, our own packages, or a
    requirement of the wheel: anything else would be missing after the documented installs."""
    required = {re.split(r"[<>=!~;\s\[]", r, maxsplit=1)[0].lower() for r in build.install_requires()}
    assert required == {"torch"}
    allowed = set(sys.stdlib_module_names) | set(SHIPPED) | required | {"__future__"}
    stray = []
    for pkg in SHIPPED:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for name in sorted(_imports(path) - allowed - TOOL_IMPORTS.get(rel, set())):
                stray.append(f"{rel} imports {name}")
    assert not stray, (
        "imports that no documented install command provides (add them to build.install_requires only "
        f"if both the variant index and torch's index can serve them): {stray}"
    )


BLOCKED = """
import sys
for name in ("packaging", "setuptools", "pkg_resources"):
    sys.modules[name] = None  # importing them now raises ImportError
import causal_conv1d, selective_scan, mamba_kernels
from mamba_kernels.runtime import buildinfo, dispatch
from mamba_kernels.install import environment
from mamba_kernels.facts import variant
from mamba_kernels.cli import main as cli
assert cli.main(["info", "--json"]) == 0
"""


def test_runtime_works_without_build_tools():
    """The packages and `python -m mamba_kernels info` work where packaging and setuptools are
    missing, as in an environment made by the documented commands (torch requires neither at
    run time)."""
    r = _run([sys.executable, "-c", BLOCKED], cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]


# ----------------------------------------------------------------------------- fixtures


def _run(argv, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("timeout", 600)
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, **kw)


def _ok(r: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert r.returncode == 0, f"{' '.join(r.args)}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r


def _uv() -> Path:
    uv = BIN / "uv" if (BIN / "uv").exists() else shutil.which("uv")
    assert uv, "uv is not installed: scripts/setup.sh installs it (pip install uv)"
    return Path(uv)


def _platform() -> str:
    machine = platform.machine().lower()
    if not sys.platform.startswith("linux") or machine not in ("x86_64", "aarch64"):
        pytest.skip(f"the served-index installs run on Linux x86_64/aarch64, not {sys.platform} {machine}")
    return f"linux_{machine}"


def relabel(pure: Path, out_dir: Path, version: str, requires: List[str], tag: str) -> Path:
    """A copy of the pure wheel ``pure`` labelled like a release: file name, dist-info folder,
    METADATA Version and Requires-Dist, WHEEL Tag, and a RECORD that matches."""
    old_version = pure.name.split("-")[1]
    old_di, new_di = f"mamba_kernels-{old_version}.dist-info/", f"mamba_kernels-{version}.dist-info/"
    files: Dict[str, bytes] = {}
    with zipfile.ZipFile(pure) as zf:
        for name in zf.namelist():
            if name != old_di + "RECORD":
                files[new_di + name[len(old_di) :] if name.startswith(old_di) else name] = zf.read(name)
    head, sep, body = files[new_di + "METADATA"].decode("utf-8").partition("\n\n")
    lines = [ln for ln in head.split("\n") if not ln.startswith(("Requires-Dist:", "Version:"))]
    lines.insert(2, f"Version: {version}")
    lines += [f"Requires-Dist: {r}" for r in requires]
    files[new_di + "METADATA"] = ("\n".join(lines) + sep + body).encode("utf-8")
    wheel = [ln for ln in files[new_di + "WHEEL"].decode().splitlines()
             if not ln.startswith(("Tag:", "Root-Is"))]
    files[new_di + "WHEEL"] = ("\n".join(wheel + ["Root-Is-Purelib: false", f"Tag: {tag}"]) + "\n").encode()
    return write_wheel(out_dir / f"mamba_kernels-{version}-{tag}.whl", files, new_di.rstrip("/"),
                       zipfile.ZIP_DEFLATED)


@pytest.fixture(scope="session")
def scratch():
    """A folder for this session's files, removed at the end: torch, its stand-in index, the
    caches and the environments take a few GB, which pytest's kept temp folders would multiply."""
    path = Path(tempfile.mkdtemp(prefix="mamba-kernels-install-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def venv_path(scratch, request):
    path = scratch / "venvs" / re.sub(r"\W+", "-", request.node.name)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def built_wheel(scratch):
    """(pure wheel built from this tree, the build's output)."""
    base = scratch / "build"
    src = base / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.py[cod]", "*.so", "*.pyd")
    src.mkdir(parents=True)
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy2(ROOT / name, src / name)
    for pkg in (*SHIPPED, "build_backend"):  # build_backend: pyproject's backend-path
        shutil.copytree(ROOT / pkg, src / pkg, ignore=ignore)
    env = dict(os.environ, MAMBA_KERNELS_SKIP_CUDA_BUILD="1", PIP_CONFIG_FILE=os.devnull)
    r = _ok(_run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
                  "--no-index", "-w", base / "dist", src], env=env, cwd=base))
    (wheel,) = (base / "dist").glob("mamba_kernels-*.whl")
    return wheel, r.stdout + r.stderr


def stable_cell() -> support.Cell:
    """The matrix's stable CUDA 13.0 cell for this platform: the wheel the commands install."""
    (cell,) = [c for c in support.stable_cells(platform=_platform()) if variant.cell_label(c) == TEST_LABEL]
    return cell


@pytest.fixture(scope="session")
def release_wheel(built_wheel, scratch):
    """The pure wheel under the exact file name of the release wheel of ``stable_cell``."""
    cell = stable_cell()
    name = variant.wheel_name(__version__, cell)
    version = variant.cell_release_version(__version__, cell)
    tag = name[len(f"{variant.DIST_NAME}-{version}-") : -len(".whl")]
    requires = build.install_requires(release_torch=TEST_TORCH, binding=build.STABLE)
    path = relabel(built_wheel[0], scratch / "wheels", version, requires, tag)
    assert path.name == name
    return path


@pytest.fixture(scope="session")
def torch_files(scratch):
    """torch 2.13.0+cpu and its dependencies, as wheels (pip download with the machine's config)."""
    _platform()
    dest = scratch / "torch-files"
    r = _run([sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:", "-d", dest,
              f"torch=={TEST_TORCH}"])
    if r.returncode != 0:
        pytest.fail(
            f"pip cannot find torch {TEST_TORCH} (a CPU wheel, about 180 MB) for the stand-in of PyTorch's "
            "index; with network access set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu.\n"
            + r.stderr[-2000:]
        )
    return dest


def _pep503(folder: Path, wheels: List[Path]) -> None:
    """A PEP 503 simple index of ``wheels`` under ``folder`` (one page per project)."""
    for w in wheels:
        project = re.sub(r"[-_.]+", "-", w.name.split("-")[0]).lower()
        (folder / project).mkdir(parents=True, exist_ok=True)
        shutil.copy2(w, folder / project / w.name)
    for page in folder.iterdir():
        links = [f'<a href="{w.name}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">{w.name}</a><br/>'
                 for w in sorted(page.glob("*.whl"))]
        html = "<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n"
        (page / "index.html").write_text(html)


@pytest.fixture(scope="session")
def served(release_wheel, torch_files, scratch):
    """Base URL of a server on 127.0.0.1: /site/ (our index, written by the CLI) and
    /pytorch/whl/cu130/ (the stand-in for PyTorch's index)."""
    root = scratch / "served"
    _ok(_run([sys.executable, "-m", "mamba_kernels", "index", release_wheel.parent, root / "site"], cwd=ROOT))
    assert (root / "site" / TEST_LABEL / "simple" / "mamba-kernels" / "index.html").is_file()
    _pep503(root / "pytorch" / "whl" / DOC_TORCH_INDEX.rsplit("/", 1)[1], sorted(torch_files.glob("*.whl")))

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def caches(scratch):
    return {"pip": scratch / "pip-cache", "uv": scratch / "uv-cache"}


def clean_env(venv: Path, caches) -> Dict[str, str]:
    """The environment of an activated ``venv``, with every pip/uv setting of this machine removed."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PIP_", "UV_", "VIRTUAL_ENV", "PYTHON", "CONDA"))}
    env.update(
        VIRTUAL_ENV=str(venv),
        PATH=os.pathsep.join([str(venv / "bin"), env.get("PATH", "")]),
        PIP_CONFIG_FILE=os.devnull,  # no pip.conf: no find-links, extra indexes or constraints
        PIP_CACHE_DIR=str(caches["pip"]),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        UV_NO_CONFIG="1",
        UV_CACHE_DIR=str(caches["uv"]),
        UV_PYTHON_DOWNLOADS="never",
    )
    return env


def new_venv(path: Path, installer: str, caches) -> Path:
    """A new environment: ``python -m venv`` (with its bootstrapped pip) for pip, ``uv venv`` for uv."""
    if installer == "pip":
        _ok(_run([sys.executable, "-m", "venv", path]))
    else:
        _ok(_run([_uv(), "venv", "-q", "--python", sys.executable, path], env=clean_env(path, caches)))
    return path


def run_documented(line: str, venv: Path, url: str, caches) -> subprocess.CompletedProcess:
    """Run a documented line in ``venv`` as a shell would after activating it."""
    text = line.replace(DOC_SITE, f"{url}/site/")
    text = text.replace(DOC_TORCH_INDEX, f"{url}/pytorch/whl/{DOC_TORCH_INDEX.rsplit('/', 1)[1]}")
    assert "<" not in text and "https://" not in text, text
    argv = shlex.split(text)
    argv[0] = str(venv / "bin" / "pip") if argv[0] == "pip" else str(_uv())
    return _run(argv, env=clean_env(venv, caches), cwd=venv)


def installed(venv: Path) -> Dict[str, str]:
    """{project: version} of the environment's site-packages."""
    site = next(venv.glob("lib/python*/site-packages"))
    out = {}
    for di in site.glob("*.dist-info"):
        name, version = di.name[: -len(".dist-info")].split("-", 1)
        out[re.sub(r"[-_.]+", "-", name).lower()] = version
    return out


def torch_files_state(venv: Path) -> Dict[str, int]:
    """mtime of every file torch installed (its RECORD), to see that an install left torch alone."""
    site = next(venv.glob("lib/python*/site-packages"))
    (di,) = site.glob("torch-*.dist-info")
    state = {}
    for line in (di / "RECORD").read_text().splitlines():
        rel = line.rsplit(",", 2)[0]
        if rel and not rel.endswith(".pyc"):
            state[rel] = (site / rel).stat().st_mtime_ns
    return state


CHECK = """
import json, subprocess, sys
import torch, mamba_kernels, causal_conv1d, selective_scan
from causal_conv1d import causal_conv1d_fn
from importlib.metadata import version
y = causal_conv1d_fn(torch.randn(1, 4, 16), torch.randn(4, 3), activation="silu")
info = subprocess.run([sys.executable, "-m", "mamba_kernels", "info", "--json"],
                      capture_output=True, text=True)
assert info.returncode == 0, info.stdout + info.stderr
json.loads(info.stdout)
print(json.dumps({"torch": torch.__version__, "ours": version("mamba-kernels"), "shape": list(y.shape)}))
"""


def check_environment(venv: Path, caches) -> None:
    r = _ok(_run([venv / "bin" / "python", "-c", CHECK], env=clean_env(venv, caches), cwd=venv))
    got = json.loads(r.stdout.strip().splitlines()[-1])
    want_ours = variant.cell_release_version(__version__, stable_cell())
    assert got == {"torch": TEST_TORCH, "ours": want_ours, "shape": [1, 4, 16]}


def preinstall_torch(venv: Path, torch_files: Path, caches) -> None:
    """Set-up, not a documented command: torch and its dependencies from the local files."""
    _ok(_run([_uv(), "pip", "install", "-q", "--python", venv / "bin" / "python", "--no-index",
              "--find-links", torch_files, f"torch=={TEST_TORCH}"], env=clean_env(venv, caches)))


# ----------------------------------------------------------------------------- the built wheel


def test_built_wheel_metadata(built_wheel, release_wheel):
    """The build writes the SPDX license fields, and without a deprecation warning about them;
    the release-labelled copy requires exactly build.install_requires for its torch."""
    wheel, log = built_wheel
    with zipfile.ZipFile(wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        head = zf.read(meta).decode().partition("\n\n")[0].splitlines()
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in zf.namelist())
    assert "License-Expression: BSD-3-Clause" in head and "License-File: LICENSE" in head
    assert not [ln for ln in head if ln.startswith("Classifier: License ::")]
    assert not [ln for ln in log.splitlines() if "deprecat" in ln.lower() and "license" in ln.lower()]
    with zipfile.ZipFile(release_wheel) as zf:
        meta = zf.read(f"mamba_kernels-0.1.0+{TEST_LABEL}.dist-info/METADATA").decode().partition("\n\n")[0]
        wheel_tags = [ln for ln in zf.read(f"mamba_kernels-0.1.0+{TEST_LABEL}.dist-info/WHEEL").decode()
                      .splitlines() if ln.startswith("Tag:")]
    requires = [ln for ln in meta.splitlines() if ln.startswith("Requires-Dist:")]
    assert requires == [f"Requires-Dist: {variant.cell_torch_requirement(stable_cell())}"] == \
        ["Requires-Dist: torch>=2.10"]
    assert f"Version: 0.1.0+{TEST_LABEL}" in meta.splitlines()
    assert wheel_tags == [f"Tag: cp310-abi3-manylinux_2_28_{platform.machine().lower()}"]


# ----------------------------------------------------------------------------- the commands, installed


@pytest.mark.slow
@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_fresh_environment_command(installer, served, caches, venv_path):
    venv = new_venv(venv_path, installer, caches)
    assert "torch" not in installed(venv)
    _ok(run_documented(command("fresh", installer), venv, served, caches))
    have = installed(venv)
    assert have["mamba-kernels"] == f"0.1.0+{TEST_LABEL}" and have["torch"] == TEST_TORCH
    check_environment(venv, caches)


@pytest.mark.slow
@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_torch_installed_command(installer, served, torch_files, caches, venv_path):
    venv = new_venv(venv_path, installer, caches)
    preinstall_torch(venv, torch_files, caches)
    before, torch_before = installed(venv), torch_files_state(venv)
    assert before["torch"] == TEST_TORCH and "mamba-kernels" not in before
    _ok(run_documented(command("torch installed", installer), venv, served, caches))
    after = installed(venv)
    assert after == dict(before, **{"mamba-kernels": f"0.1.0+{TEST_LABEL}"})  # only ours was added
    assert torch_files_state(venv) == torch_before  # torch not reinstalled
    check_environment(venv, caches)


@pytest.mark.slow
@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_torch_installed_command_fails_without_torch(installer, served, caches, venv_path):
    """What README says: the variant index alone cannot supply torch."""
    venv = new_venv(venv_path, installer, caches)
    r = run_documented(command("torch installed", installer), venv, served, caches)
    assert r.returncode != 0
    assert "torch" in (r.stdout + r.stderr)
    if installer == "pip":  # the message README quotes
        requirement = variant.cell_torch_requirement(stable_cell())
        assert f"No matching distribution found for {requirement}" in r.stderr
    assert "mamba-kernels" not in installed(venv)
