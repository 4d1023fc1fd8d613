"""What every platform's cell builder shares: the error type, logging and running commands,
pip's install command and the one download function (both retrying on network failures), the
CIBW_ENVIRONMENT quoting, and the interface each platform module implements."""

from __future__ import annotations

import email.utils
import hashlib
import http.client
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from mamba_kernels.facts import support


class CellError(RuntimeError):
    """A step of the cell failed; the message says which and why."""


def log(msg: str) -> None:
    print(f"[build_cell] {msg}", file=sys.stderr, flush=True)


def sh(cmd: List[str], env: Optional[Dict[str, str]] = None, cwd: Optional[Path] = None) -> None:
    log("$ " + " ".join(cmd))
    r = subprocess.run(cmd, env=env, cwd=cwd)
    if r.returncode != 0:
        raise CellError(f"command failed with exit status {r.returncode}: {' '.join(cmd)}")


# pip's own retries, for every install a cell driver runs (torch with its CUDA wheels is several
# GB from download.pytorch.org): attempts per connection and seconds without data before one
# counts as failed. The command line carries them (pip_install); the cibuildwheel environment
# carries them as PIP_RETRIES / PIP_TIMEOUT for the installs cibuildwheel runs itself.
PIP_RETRIES = 10
PIP_TIMEOUT_S = 60


def pip_install(python: str) -> List[str]:
    """The start of every ``pip install`` a cell driver runs, with pip's retries and timeout."""
    return [python, "-m", "pip", "install", "--retries", str(PIP_RETRIES), "--timeout", str(PIP_TIMEOUT_S)]


# download(): attempts in all, the first wait (doubled after each failed attempt), the longest
# wait (a server's Retry-After included), and seconds without data before an attempt fails.
DOWNLOAD_ATTEMPTS = 5
DOWNLOAD_BACKOFF_S = 2.0
DOWNLOAD_MAX_WAIT_S = 120.0
DOWNLOAD_TIMEOUT_S = 60.0


class _Transient(Exception):
    """A failed attempt worth repeating: connection error, timeout, HTTP 5xx or 429."""

    def __init__(self, cause: str, retry_after: Optional[float] = None) -> None:
        super().__init__(cause)
        self.cause = cause
        self.retry_after = retry_after


class _Permanent(Exception):
    """A failed attempt a repeat cannot cure (HTTP 404, a file that cannot be written)."""


def _one_line(text: str) -> str:
    return " ".join(str(text).split()) or "no reason given"


def _retry_after(value: Optional[str]) -> Optional[float]:
    """Seconds a Retry-After header asks for (delta-seconds or an HTTP date), None without one."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())


def _fetch(url: str, part: Path, timeout: float) -> None:
    """One attempt: ``url`` into ``part``. _Transient for what a retry may cure, _Permanent else."""
    try:
        out = open(part, "wb")
    except OSError as e:
        raise _Permanent(f"cannot write {part}: {_one_line(e)}") from None
    with out:
        try:
            req = urllib.request.Request(url, headers={"User-Agent": "mamba-kernels-ci"})
            with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 (fixed https URLs)
                length = r.headers.get("Content-Length")
                got = 0
                while True:
                    chunk = r.read(1 << 20)
                    if not chunk:
                        break
                    out.write(chunk)
                    got += len(chunk)
        except urllib.error.HTTPError as e:
            cause = _one_line(f"HTTP {e.code} {e.reason}")
            if e.code == 429 or 500 <= e.code < 600:
                after = _retry_after(e.headers.get("Retry-After")) if e.headers else None
                raise _Transient(cause, after) from None
            raise _Permanent(cause) from None
        except urllib.error.URLError as e:  # DNS, refused, TLS: urlopen wraps them
            raise _Transient(_one_line(getattr(e, "reason", e))) from None
        except (http.client.HTTPException, OSError) as e:  # reset, closed early, timed out
            raise _Transient(_one_line(f"{type(e).__name__}: {e}")) from None
    if length is not None and length.isdigit() and got != int(length):
        raise _Transient(f"connection closed after {got} of {length} bytes")


def download(
    url: str,
    dest: Path,
    sha256: Optional[str] = None,
    attempts: Optional[int] = None,
    backoff: Optional[float] = None,
    max_wait: Optional[float] = None,
    timeout: Optional[float] = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Path:
    """Download ``url`` to ``dest`` and return ``dest``: the one way a cell driver downloads a file.

    Connection errors, timeouts, a body shorter than its Content-Length, HTTP 5xx and 429 are
    retried, up to ``attempts`` in all, waiting ``backoff`` seconds and twice as long after each
    further failure (a Retry-After header instead, when the server sends one), at most
    ``max_wait``; each retry is one log line. Other HTTP errors (404) are not retried. The file is
    written to ``dest.part`` and renamed to ``dest`` only when complete and, with ``sha256``, only
    when its digest is that (a mismatch is not retried: a pinned file that changed stays changed).
    A failure is one CellError line naming the URL, the last cause and the attempts; it leaves no
    ``.part`` and nothing under ``dest``. Defaults: the DOWNLOAD_* constants."""
    attempts = DOWNLOAD_ATTEMPTS if attempts is None else attempts
    backoff = DOWNLOAD_BACKOFF_S if backoff is None else backoff
    max_wait = DOWNLOAD_MAX_WAIT_S if max_wait is None else max_wait
    timeout = DOWNLOAD_TIMEOUT_S if timeout is None else timeout
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    cause = ""
    try:
        for attempt in range(1, attempts + 1):
            try:
                _fetch(url, part, timeout)
            except _Permanent as e:
                raise CellError(f"download {url} failed: {e} (attempt {attempt} of {attempts}; "
                                "not retried)") from None
            except _Transient as e:
                cause = e.cause
                if attempt == attempts:
                    break
                wait = backoff * 2 ** (attempt - 1) if e.retry_after is None else e.retry_after
                wait = min(max_wait, max(0.0, wait))
                log(f"download {url}: {cause}; attempt {attempt} of {attempts} failed, "
                    f"retrying in {wait:.1f} s")
                sleep(wait)
                continue
            if sha256 is not None:
                h = hashlib.sha256()
                with open(part, "rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        h.update(block)
                if h.hexdigest() != sha256.lower():
                    raise CellError(f"download {url}: sha256 {h.hexdigest()} is not the expected {sha256} "
                                    f"(attempt {attempt} of {attempts}; not retried)")
            os.replace(part, dest)
            return dest
    finally:
        if part.exists():
            part.unlink()
    raise CellError(f"download {url} failed after {attempts} attempts: {cause}")


def _bash_double_quoted(value: str) -> str:
    """``value`` inside bash double quotes, read back literally: cibuildwheel evaluates
    CIBW_ENVIRONMENT as bash does, where a lone backslash before most characters is dropped
    (``"C:\\Program Files"`` would arrive as ``C:Program Files``)."""
    for ch in ("\\", '"', "$", "`"):
        value = value.replace(ch, "\\" + ch)
    return value


def environment_string(values: Dict[str, str], path_prefix: Optional[str] = None, path_sep: str = ":") -> str:
    """A CIBW_ENVIRONMENT value that cibuildwheel's parser turns into exactly ``values``, plus
    ``PATH=<path_prefix><path_sep>$PATH`` when ``path_prefix`` is given."""
    items = [f'{k}="{_bash_double_quoted(v)}"' for k, v in values.items()]
    if path_prefix is not None:
        items.append(f'PATH="{_bash_double_quoted(path_prefix + path_sep)}$PATH"')
    return " ".join(items)


class Platform:
    """One platform's cell builder (like cibuildwheel's platforms/linux.py, windows.py): where
    the toolkit lives and how it is provisioned, the cibuildwheel environment's platform part,
    the repair command, and what the build and test environments need beyond the shared steps.
    ci/build_cell.py holds the shared steps (torch, verify, the CLI) and ci/preflight.py the
    checks; both pick one of these with ``platforms.for_cell``."""

    #: cibuildwheel's name of the platform ("linux", "windows").
    name: str = ""
    #: The wheel platform tags (support.PLATFORMS) this builder serves.
    tags: Tuple[str, ...] = ()
    #: The family of the host compiler nvcc drives ("gcc", "msvc"): torch's nvcc flags and the
    #: compiler rules ci/preflight.py applies follow from it.
    host_compiler: str = ""
    #: Whether cibuildwheel builds in a container (an image on the runner's disk, the project
    #: copied into it, the compiler cache mounted into it).
    in_container: bool = False
    #: The separator of PATH's entries.
    path_sep: str = ""

    def handles(self, cell: support.Cell) -> bool:
        return cell.platform in self.tags

    def toolkit_home(self, cell: support.Cell) -> str:
        """CUDA_HOME of the cell's toolkit in CI (what provision_toolkit creates)."""
        raise NotImplementedError

    def provision_toolkit(self, cell: support.Cell, python: str) -> None:
        """Install the cell's CUDA toolkit at toolkit_home (``python``: the build environment's)."""
        raise NotImplementedError

    def compiler_env(self, cell: support.Cell) -> Dict[str, str]:
        """Environment that makes the cell's nvcc accept the build's host compiler ({} if none)."""
        raise NotImplementedError

    def cibuildwheel_env(
        self, cell: support.Cell, extra: Dict[str, str], compiler: Dict[str, str], host_cache: str
    ) -> Dict[str, str]:
        """The platform's CIBW_* entries: CIBW_ENVIRONMENT_<OS> from the shared ``extra`` values
        and the ``compiler`` environment, plus image and container settings. ``host_cache``:
        the host folder of the compiler cache."""
        raise NotImplementedError

    def build_tools(self) -> List[str]:
        """pip requirements the build environment needs beyond the shared build tools."""
        raise NotImplementedError

    def torch_dir(self) -> Path:
        """Default folder of the cell's torch, shared by the build and the test environment."""
        raise NotImplementedError

    def repair_command(
        self, cell: support.Cell, wheel: Path, dest: Path, torch_lib: Optional[str], plat: Optional[str]
    ) -> Tuple[List[str], Optional[Dict[str, str]]]:
        """The repair tool's command line (and environment, None: inherited) writing the repaired
        ``wheel`` into ``dest`` with torch's and CUDA's libraries left out."""
        raise NotImplementedError

    def runner_env(self, cell: Optional[support.Cell] = None) -> Dict[str, str]:
        """Environment cibuildwheel itself needs on this machine to build ``cell`` (e.g. the MSVC
        prompt of the cell's toolset)."""
        raise NotImplementedError

    def builds_locally(self, cell: support.Cell) -> bool:
        """Whether ``python -m ci.build_cell local`` can build the cell on this machine."""
        raise NotImplementedError

    def runs_here(self) -> bool:
        """Whether this process runs on this platform."""
        raise NotImplementedError

    def why_not_built_here(self, cell: support.Cell) -> Optional[str]:
        """Why this machine, reaching only PyPI, cannot build the cell with ``python -m
        ci.build_cell local --toolkit pypi --torch-index pypi`` (None: it can; python -m
        ci.rehearse lists the reason of every cell it does not build)."""
        raise NotImplementedError

    def executable_names(self, tool: str) -> List[str]:
        """The file names ``tool`` may have in a bin/ folder, preferred first."""
        raise NotImplementedError

    def bin_dir(self, home: str) -> str:
        """The bin/ folder of the toolkit at ``home``, written as this platform writes paths."""
        raise NotImplementedError

    def intended_environment(self, cell: support.Cell, home: str) -> Dict[str, str]:
        """What the cell's build environment must hold beyond the shared values and PATH, stated
        on its own (not read from cibuildwheel_env) so that ci/preflight.py can check that."""
        raise NotImplementedError

    def container_arch(self, cell: support.Cell) -> Optional[str]:
        """cibuildwheel's architecture name of the cell's manylinux image; None without a container."""
        raise NotImplementedError

    def wheel_platforms(self, tag: str, glibc: Optional[Tuple[int, int]]) -> List[str]:
        """The wheel platform tags pip accepts on ``tag`` (with glibc ``glibc`` on Linux), best first."""
        raise NotImplementedError

    def pypi_torch_is_cuda(self, cell: support.Cell) -> bool:
        """Whether PyPI's torch wheel for the cell's platform is a CUDA build (the release's default
        variant's)."""
        raise NotImplementedError

    def pypi_file_tag(self, filename: str) -> Optional[str]:
        """Which of this platform's tags a PyPI file of torch is for, or None."""
        raise NotImplementedError


#: The methods every platform implements (tests check both platforms define each).
INTERFACE = tuple(
    n for n, v in vars(Platform).items() if callable(v) and not n.startswith("_") and n != "handles"
)
