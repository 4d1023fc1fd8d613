"""What ``pip install mamba-kernels`` (or ``uv pip install``) does with our sdist.

The in-tree build backend (build_backend/mamba_kernels_backend.py) calls :func:`build_wheel`
when it builds a wheel from an unpacked sdist. It does the first of these that applies, and
never installs or changes torch (the wheel it hands back declares no torch requirement):

1. ``prebuilt``: the release index (``MAMBA_KERNELS_INDEX``, else the published one, both read
   by mamba_kernels.facts.release_index) has a wheel for the target environment: it is downloaded, its
   sha256 checked, and handed back with the sdist's version (the variant stays in BUILD_INFO
   and in the install record). Installers compare the built wheel's version with the sdist's;
   pip's wheel cache refuses a cached wheel whose version differs (docs/INSTALL.md).
2. ``source``: torch with CUDA and nvcc are in the target environment and there are GPUs to
   build for (or ``TORCH_CUDA_ARCH_LIST`` / ``MAMBA_KERNELS_FORCE_BUILD``): the extensions are
   built by the target's own interpreter, against its torch.
3. ``pure``: the pure-Python package, with one line saying why.

The target environment is the one the installer installs into, which with build isolation is
not the one running this code. pip runs the backend with the target's interpreter (isolation
only hides its site-packages), so that interpreter is asked, without pip's isolation variables.
uv runs it in a virtual environment of its own, so the target is read from the uv process
that started the backend (its ``--python``, ``VIRTUAL_ENV``, ``CONDA_PREFIX``, or the ``.venv``
it would find), on Linux through /proc. ``MAMBA_KERNELS_TARGET_PYTHON`` names it outright. When
none of that works (``--target``/``--prefix`` installs, another platform under uv), the build
stops with one line giving the command that works. The build environment's own torch is never
looked at.

Each wheel carries an install record (``mamba_kernels_install.json`` in its dist-info): the
path taken, the line shown, the target. mamba_kernels/runtime/install_record.py reads it back at
run time for ``python -m mamba_kernels doctor`` and the fallback warning.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from email.parser import BytesHeaderParser, HeaderParser
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..build import plan, torch_env
from ..facts import release_index
from ..runtime import install_record, knobs
from ..runtime.terminal import tell
from . import fetching, installer, resolve, wheel_contents
from .environment import Gpu, Target

TARGET_VAR = knobs.TARGET_PYTHON_VAR
INDEX_TIMEOUT_VAR = knobs.INDEX_TIMEOUT_VAR
DEFAULT_INDEX_TIMEOUT = float(knobs.BY_NAME[INDEX_TIMEOUT_VAR].default)
PROBE_TIMEOUT = 180.0
# Variables an installer sets for its isolated build; the target's interpreter runs without them.
ISOLATION_VARS = ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME", "VIRTUAL_ENV", "PEP517_BUILD_BACKEND",
                  "PEP517_BACKEND_PATH")
PREFIX = "mamba-kernels: "


class StopInstall(RuntimeError):
    """The install cannot go on without the user's help; the message is one line with the fix."""


# ----------------------------------------------------------------------------- the target


@dataclass(frozen=True)
class TargetPython:
    python: Optional[str]  # the interpreter that will import the package; None: unknown
    how: str  # where it came from, for the messages
    problem: Optional[str] = None  # why it is unknown (python is None)


def _opt_value(args: Sequence[str], names: Sequence[str]) -> Tuple[bool, Optional[str]]:
    """(present, value) of the last ``--name value``, ``--name=value`` or ``-pVALUE`` in args."""
    found, value = False, None
    for i, a in enumerate(args):
        for n in names:
            if a == n:
                found, value = True, (args[i + 1] if i + 1 < len(args) else None)
            elif a.startswith(n + "=") and n.startswith("--"):
                found, value = True, a[len(n) + 1:]
            elif len(n) == 2 and a.startswith(n) and len(a) > 2 and not a.startswith("--"):
                found, value = True, a[2:]
    return found, value


def _python_in(prefix: str) -> str:
    if sys.platform == "win32":
        return os.path.join(prefix, "Scripts", "python.exe")
    return os.path.join(prefix, "bin", "python")


def _interpreter(where: str) -> Optional[str]:
    """An interpreter path from a ``--python`` value: a file, or an environment directory."""
    if os.path.isdir(where):
        exe = _python_in(where)
        return exe if os.path.isfile(exe) else None
    if os.path.isfile(where):
        return where
    found = shutil.which(where) if os.sep in where or where.startswith("python") else None
    return found


def _find_venv(start: str) -> Optional[str]:
    d = Path(start).resolve()
    for p in (d, *d.parents):
        if (p / ".venv" / "pyvenv.cfg").is_file():
            return str(p / ".venv")
    return None


def target_from_uv(cmdline: Sequence[str], environ: Mapping[str, str], cwd: str) -> TargetPython:
    """The environment a ``uv`` command line installs into, as uv chooses it: ``--python``
    (``-p``, ``UV_PYTHON``), else ``VIRTUAL_ENV``, else ``CONDA_PREFIX``, else the nearest
    ``.venv``; project commands (``uv sync``, ``uv run``...) use ``UV_PROJECT_ENVIRONMENT`` or the
    project's ``.venv``. ``--target``/``--prefix``/``--system`` cannot be followed."""
    args = list(cmdline[1:])
    verb = next((a for a in args if not a.startswith("-")), "")
    how = "uv " + verb
    for opt in ("--target", "-t", "--prefix"):
        if _opt_value(args, [opt])[0]:
            return TargetPython(None, how, f"`uv pip install {opt}` installs into a directory, "
                                           "not into an environment with a torch")
    if _opt_value(args, ["--system"])[0] or environ.get("UV_SYSTEM_PYTHON", "").lower() in ("1", "true"):
        return TargetPython(None, how, "uv --system: which interpreter uv picked is not visible here")
    given, value = _opt_value(args, ["--python", "-p"])
    value = value if given else environ.get("UV_PYTHON") or None
    if value:
        exe = _interpreter(os.path.join(cwd, value) if not os.path.isabs(value) and os.sep in value
                           else value)
        if exe is None:
            return TargetPython(None, how, f"uv --python {value}: not an interpreter path this backend "
                                           "can follow (a version request)")
        return TargetPython(exe, f"{how} --python {value}")
    if verb == "pip":
        for var in ("VIRTUAL_ENV", "CONDA_PREFIX"):
            if environ.get(var):
                return TargetPython(_python_in(environ[var]), f"{how} ({var}={environ[var]})")
    elif environ.get("UV_PROJECT_ENVIRONMENT"):
        env = environ["UV_PROJECT_ENVIRONMENT"]
        env = env if os.path.isabs(env) else os.path.join(cwd, env)
        return TargetPython(_python_in(env), f"{how} (UV_PROJECT_ENVIRONMENT={env})")
    venv = _find_venv(cwd)
    if venv:
        return TargetPython(_python_in(venv), f"{how} (the .venv at {venv})")
    return TargetPython(None, how, "uv found no environment to install into that this backend can see")


def _pip_target_problem(cmdline: Sequence[str], environ: Mapping[str, str]) -> Optional[str]:
    for opt in ("--target", "-t", "--prefix", "--root"):
        var = "PIP_" + opt.lstrip("-").upper()
        if _opt_value(list(cmdline), [opt])[0] or (len(opt) > 2 and environ.get(var)):
            return f"`pip install {opt}` installs into a directory, not into an environment with a torch"
    return None


def _parent() -> Optional[Tuple[List[str], Dict[str, str], str]]:
    """(command line, environment, working directory) of the process that started this one
    (Linux /proc), or None."""
    ppid = os.getppid()
    try:
        cmd = Path(f"/proc/{ppid}/cmdline").read_bytes().split(b"\0")
        env = Path(f"/proc/{ppid}/environ").read_bytes().split(b"\0")
        cwd = os.readlink(f"/proc/{ppid}/cwd")
    except OSError:
        return None
    environ = dict(e.decode(errors="replace").split("=", 1) for e in env if b"=" in e)
    return [c.decode(errors="replace") for c in cmd if c], environ, cwd


def find_target(environ: Mapping[str, str] = os.environ,
                parent: Callable[[], Optional[Tuple[List[str], Dict[str, str], str]]] = _parent
                ) -> TargetPython:
    """The interpreter of the environment being installed into."""
    if environ.get(TARGET_VAR, "").strip():
        exe = _interpreter(environ[TARGET_VAR].strip())
        if exe is None:
            raise StopInstall(f"{TARGET_VAR}={environ[TARGET_VAR]!r} is not a Python interpreter "
                              "(or an environment directory holding one)")
        return TargetPython(exe, TARGET_VAR)
    if environ.get("UV"):  # uv sets UV to its own path for the backends it runs
        p = parent()
        if p is None or not os.path.basename(p[0][0] if p[0] else "").startswith("uv"):
            return TargetPython(None, "uv", "the uv process that runs this build cannot be read here")
        cmd, penv, cwd = p
        return target_from_uv(cmd, penv, cwd)
    if environ.get("PIP_BUILD_TRACKER") or environ.get("PIP_REQ_TRACKER"):
        # pip runs build backends with its own interpreter: the one it installs into.
        p = parent()
        problem = _pip_target_problem(p[0] if p else [], environ)
        if problem:
            return TargetPython(None, "pip", problem)
        return TargetPython(sys.executable, "pip (its interpreter)")
    return TargetPython(sys.executable, "the interpreter running this build")


def installer_command(environ: Mapping[str, str] = os.environ,
                      parent: Callable[[], Optional[Tuple[List[str], Dict[str, str], str]]] = _parent
                      ) -> str:
    """The command the user ran, as a shell line (for the stop message), or a generic one."""
    p = parent()
    if p and p[0]:
        cmd = list(p[0])
        script = os.path.basename(cmd[1]) if len(cmd) > 1 else ""
        if os.path.basename(cmd[0]).startswith("uv"):
            cmd = ["uv"] + cmd[1:]
        elif script == "__pip-runner__.py" or script.startswith("pip"):  # the pip script, or pip --python
            cmd = ["pip"] + cmd[2:]
        return shlex.join(cmd)
    return "uv pip install mamba-kernels" if environ.get("UV") else "pip install mamba-kernels"


PROBE = ("import json, sys; sys.path.insert(0, sys.argv[1]); "
         "from mamba_kernels.install.environment import detect; print(json.dumps(detect().as_dict()))")


def probe_env(environ: Mapping[str, str]) -> Dict[str, str]:
    """The environment for running the target's interpreter: without the installer's isolation."""
    env = {k: v for k, v in environ.items() if k not in ISOLATION_VARS}
    return env


def probe_target(python: str, root: str, environ: Mapping[str, str] = os.environ) -> Dict[str, Any]:
    """The target environment as mamba_kernels.install.environment.detect() sees it from ``python``."""
    try:
        p = subprocess.run([python, "-c", PROBE, root], capture_output=True, text=True,
                           env=probe_env(environ), timeout=PROBE_TIMEOUT, cwd=root)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise StopInstall(f"the target interpreter {python} cannot be run: {e}") from None
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["no output"])[-1]
        raise StopInstall(f"the target interpreter {python} failed to describe its environment: {last}")
    lines = p.stdout.strip().splitlines()
    try:
        facts = json.loads(lines[-1])
        target_of(facts)
    except (ValueError, IndexError, RecursionError, KeyError, TypeError, AttributeError):
        shown = repr(lines[-1][:80]) if lines else "nothing"
        raise StopInstall(f"the target interpreter {python} is not a Python this backend can ask: it printed "
                          f"{shown} instead of its environment") from None
    return facts


def target_of(facts: Mapping[str, Any]):
    """A mamba_kernels.install.environment.Target from the probe's ``as_dict()``."""
    return Target(
        python=facts["python"], platform=facts["platform"], platform_tags=tuple(facts["platform_tags"]),
        torch=facts["torch"], torch_cuda=facts["torch_cuda"], cxx11_abi=facts["cxx11_abi"],
        gpus=tuple(Gpu(g["index"], g["capability"], g.get("name", "")) for g in facts["gpus"]),
        driver=facts.get("driver"), cuda_home=facts.get("cuda_home"),
        cuda_home_how=facts.get("cuda_home_how"), nvcc=facts.get("nvcc"),
        sources=dict(facts.get("sources", {})),
    )


# ----------------------------------------------------------------------------- path 1: prebuilt


def _timeout(environ: Mapping[str, str]) -> float:
    raw = environ.get(INDEX_TIMEOUT_VAR, "").strip()
    if not raw:
        return DEFAULT_INDEX_TIMEOUT
    try:
        return fetching.parse_timeout(raw, INDEX_TIMEOUT_VAR)
    except ValueError as e:
        raise StopInstall(str(e)) from None


def prebuilt(target: Any, indexes: Sequence[str], dest: str, timeout: float
             ) -> Tuple[Optional[Tuple[Any, str, str, str]], List[str]]:
    """The first index (in order) with a wheel for ``target``, fetched and verified into ``dest``
    by mamba_kernels.install.installer.fetch: ((candidate, path, sha256, index) or None, why not, per
    index). An index that cannot be read, has no fitting wheel, or whose download fails or does
    not verify is one reason, and the next index is tried."""

    why: List[str] = []
    for index in indexes:
        try:
            res = resolve.resolve(resolve.read_source(index, timeout=timeout), target)
        except resolve.SourceError as e:
            why.append(f"the index could not be read ({e})")
            continue
        except Exception as e:  # whatever an index holds, the install goes on to the next path
            why.append(f"the index {index} could not be used ({type(e).__name__}: {e})")
            continue
        if res.selected is None:
            why.append(f"no wheel in {index} fits {resolve.describe_target(target)}")
            continue
        c = res.selected.candidate
        try:
            path, sha = installer.fetch(c, Path(dest), timeout)
            with zipfile.ZipFile(path) as zf:
                wheel_contents.vet(zf, f"{'-'.join(c.filename.split('-')[:2])}.dist-info")
        except installer.Failure as e:
            why.append(f"the wheel from {index} could not be used ({e.line})")
            continue
        except Exception as e:
            why.append(f"the wheel {c.filename} from {index} could not be used ({type(e).__name__}: {e})")
            continue
        return (c, str(path), sha, index), why
    return None, why


# ----------------------------------------------------------------------------- wheels


def _names_torch(requirement: str) -> bool:
    """Whether a requirement string is one on torch (an unparsable one is not)."""
    # optional: packaging is read only where a requirement or version is
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        return Requirement(requirement.strip()).name.lower() == "torch"
    except InvalidRequirement:
        return False


def _metadata_text(text: str, version: str) -> str:
    """METADATA with ``Version`` set and every torch requirement dropped (never install torch)."""
    head, sep, body = text.partition("\n\n")
    out = []
    for line in head.splitlines():
        key, _, value = line.partition(":")
        if key == "Version":
            line = f"Version: {version}"
        elif key == "Requires-Dist" and _names_torch(value):
            continue
        out.append(line)
    return "\n".join(out) + (sep + body if sep else "\n")


def strip_torch_requirement(metadata_dir: str, version: str) -> None:
    """Apply :func:`_metadata_text` to a prepared ``.dist-info`` directory's METADATA."""
    path = os.path.join(metadata_dir, "METADATA")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    with open(path, "w", encoding="utf-8") as f:
        f.write(_metadata_text(text, version))


def finish_wheel(src: str, out_dir: str, version: str, record: Mapping[str, Any]) -> str:
    """Copy the wheel ``src`` into ``out_dir`` as version ``version`` (file name, dist-info name,
    METADATA), without torch requirements, with the install record added; RECORD is rewritten by
    wheel's WheelFile. Returns the new file name."""
    # the sdist's build requirements have wheel; the runtime need not
    from wheel.wheelfile import WheelFile

    parts = os.path.basename(src)[:-len(".whl")].split("-")
    dist, tag = parts[0], "-".join(parts[-3:])  # keep the tag text as built
    out_name = f"{dist}-{version}-{tag}.whl"
    new_info = f"{dist}-{version}.dist-info"
    out_path = os.path.join(out_dir, out_name)
    part_dir = tempfile.mkdtemp(prefix=".part-", dir=out_dir)  # renamed into place when complete
    tmp = os.path.join(part_dir, out_name)
    with WheelFile(src) as zin:
        old_info = zin.dist_info_path
        with WheelFile(tmp, "w") as zout:
            for item in zin.infolist():
                if item.filename == f"{old_info}/RECORD" or item.is_dir():
                    continue
                data = zin.read(item)  # WheelFile checks each entry against the source's RECORD
                arc = item.filename
                if arc.startswith(old_info + "/"):
                    arc = new_info + arc[len(old_info):]
                    if arc == f"{new_info}/METADATA":
                        data = _metadata_text(data.decode("utf-8"), version).encode("utf-8")
                info = zipfile.ZipInfo(arc, date_time=item.date_time)
                info.external_attr = item.external_attr
                info.compress_type = zipfile.ZIP_DEFLATED
                zout.writestr(info, data)
            text = json.dumps(dict(record), indent=2, sort_keys=True) + "\n"
            zout.writestr(f"{new_info}/{install_record.RECORD_NAME}", text)
    os.replace(tmp, out_path)
    os.rmdir(part_dir)
    return out_name


def _requires_txt(text: str) -> str:
    """An egg-info requires.txt without the torch line of its unconditional section."""
    out, section = [], None
    for line in text.splitlines():
        if line.startswith("["):
            section = line
        elif section is None and line.strip() and _names_torch(line):
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def strip_torch_from_sdist(path: str) -> None:
    """Rewrite the sdist at ``path`` so that its metadata (PKG-INFO, the egg-info) declares no
    torch requirement: uv takes an sdist's PKG-INFO as the wheel's metadata without building,
    and a torch requirement there would make installers install or change torch."""

    tmp = path + ".part"
    with tarfile.open(path, "r:gz") as tin, tarfile.open(tmp, "w:gz", format=tarfile.PAX_FORMAT) as tout:
        for member in tin.getmembers():
            data = tin.extractfile(member).read() if member.isfile() else None
            base = member.name.split("/", 1)[-1]
            if data is not None and (base == "PKG-INFO" or base.endswith(".egg-info/PKG-INFO")):
                data = _metadata_text(data.decode("utf-8"), _version_of(data)).encode("utf-8")
            elif data is not None and base.endswith(".egg-info/requires.txt"):
                data = _requires_txt(data.decode("utf-8")).encode("utf-8")
            if data is not None:
                member.size = len(data)
                tout.addfile(member, io.BytesIO(data))
            else:
                tout.addfile(member)
    os.replace(tmp, path)


def _version_of(pkg_info: bytes) -> str:
    return BytesHeaderParser().parsebytes(pkg_info)["Version"]


# ----------------------------------------------------------------------------- path 2: source


def source_build_decision(target: Any, environ: Mapping[str, str]) -> Tuple[bool, str]:
    """(build from source?, why) for the target environment and the build knobs."""
    k = plan.read_knobs(environ)
    if k.skip:
        return False, f"{plan.SKIP_BUILD_VAR} is on"
    if target.torch is None:
        return False, "there is no torch in the target environment to build against"
    if not target.torch_cuda:
        return False, f"torch {target.torch} is a CPU-only build"
    if not target.nvcc:
        return False, "no CUDA toolkit (nvcc) was found to build with (set CUDA_HOME)"
    problem = torch_env.cuda_major_problem(target.nvcc, target.torch_cuda, target.cuda_home or "")
    if problem:
        return False, problem
    return plan.arch_decision(k, list(target.gpu_archs) if target.gpus else [])


def tool_paths() -> List[str]:
    """The directories this build environment's build tools import from (setuptools, wheel,
    packaging, ninja's module), for the target's interpreter to find them."""
    dirs: List[str] = []
    for mod in ("setuptools", "wheel", "packaging", "ninja"):
        spec = importlib.util.find_spec(mod)
        if spec and spec.origin:
            d = os.path.dirname(os.path.dirname(spec.origin))
            if d not in dirs:
                dirs.append(d)
    return dirs


SOURCE_BUILD = ("import sys; from setuptools import build_meta; "
                "build_meta.build_wheel(sys.argv[1])")


def build_from_source(python: str, root: str, out_dir: str, environ: Mapping[str, str]) -> str:
    """Build the wheel with the target's interpreter and torch; the path of the wheel. A blocked
    or failed build is a RuntimeError whose message is the build's last error line."""
    env = probe_env(environ)
    env["PYTHONPATH"] = os.pathsep.join(tool_paths())  # setuptools first, torch from the target
    env[plan.FORCE_BUILD_VAR] = "1"  # a plan that cannot build says why instead of going pure
    env[plan.FROM_SDIST_VAR] = "1"  # our own line is shown; the build's goes to the log
    p = subprocess.run([python, "-c", SOURCE_BUILD, out_dir], cwd=root, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stderr.write(p.stdout)  # the installer shows it with -v, or when the install fails
    wheels = sorted(Path(out_dir).glob("*.whl"), key=lambda w: w.stat().st_mtime)
    if p.returncode != 0 or not wheels:
        lines = [ln for ln in p.stdout.strip().splitlines() if ln.strip()]
        errors = [ln for ln in lines if "error" in ln.lower()] or lines or ["no output"]
        last = errors[-1].strip()
        # build/plan.py's refusal names the FORCE_BUILD set here, not by the user: keep the reason only.
        for prefix in (f"{PREFIX}error: ", f"{plan.FORCE_BUILD_VAR} is on but the CUDA extensions cannot "
                                           "be built: "):
            last = last[len(prefix):] if last.startswith(prefix) else last
        raise RuntimeError(last)
    return str(wheels[-1])


# ----------------------------------------------------------------------------- telling the user


# ----------------------------------------------------------------------------- the choice


@dataclass
class Outcome:
    path: str  # "prebuilt", "source" or "pure"
    line: str
    reasons: List[str] = field(default_factory=list)
    wheel: Optional[str] = None  # the prebuilt wheel's original file name
    url: Optional[str] = None
    sha256: Optional[str] = None
    index: Optional[str] = None
    target: Dict[str, Any] = field(default_factory=dict)

    def record(self, how: str, version: str) -> Dict[str, Any]:
        return {
            "format": 1, "path": self.path, "line": self.line, "reasons": self.reasons,
            "wheel": self.wheel, "url": self.url, "sha256": self.sha256, "index": self.index,
            "target_found_by": how, "version": version, "time": int(time.time()),
            "target": {k: self.target.get(k) for k in ("python", "platform", "torch", "torch_cuda",
                                                       "cxx11_abi", "gpus", "nvcc", "cuda_home")},
        }


DOCTOR_COMMAND = "python -m mamba_kernels doctor"


def stop_line(problem: str, command: str) -> str:
    return (f"{PREFIX}error: cannot tell which torch this install is for: {problem}. Run it again naming "
            f"the interpreter that will import mamba_kernels: {TARGET_VAR}=/path/to/python {command}")


def sdist_version(root: str) -> str:
    """The version in the sdist's PKG-INFO."""
    with open(os.path.join(root, "PKG-INFO"), encoding="utf-8") as f:
        return HeaderParser().parse(f)["Version"]


def build_wheel(root: str, wheel_directory: str, pure_build: Callable[[str], str],
                environ: Mapping[str, str] = os.environ) -> str:
    """The backend's build_wheel for an unpacked sdist at ``root``. ``pure_build(out_dir)``
    builds the pure-Python wheel (setuptools with the CUDA build skipped) and returns its path.

    Long: the three ways to a wheel in their order of preference (a verified prebuilt wheel, a source
    build, pure Python), each falling through to the next with the reason it gave; one function, so the
    order and every fall-through read in one place.
    """

    version = sdist_version(root)
    try:
        build_knobs = plan.read_knobs(environ)
    except ValueError as e:
        raise StopInstall(str(e)) from None
    found = find_target(environ)
    if found.python is None:
        raise StopInstall(stop_line(found.problem or "unknown", installer_command(environ)))
    facts = probe_target(found.python, root, environ)
    target = target_of(facts)
    where = f"{found.python} ({found.how})"
    reasons: List[str] = []
    out: Optional[Outcome] = None
    with tempfile.TemporaryDirectory(prefix="mamba-kernels-") as tmp:
        # 1. a prebuilt wheel
        try:
            indexes, index_how = release_index.default_indexes(environ)
        except ValueError as e:
            raise StopInstall(str(e)) from None
        if build_knobs.force:
            reasons.append(f"{plan.FORCE_BUILD_VAR} is on, so no prebuilt wheel is used")
        elif target.torch is None:
            reasons.append(f"there is no torch in the target environment {where}; install torch, then "
                           "mamba-kernels again (--force-reinstall --no-deps) for the CUDA kernels")
        else:
            got, why = prebuilt(target, indexes, os.path.join(tmp, "prebuilt"), _timeout(environ))
            reasons += [f"no prebuilt wheel: {w}" for w in why]
            if got is not None:
                c, path, sha, index = got
                how = "sha256 verified" if c.sha256 else "a local index listing no sha256: hashed as read"
                line = (f"{PREFIX}installed the prebuilt wheel {c.filename} for torch {target.torch} "
                        f"(from {index}, {how}) as version {version}")
                out = Outcome("prebuilt", line, reasons, c.filename, c.url, sha, index, facts)
                try:
                    name = finish_wheel(path, wheel_directory, version, out.record(found.how, version))
                except Exception as e:  # a corrupt wheel (zipfile, wheel's WheelError): fall back
                    out = None
                    reasons.append(f"the prebuilt wheel {c.filename} is unusable ({e})")
        # 2. a source build
        if out is None and target.torch is not None:
            ok, why = source_build_decision(target, environ)
            if ok:
                start = time.monotonic()
                try:
                    built = build_from_source(found.python, root, os.path.join(tmp, "src"), environ)
                except RuntimeError as e:
                    if build_knobs.force:
                        raise StopInstall(f"{PREFIX}error: {plan.FORCE_BUILD_VAR} is on and the source "
                                          f"build failed: {e}") from None
                    reasons.append(f"the source build failed: {e}")
                else:
                    line = (f"{PREFIX}built the CUDA extensions from source against torch {target.torch} "
                            f"{why} in {time.monotonic() - start:.0f} s")
                    if reasons:
                        line += f" ({'; '.join(reasons)})"
                    out = Outcome("source", line, reasons, target=facts)
                    name = finish_wheel(built, wheel_directory, version, out.record(found.how, version))
            else:
                if build_knobs.force:
                    raise StopInstall(f"{PREFIX}error: {plan.FORCE_BUILD_VAR} is on but the CUDA "
                                      f"extensions cannot be built: {why}")
                reasons.append(f"no source build: {why}")
        # 3. pure Python
        if out is None and build_knobs.force:
            raise StopInstall(f"{PREFIX}error: {plan.FORCE_BUILD_VAR} is on but the CUDA extensions cannot "
                              f"be built: {'; '.join(reasons)}")
        if out is None:
            line = (f"{PREFIX}installed without the CUDA extensions, the PyTorch path runs: "
                    f"{'; '.join(reasons)}")
            out = Outcome("pure", line, reasons, target=facts)
            pure = pure_build(os.path.join(tmp, "pure"))
            name = finish_wheel(pure, wheel_directory, version, out.record(found.how, version))
    # The record keeps the line as the doctor shows it; only the terminal is told where to find it
    # again (the doctor quoting "run the doctor" would send its reader in a circle).
    tell(out.line + (f". `{DOCTOR_COMMAND}` shows this again" if out.path == "pure" else ""), environ)
    return name
