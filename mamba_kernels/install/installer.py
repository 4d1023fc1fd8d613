"""Getting the chosen release wheel onto a machine: ``python -m mamba_kernels install`` and
``python -m mamba_kernels download``.

``install`` resolves for the target interpreter (``--python-exe``, default: the running one),
downloads the chosen wheel, verifies it, and installs that exact file with
``<python> -m pip install --no-deps --no-index --force-reinstall <file>`` (``uv pip install``
when the target has no pip). ``--no-deps`` means torch is never installed, upgraded,
downgraded or replaced; a target without torch is refused, since no wheel can be matched
against it. ``download`` fills a wheelhouse for another machine the overrides describe.

What is verified before anything is kept (docs/INSTALL.md has the rules):

- the sha256 the index lists (manifest, ``#sha256=`` fragment, PEP 691 hashes). A remote file
  without a listed hash is refused. A wheel in a local directory that lists none is hashed as
  read (the user chose that file) and the hash is printed;
- the byte count the server announced (a short read is a truncated download);
- the wheel itself: our distribution, the version of its file name, and a torch requirement
  that the target's torch satisfies (the installed one for ``install``).

Atomic: the bytes go to a hidden ``.part`` file next to the destination, which is renamed into
place only after every check; on any failure or interrupt the partial file is deleted, and
nothing is installed. Indexes are tried in the order given: an index that cannot be read, has
no fitting wheel, or whose download fails or does not verify is reported in one line and the
next one is tried.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Dict, Iterator, List, Optional, Sequence, Tuple

try:
    import fcntl  # POSIX: the environment lock
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]
try:
    import msvcrt  # Windows: the environment lock
except ImportError:
    msvcrt = None  # type: ignore[assignment]

from ..facts import release_index, variant
from . import environment, fetching, resolve, site_snapshot, target_probe, wheel_contents, wheel_metadata
from .resolve import Candidate, Resolution, SourceError

EXIT_OK = 0
EXIT_USAGE = 2  # bad arguments or MAMBA_KERNELS_INDEX
EXIT_NO_MATCH = resolve.EXIT_NO_MATCH  # 3: no index lists a wheel that fits
EXIT_FETCH = 4  # no index could be read, or the download failed (network, timeout, truncated)
EXIT_VERIFY = 5  # the file did not verify: sha256, no known hash, not our wheel, torch pin
EXIT_TARGET = 6  # the target cannot take it: no torch, no installer, the installer failed
EXIT_FS = 7  # a file could not be written: disk full, read-only, not a folder, name too long
EXIT_INTERRUPTED = 130
PROBE_TIMEOUT = 300.0  # importing a CUDA torch from a cold disk can take a while
_CHUNK = 1 << 16
LOCK_NAME = ".mamba-kernels-install.lock"  # in the target's site-packages: one install at a time
LOCK_WAIT = 600.0  # seconds an install waits for another one into the same environment
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class Failure(Exception):
    """One step failed; ``line`` says what and why in one line, ``code`` is the exit status."""

    def __init__(self, line: str, code: int) -> None:
        super().__init__(line)
        self.line = line
        self.code = code
        self.shown = False  # already printed (each failure is one line, once)


# ----------------------------------------------------------------------------- fetching

def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


class _Progress:
    """A plain progress line on stderr: redrawn in place on a terminal, else one line at the
    start and one at the end (logs stay readable)."""

    def __init__(self, name: str, total: Optional[int], stream: IO[str]) -> None:
        self.name, self.total, self.stream = name, total, stream
        self.tty = stream.isatty()
        self.last = 0.0
        size = f" ({_size(total)})" if total else ""
        if not self.tty:
            print(f"downloading {name}{size}", file=stream, flush=True)

    def update(self, done: int) -> None:
        now = time.monotonic()
        if not self.tty or now - self.last < 0.1:
            return
        self.last = now
        if self.total:
            width = 30
            filled = int(width * done / self.total)
            bar = "#" * filled + "-" * (width - filled)
            text = f"\r  [{bar}] {100 * done / self.total:5.1f}% {_size(done)} of {_size(self.total)}"
        else:
            text = f"\r  {_size(done)}"
        self.stream.write(text)
        self.stream.flush()

    def close(self, done: int, ok: bool) -> None:
        if self.tty:
            self.stream.write("\r" + " " * 70 + "\r")
        if ok:
            print(f"  {_size(done)} received", file=self.stream, flush=True)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fs_failure(what: str, e: OSError) -> Failure:
    return Failure(f"{what}: {e.strerror or e}" + (f" ({e.filename})" if e.filename else ""), EXIT_FS)


def fetch(c: Candidate, dest: Path, timeout: float, stream: IO[str] = sys.stderr,
          allow_unhashed: bool = False) -> Tuple[Path, str]:
    """Copy or download ``c`` to ``dest/<filename>`` and verify it; (the path, the sha256).

    The trust rules (docs/INSTALL.md, What is trusted): a wheel listed by a remote index needs
    the sha256 that index lists (``allow_unhashed`` relaxes this); the download is bounded by
    the size the index records, else :data:`mamba_kernels.install.fetching.MAX_WHEEL_BYTES`, and by
    ``timeout`` as a whole. The file appears under its name, readable as the umask allows, only
    once it is complete and verified; on any failure, or an interrupt, the partial file is
    removed and :class:`Failure` (or the interrupt) propagates."""
    try:
        resolve.check_plain_filename(c.filename, c.source or c.url)
    except SourceError as e:
        raise Failure(str(e), EXIT_VERIFY) from None
    expected = c.sha256.lower() if c.sha256 else None
    if expected is not None and not _SHA256_RE.match(expected):
        raise Failure(f"{c.filename}: the index lists sha256 {c.sha256!r}, which is not 64 hex digits",
                      EXIT_VERIFY)
    if expected is None and (c.remote or fetching.is_url(c.url)) and not allow_unhashed:
        raise Failure(f"{c.filename}: the index {c.source or c.url} lists no sha256 for it: a wheel from a "
                      "remote index must carry one (--allow-unhashed accepts it anyway)", EXIT_VERIFY)
    limit = fetching.MAX_WHEEL_BYTES if c.size is None else c.size
    if limit > fetching.MAX_WHEEL_BYTES:
        raise Failure(f"{c.filename}: the index lists {c.size} bytes, above the limit of "
                      f"{fetching.MAX_WHEEL_BYTES} bytes for a wheel", EXIT_VERIFY)
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _fs_failure(f"--dest {dest}: cannot be created", e) from None
    final = dest / c.filename
    try:
        fd, tmp_name = tempfile.mkstemp(dir=dest, prefix=f".{c.filename[:80]}.", suffix=".part")
    except OSError as e:
        raise _fs_failure(f"--dest {dest}: cannot be written", e) from None
    tmp = Path(tmp_name)
    box: List[Any] = []
    try:
        try:
            _receive(c, fd, tmp, timeout, limit, stream, box)
        except OSError as e:  # raised by the buffered file's last write, when it closes
            raise _fs_failure(f"{tmp} cannot be written", e) from None
        done, digest, progress, announced = box
        if c.size is not None and done != c.size:
            raise Failure(f"{c.url}: {done} bytes arrived, the index lists {c.size}", EXIT_VERIFY)
        if expected is not None and digest != expected:
            if c.size is None:  # nothing said how long it is: a short file reads as a changed one
                got = "the server announced that size" if announced == done else "neither the index nor " \
                    "the server gave a size"
                raise Failure(f"{c.filename}: sha256 mismatch: received {done} bytes ({got}), whose sha256 "
                              f"is {digest}, not the {expected} the index lists: the download may be "
                              f"truncated or altered (from {c.url})", EXIT_VERIFY)
            raise Failure(f"{c.filename}: sha256 mismatch: the index lists {expected}, the file "
                          f"from {c.url} has {digest}", EXIT_VERIFY)
        try:
            os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, final)
        except OSError as e:
            raise _fs_failure(f"{final} cannot be written", e) from None
        progress.close(done, True)
        return final, digest
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise


def _receive(c: Candidate, fd: int, tmp: Path, timeout: float, limit: int, stream: IO[str],
             box: List[Any]) -> None:
    """Write the bytes of ``c`` to the open file ``fd``; ``box`` gets (count, sha256, progress)."""
    done = 0
    progress: Optional[_Progress] = None
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                src = fetching.Stream(c.url, timeout, limit)
            except fetching.FetchError as e:
                raise Failure(f"{c.url}: {e}", EXIT_VERIFY if e.kind in ("size", "scheme") else EXIT_FETCH
                              ) from None
            h = hashlib.sha256()
            with src:
                if c.size is not None and src.total is not None and src.total != c.size:
                    raise Failure(f"{c.url}: {src.total} bytes announced, the index lists {c.size}",
                                  EXIT_VERIFY)
                progress = _Progress(c.filename, src.total, stream)
                try:
                    for chunk in src.chunks():
                        try:
                            out.write(chunk)
                        except OSError as e:
                            raise _fs_failure(f"{tmp} cannot be written", e) from None
                        h.update(chunk)
                        done += len(chunk)
                        progress.update(done)
                except fetching.FetchError as e:
                    code = EXIT_VERIFY if e.kind == "size" else EXIT_FETCH
                    raise Failure(f"{c.url}: download failed after {done} of {src.total or '?'} bytes: {e}",
                                  code) from None
            out.flush()
            os.fsync(out.fileno())
        box.extend([done, h.hexdigest(), progress, src.total])
    except BaseException:
        if progress is not None:
            progress.close(done, False)
        raise


# ----------------------------------------------------------------------------- checking the wheel

def _requirement_class() -> Any:
    try:
        # optional: packaging is read only where a requirement or version is
        from packaging.requirements import Requirement
    except ImportError:  # pip carries a copy; install needs pip (or uv) anyway
        try:
            from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
        except ImportError:
            raise Failure("checking a wheel's torch requirement needs the 'packaging' library: "
                          "pip install packaging", EXIT_TARGET) from None
    return Requirement


def check_wheel(path: Path, torch_version: str, python: str, platform: Optional[str]) -> str:
    """Raise :class:`Failure` unless ``path`` is this project's wheel of the version its file
    name says, with a torch requirement that ``torch_version`` satisfies on a ``python`` /
    ``platform`` install; else return that requirement (for the report)."""
    try:
        with zipfile.ZipFile(path) as zf:
            wheel_contents.vet(zf, wheel_metadata.dist_info_name(path.name))
        meta = wheel_metadata.wheel_metadata(path)
    except wheel_contents.WheelContentError as e:
        raise Failure(f"{path.name}: {e}: not the layout our build writes, refused", EXIT_VERIFY) from None
    except Exception as e:  # zipfile raises several kinds on a damaged archive
        raise Failure(f"{path.name}: not a readable wheel ({e})", EXIT_VERIFY) from None
    name = re.sub(r"[-_.]+", "-", meta["name"]).lower()
    if name != resolve.PROJECT:
        raise Failure(f"{path.name}: its METADATA names {meta['name']!r}, not {resolve.PROJECT}", EXIT_VERIFY)
    info = variant.parse_wheel_name(path.name)
    in_name = info.version + (f"+{path.name.split('+', 1)[1].split('-', 1)[0]}" if "+" in path.name else "")
    if meta["version"] != in_name:
        raise Failure(f"{path.name}: METADATA Version {meta['version']!r} is not the file name's "
                      f"{in_name!r}", EXIT_VERIFY)
    requirement = _requirement_class()
    env = wheel_metadata.target_environment(python, platform) if platform else None
    pins = []
    for text in meta["requires_dist"]:
        try:
            req = requirement(text)
        except Exception as e:
            raise Failure(f"{path.name}: Requires-Dist {text!r} cannot be read ({e})", EXIT_VERIFY) from None
        if re.sub(r"[-_.]+", "-", req.name).lower() != "torch":
            continue
        if req.marker is not None and (env is None or not req.marker.evaluate(dict(env))):
            continue
        pins.append(req)
    if not pins:
        raise Failure(f"{path.name}: it requires no torch release, so it cannot be checked against "
                      f"torch {torch_version}: not a release wheel", EXIT_VERIFY)
    for req in pins:
        if not req.specifier.contains(torch_version, prereleases=True):
            raise Failure(f"{path.name} requires {req} but the target's torch is {torch_version}: refused "
                          "(the choice and the wheel disagree; report this with `resolve --json`)",
                          EXIT_VERIFY)
    return " and ".join(str(r) for r in pins)


# ----------------------------------------------------------------------------- the target

@dataclass
class Interpreter:
    """The environment ``install`` writes into."""

    executable: str
    facts: Dict[str, Any]

    @property
    def torch(self) -> Optional[Dict[str, Any]]:
        return self.facts.get("torch")


def probe(executable: Optional[str]) -> Interpreter:
    """What ``executable`` (None: the running interpreter) has installed."""
    if executable is None:
        return Interpreter(sys.executable, target_probe.facts())
    # Always asked, never compared by path: a venv's python is a link to its base interpreter.
    if not (os.path.isfile(executable) and os.access(executable, os.X_OK)):
        raise Failure(f"--python-exe {executable}: not an executable file", EXIT_USAGE)
    code = Path(target_probe.__file__).read_text(encoding="utf-8")
    try:
        r = subprocess.run([executable, "-c", code], capture_output=True, text=True, timeout=PROBE_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Failure(f"--python-exe {executable}: cannot be run: {e}", EXIT_TARGET) from None
    try:
        facts = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError, RecursionError):
        err = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise Failure(f"--python-exe {executable}: not a Python that can report its packages ({err})",
                      EXIT_TARGET) from None
    problem = _facts_problem(facts)
    if problem:
        raise Failure(f"--python-exe {executable}: not a Python that can report its packages (its report "
                      f"{problem})", EXIT_TARGET)
    return Interpreter(executable, facts)


_FACT_TYPES = {"python": str, "sys_platform": str, "machine": str, "prefix": str, "pip": bool,
               "purelib": str, "platlib": str, "scripts": str}


def _facts_problem(facts: Any) -> Optional[str]:
    """What is wrong with a target's report (target_probe.facts), or None."""
    if not isinstance(facts, dict):
        return f"is {type(facts).__name__}, not an object"
    for key, kind in _FACT_TYPES.items():
        if not isinstance(facts.get(key), kind):
            return f"has no {kind.__name__} {key!r}"
    if not re.fullmatch(r"\d+\.\d+", facts["python"]):
        return f"gives the Python version {facts['python']!r}"
    for key in ("purelib", "platlib", "scripts"):
        if not isinstance(facts.get(key), str) or not facts[key]:
            return f"has no path {key!r}"
    t = facts.get("torch")
    if t is None:
        return None
    if not isinstance(t, dict):
        return "has a 'torch' that is not an object"
    if "error" in t:
        return None if isinstance(t["error"], str) else "has a torch error that is not text"
    if not isinstance(t.get("version"), str) or not (t.get("cuda") is None or isinstance(t["cuda"], str)) \
            or not (t.get("cxx11_abi") is None or isinstance(t["cxx11_abi"], bool)):
        return "has a torch without a version string, CUDA string or ABI flag"
    return None


def install_target(args: argparse.Namespace, interp: Interpreter) -> Tuple[environment.Target, str]:
    """(the target to resolve for, the installed torch's version): the interpreter's Python and
    torch, with any override given on the command line."""
    t = interp.torch
    if t is None:
        raise Failure(f"torch is not installed in {interp.executable}: install the torch you want first "
                      "(mamba-kernels never installs or changes torch), or use `download` for another "
                      "machine", EXIT_TARGET)
    if "error" in t:
        raise Failure(f"torch in {interp.executable} cannot be imported ({t['error']}): repair torch first",
                      EXIT_TARGET)
    o = resolve.target_overrides(args)
    here = environment.platform_name(sys.platform, platform.machine())
    theirs = environment.platform_name(interp.facts["sys_platform"], interp.facts["machine"])
    if o["platform_tag"] is None and theirs != here:
        o["platform_tag"] = theirs or f"{interp.facts['sys_platform']}_{interp.facts['machine']}"
    o["python"] = o["python"] or interp.facts["python"]
    if o["torch"] is None:
        o["torch"] = t["version"]
        o["cuda"] = o["cuda"] or (t["cuda"] or "none")
        if o["cxx11_abi"] is None:
            o["cxx11_abi"] = t["cxx11_abi"]
    target = environment.detect(toolchain=False, **o)
    return target, t["version"]


# ----------------------------------------------------------------------------- choosing and fetching

@dataclass
class Obtained:
    path: Optional[Path]  # None on a dry run
    sha256: Optional[str]
    resolution: Resolution
    source: str


def _say(text: str) -> None:
    print(text, flush=True)


def warn(verb: str, text: str) -> None:
    print(f"mamba-kernels {verb}: {text}", file=sys.stderr, flush=True)


def _describe_choice(res: Resolution, source: str) -> None:
    assert res.selected is not None
    _say(f"chosen  {res.selected.candidate.filename}")
    _say(f"  from    {source}")
    for line in resolve.chosen_lines(res):
        _say(f"  {line}")
    if res.rejected:
        _say(f"  ({len(res.rejected)} other candidate(s) not chosen; `resolve --json` lists each with its "
             "reasons)")


def _report_no_match(target: environment.Target, rejected: List[resolve.Verdict]) -> None:
    _say(f"no wheel fits: {resolve.no_match_line(target, len(rejected))}")
    for line in resolve.no_match_lines(rejected, False, "`resolve --all` lists every one"):
        _say(line)


def obtain(verb: str, sources: Sequence[str], target: environment.Target, dest: Optional[Path],
           timeout: float, pin_torch: str, allow_unhashed: bool = False, pip: str = "pip install",
           origin: Optional[str] = None) -> Obtained:
    """Try each index in order: read it, choose, fetch into ``dest`` (None: a dry run, nothing is
    fetched) and check the wheel against ``pin_torch``. The first index that delivers a verified
    wheel wins; each failure is one line on stderr. Raises :class:`Failure` when none does (the
    last failure, already shown). ``pip``: how the source-build hint runs pip; ``origin``: where
    the sources come from (resolve.read_source)."""
    last: Optional[Failure] = None
    rejected: Dict[str, resolve.Verdict] = {}
    read_any = False
    for i, source in enumerate(sources):
        more = "; trying the next index" if i + 1 < len(sources) else ""
        try:
            candidates = resolve.read_source(source, timeout, origin)
        except SourceError as e:
            last = _shown(verb, Failure(str(e), EXIT_FETCH), more)
            continue
        read_any = True
        res = resolve.resolve(candidates, target)
        if res.selected is None:
            for v in res.rejected:
                rejected.setdefault(v.candidate.filename, v)
            if more:
                warn(verb, f"--index {source}: no wheel fits{more}")
            continue
        _describe_choice(res, source)
        c = res.selected.candidate
        if dest is None:
            if c.sha256 is None and (c.remote or fetching.is_url(c.url)) and not allow_unhashed:
                refused = Failure(f"{c.filename}: the index {source} lists no sha256 for it: it would be "
                                  "refused (--allow-unhashed accepts it)", EXIT_VERIFY)
                last = _shown(verb, refused, more)
                continue
            return Obtained(None, c.sha256, res, source)
        try:
            path, digest = fetch(c, dest, timeout, allow_unhashed=allow_unhashed)
            if c.sha256 is None:
                why = "--allow-unhashed: the index lists none" if c.remote else "the local index lists none"
                _say(f"  sha256  {digest} (computed: {why})")
            else:
                _say("  sha256 verified")
            try:
                pin = check_wheel(path, pin_torch, target.python, res.selected.info.platform
                                  if res.selected.info else None)
            except Failure:
                path.unlink(missing_ok=True)
                raise
            _say(f"  checked {pin} holds for torch {pin_torch}; contents are our layout")
            return Obtained(path, digest, res, source)
        except Failure as e:
            if e.code == EXIT_FS:  # the destination, not the index: the next index would fail too
                raise
            last = _shown(verb, e, more)
    if not read_any:
        if len(sources) > 1:
            raise Failure(f"no index could be read ({len(sources)} tried)", EXIT_FETCH)
        assert last is not None
        raise last
    if last is None:
        _report_no_match(target, list(rejected.values()))
        raise Failure(f"no wheel fits; {resolve.source_build_hint(pip)}; or use the pure-PyTorch path",
                      EXIT_NO_MATCH)
    raise last


def _shown(verb: str, failure: Failure, more: str) -> Failure:
    """``failure``, printed now (with ``more``) and marked so that it is not printed again."""
    warn(verb, failure.line + more)
    failure.shown = True
    return failure


# ----------------------------------------------------------------------------- installing

def installer_command(interp: Interpreter, wheel: Path) -> List[str]:
    """pip of the target, or uv aimed at it when it has no pip; never resolving dependencies."""
    if interp.facts.get("pip"):
        return [interp.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall",
                "--disable-pip-version-check", "--no-input", str(wheel)]
    uv = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if uv is None:
        raise Failure(f"{interp.executable} has no pip and uv is not on PATH: install either one "
                      f"({interp.executable} -m ensurepip)", EXIT_TARGET)
    return [uv, "pip", "install", "--python", interp.executable, "--no-deps", "--no-index",
            "--reinstall-package", resolve.PROJECT, str(wheel)]


def _pip_install(interp: Interpreter) -> str:
    """The start of an install command into the target, for the hints (pip, else uv)."""
    exe = shlex.quote(interp.executable)
    return f"{exe} -m pip install" if interp.facts.get("pip") else f"uv pip install --python {exe}"


def _try_lock(fd: int) -> bool:
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        elif msvcrt is not None:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # type: ignore[attr-defined]
        return True
    except OSError:  # held by another process (BlockingIOError, or EACCES / EDEADLK on Windows)
        return False


@contextlib.contextmanager
def environment_lock(site: str, prefix: str) -> Iterator[int]:
    """One install at a time into an environment: a lock on ``site/.mamba-kernels-install.lock``
    (flock on POSIX, msvcrt.locking on Windows), waited for up to :data:`LOCK_WAIT` s with a
    line saying so. Yields the lock file's descriptor (the installer inherits it, so that an
    installer left running by a killed command still holds the lock). A site folder that cannot
    be written is a Failure (exit 7) before anything is changed."""
    path = Path(site) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise _fs_failure(f"{site} cannot be written (the install's lock file); nothing was changed", e
                          ) from None
    try:
        if not _try_lock(fd):
            _say(f"waiting for another install into {prefix} to finish (the lock {path}; at most "
                 f"{LOCK_WAIT:.0f} s)")
            deadline = time.monotonic() + LOCK_WAIT
            while not _try_lock(fd):
                if time.monotonic() > deadline:
                    raise Failure(f"another install into {prefix} still holds {path} after "
                                  f"{LOCK_WAIT:.0f} s; nothing was changed (try again when it has finished)",
                                  EXIT_TARGET)
                time.sleep(0.2)
        yield fd
    finally:
        os.close(fd)


def _child_ignores_ctrl_c() -> None:
    """In the installer's process, before it starts: Ctrl-C ignored. A terminal's Ctrl-C goes to
    the whole process group, and pip hit by it during its own start-up ends in a traceback of its
    imports; ignored there, it reaches us alone, and we stop pip (SIGTERM) and put the
    environment back."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_installer(cmd: List[str], keep_fd: Optional[int] = None, temp: Optional[Path] = None) -> int:
    """Run the installer in our own process group: a kill of the group (a job control or
    service manager's kill) reaches it too, so it never goes on alone; a Ctrl-C reaches us only
    (``_child_ignores_ctrl_c``). It inherits ``keep_fd`` (the environment lock). Its temporary
    directory is ``temp`` (inside our download folder), so what a killed installer leaves there
    goes with that folder when the next run tidies it. On an interrupt, stop it and wait for it,
    then let the interrupt go on."""
    env = None
    if temp is not None:
        temp.mkdir(exist_ok=True)
        env = dict(os.environ, TMPDIR=str(temp), TEMP=str(temp), TMP=str(temp))
    if os.name == "posix":
        p = subprocess.Popen(cmd, pass_fds=(keep_fd,) if keep_fd is not None else (), env=env,
                             preexec_fn=_child_ignores_ctrl_c)
    else:
        p = subprocess.Popen(cmd, env=env)
    try:
        return p.wait()
    except BaseException:
        with _signals_held():
            try:
                p.terminate()
            except OSError:
                pass
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        raise


def _hold_signals() -> Dict[int, Any]:
    """Ctrl-C and SIGTERM ignored from now; returns what _release_signals puts back (nothing
    off the main thread, where Python delivers no signals)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    sigs = [signal.SIGINT] + ([signal.SIGTERM] if hasattr(signal, "SIGTERM") else [])
    return {s: signal.signal(s, signal.SIG_IGN) for s in sigs}


def _release_signals(old: Dict[int, Any]) -> None:
    for s, h in old.items():
        signal.signal(s, h)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM ignored for the duration (the undo must not be cut short)."""
    old = _hold_signals()
    try:
        yield
    finally:
        _release_signals(old)


def _undo(snap: site_snapshot.Snapshot) -> None:
    """Put the environment back; a path that cannot be put back (a read-only folder, a full
    disk) is one Failure line, exit 7, and the copy is kept for a hand to put back."""
    with _signals_held():
        _say("putting the environment back as it was before the installer ran")
        try:
            snap.restore()
        except OSError as e:
            snap.keep = True
            raise Failure(f"the environment could not be put back as it was: {e.strerror or e}"
                          + (f" ({e.filename})" if e.filename else "")
                          + f"; the copy of what was there is kept in {snap.backup}", EXIT_FS) from None


def _sources(args: argparse.Namespace) -> Tuple[Tuple[str, ...], str]:
    if args.index:
        return tuple(args.index), "--index"
    return release_index.default_indexes()


TEMP_PREFIX = "mamba-kernels-install-"  # the download folder of one install, in the temp directory
OWNER_FILE = "owner.pid"  # in it: the process that made it
INSTALLER_TEMP = "installer-temp"  # in it: pip's (or uv's) temporary directory


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # alive, owned by someone else
        return True
    return True


def tidy_temp(base: Optional[str] = None) -> List[str]:
    """Download folders of installs killed part way (their process is gone): removed, a line each.
    POSIX only: on Windows a signal-0 probe is not a liveness test, and the folder's open files
    could not be removed anyway while their process lived."""
    if os.name != "posix":
        return []
    done = []
    for d in sorted(Path(base or tempfile.gettempdir()).glob(TEMP_PREFIX + "*")):
        try:
            if not d.is_dir() or d.is_symlink() or d.stat().st_uid != os.getuid():
                continue
            pid = int((d / OWNER_FILE).read_text().strip())
        except (OSError, ValueError):
            continue  # not one of ours (or still being made): leave it
        if not _pid_alive(pid):
            shutil.rmtree(d, ignore_errors=True)
            done.append(f"removed {d}, the download folder of an install that was stopped")
    return done


def run_install(args: argparse.Namespace) -> int:
    for line in tidy_temp():
        _say(line)
    sources, origin = _sources(args)
    interp = probe(args.python_exe)
    target, installed_torch = install_target(args, interp)
    _say(f"target  {interp.executable}: {resolve.describe_target(target)}")
    _say(f"index   {' '.join(sources)} ({origin})")
    held: Dict[int, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix=TEMP_PREFIX) as tmp:
            (Path(tmp) / OWNER_FILE).write_text(str(os.getpid()))  # what tidy_temp reads
            got = obtain("install", sources, target, None if args.dry_run else Path(tmp), args.timeout,
                         installed_torch, args.allow_unhashed, _pip_install(interp), origin)
            assert got.resolution.selected is not None
            name = got.resolution.selected.candidate.filename
            cmd = installer_command(interp, got.path or Path(name))
            if args.dry_run:
                _say(f"dry run: would download and verify {name}, then run:")
                _say("  " + shlex.join(cmd))
                return EXIT_OK
            f = interp.facts
            with contextlib.ExitStack() as locked:
                lock_fd = locked.enter_context(environment_lock(f["purelib"], f["prefix"]))
                _say("running " + shlex.join(cmd))
                held = _install_locked(got, name, cmd, f, lock_fd)
        _say(f"installed {name} into {interp.facts.get('prefix', interp.executable)}; torch "
             f"{installed_torch} untouched (--no-deps)")
        return EXIT_OK
    finally:
        _release_signals(held)


def _install_locked(got: Obtained, name: str, cmd: List[str], f: Dict[str, Any], lock_fd: int
                    ) -> Dict[int, Any]:
    """The pip (or uv) step, all or nothing, under the environment lock. Returns the signal
    handlers to put back: once the outcome is decided, an interrupt is ignored, so that no "as it
    was before" is reported over a finished install (one that lands before is undone, and so is
    as reported)."""
    assert got.path is not None
    sites = [f["purelib"], f["platlib"]]
    work = Path(f["purelib"]) / site_snapshot.WORK
    try:
        with _signals_held():
            for line in site_snapshot.tidy(work, sites):
                _say(line)
    except OSError as e:
        raise _fs_failure(f"what an earlier install left in {work} could not be tidied", e) from None
    try:
        snap = site_snapshot.take(got.path, wheel_metadata.dist_info_name(name), sites, f["scripts"],
                                  f["prefix"], work=work)
    except OSError as e:
        raise _fs_failure("the copy of what the install may change could not be made; nothing was changed",
                          e) from None
    try:
        try:
            rc = _run_installer(cmd, lock_fd, got.path.parent / INSTALLER_TEMP)
            held = _hold_signals()
            if rc == 0:
                snap.mark_done()
        except BaseException:
            _undo(snap)
            raise
        if rc != 0:
            _release_signals(held)
            _undo(snap)
            raise Failure(f"the installer exited with status {rc}; the environment was put back as it was "
                          "before", EXIT_TARGET)
        return held
    finally:
        snap.discard()
        with contextlib.suppress(OSError):
            work.rmdir()  # when empty


def run_download(args: argparse.Namespace) -> int:
    if not args.dest.strip():
        raise Failure("--dest must name a folder, got ''", EXIT_USAGE)
    dest = Path(args.dest)
    sources, origin = _sources(args)
    target = environment.detect(toolchain=False, **resolve.target_overrides(args))
    if target.torch is None:
        raise Failure("no torch to match: give --torch (and --cuda) for the machine the wheel is for",
                      EXIT_USAGE)
    _say(f"target  {resolve.describe_target(target)}")
    _say(f"index   {' '.join(sources)} ({origin})")
    for p in (dest, *dest.parents):
        if p.exists():
            if not p.is_dir():
                raise Failure(f"--dest {dest}: {p} exists and is not a folder", EXIT_USAGE)
            if not os.access(p, os.W_OK | os.X_OK):  # the folder, or the one it is to be made in
                raise Failure(f"--dest {dest}: {p} is not writable", EXIT_FS)
            break
    got = obtain("download", sources, target, None if args.dry_run else dest, args.timeout, target.torch,
                 args.allow_unhashed, origin=origin)
    assert got.resolution.selected is not None
    name = got.resolution.selected.candidate.filename
    if args.dry_run:
        _say(f"dry run: would write {dest / name}")
        return EXIT_OK
    _say(f"wrote {got.path}")
    version = name.split("-")[1]
    _say("to install it on the machine it is for, copy that folder there (as DIR) and run, with the "
         "Python whose torch it was chosen for:")
    _say(f"  python -m pip install --no-deps --no-index --find-links DIR 'mamba-kernels=={version}'")
    return EXIT_OK
