"""The command samples in README.md and docs/*.md, run for real: checked (default) or rewritten.

A sample is a ```text block right after a marker line

    <!-- sample: SETUP [varies: KEY KEY ...] -->

whose lines starting with ``$ `` are commands and whose other lines are what they print (stdout
and stderr together, as a terminal shows them). ``$ echo $?`` prints the previous command's exit
status. SETUP says where the commands run:

- ``names-only``: a temporary folder holding ``names-only/``, one empty file named for each wheel
  ``python -m mamba_kernels matrix --wheels`` lists (what README's resolve examples read);
- ``this-env``: a temporary folder, with this interpreter's environment (for the doctor: what
  ``scripts/setup.sh`` makes on a machine without a GPU).

``python`` in a command is this interpreter. ``MAMBA_KERNELS_*`` variables are unset. The
checkout's own path prints as ``~/mamba-kernels``, the temporary folder as ``~/work``. Lines
whose first word is a ``varies`` key (``python``, ``nvcc``, ...) are facts of the machine: they
are compared by that word only.

    python scripts/samples.py            # check: exit 1 and a diff when a sample differs
    python scripts/samples.py --write    # rewrite each sample with what its commands print now
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- sample: (?P<setup>[\w-]+)(?: varies: (?P<varies>[\w -]+?))? -->$")
SETUPS = ("names-only", "this-env")
HOME_SHOWN = "~/mamba-kernels"
CWD_SHOWN = "~/work"
TIMEOUT = 300


@dataclass
class Sample:
    path: Path
    start: int  # index of the first line inside the fence
    end: int  # index of the closing fence
    setup: str
    varies: frozenset
    lines: List[str]

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.start}"


def documents(root: Path = ROOT) -> List[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def find_samples(path: Path) -> List[Sample]:
    """Every marked sample of ``path``; a marker with no ```text block after it is an error."""
    text = path.read_text(encoding="utf-8").splitlines()
    found = []
    for i, line in enumerate(text):
        m = MARKER.match(line.strip())
        if not m:
            continue
        if m["setup"] not in SETUPS:
            raise SystemExit(
                f"{path}:{i + 1}: unknown sample setup {m['setup']!r} (one of {', '.join(SETUPS)})"
            )
        if i + 1 >= len(text) or text[i + 1].strip() != "```text":
            raise SystemExit(f"{path}:{i + 1}: a sample marker must be followed by a ```text block")
        end = next((j for j in range(i + 2, len(text)) if text[j].strip() == "```"), None)
        if end is None:
            raise SystemExit(f"{path}:{i + 2}: the sample's ```text block is not closed")
        varies = frozenset((m["varies"] or "").split())
        found.append(Sample(path, i + 2, end, m["setup"], varies, text[i + 2 : end]))
    return found


def unmarked_commands(path: Path) -> List[str]:
    """``$ python -m mamba_kernels`` lines of ``path`` outside any marked sample: each must be in one."""
    inside = set()
    for s in find_samples(path):
        inside.update(range(s.start, s.end))
    return [
        f"{path.relative_to(ROOT)}:{i + 1}: {line.strip()}"
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines())
        if line.strip().startswith("$ python -m mamba_kernels") and i not in inside
    ]


def _env() -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAMBA_KERNELS_")}
    env["PYTHONUNBUFFERED"] = "1"  # stdout and stderr interleave as on a terminal
    env["COLUMNS"] = "100"
    return env


def _prepare(setup: str, folder: Path) -> None:
    if setup == "names-only":
        names = subprocess.run(
            [sys.executable, "-m", "mamba_kernels", "matrix", "--wheels"],
            cwd=folder,
            env=_env(),
            capture_output=True,
            text=True,
            check=True,
            timeout=TIMEOUT,
        )
        (folder / "names-only").mkdir()
        for name in names.stdout.split():
            (folder / "names-only" / name).touch()


def run_sample(sample: Sample) -> List[str]:
    """The sample's commands run in its setup: the lines a terminal would show."""
    out: List[str] = []
    status = 0
    with tempfile.TemporaryDirectory(prefix="mk-sample-") as tmp:
        folder = Path(tmp)
        _prepare(sample.setup, folder)
        for line in sample.lines:
            if not line.startswith("$ "):
                continue
            out.append(line)
            command = line[2:].strip()
            if command == "echo $?":
                out.append(str(status))
                continue
            argv = shlex.split(command)
            if argv[:3] != ["python", "-m", "mamba_kernels"]:
                raise SystemExit(
                    f"{sample.where}: a sample runs `python -m mamba_kernels ...` only: {command}"
                )
            r = subprocess.run(
                [sys.executable, *argv[1:]],
                cwd=folder,
                env=_env(),
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=TIMEOUT,
            )
            status = r.returncode
            out += [
                ln.rstrip().replace(str(ROOT), HOME_SHOWN).replace(str(folder), CWD_SHOWN)
                for ln in r.stdout.splitlines()
            ]
    return out


def _key(line: str) -> str:
    return line.split(maxsplit=1)[0] if line.strip() else ""


def differences(sample: Sample, real: Sequence[str]) -> Optional[str]:
    """None when the sample shows ``real`` (``varies`` lines by their first word), else a diff."""

    def norm(lines: Sequence[str]) -> List[str]:
        return [_key(ln) + " ..." if _key(ln) in sample.varies else ln for ln in lines]

    if norm(sample.lines) == norm(real):
        return None
    diff = difflib.unified_diff(sample.lines, list(real), "as written", "as run", lineterm="", n=1)
    return f"{sample.where} ({sample.setup}):\n" + "\n".join(diff)


def write(sample: Sample, real: Sequence[str]) -> None:
    text = sample.path.read_text(encoding="utf-8").splitlines()
    keep = {_key(ln): ln for ln in sample.lines if _key(ln) in sample.varies}
    real = [keep.get(_key(ln), ln) if _key(ln) in sample.varies else ln for ln in real]
    text[sample.start : sample.end] = real
    sample.path.write_text("\n".join(text) + "\n", encoding="utf-8")


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--write", action="store_true", help="rewrite each sample with its commands' real output")
    args = p.parse_args(argv)
    problems = [u for d in documents() for u in unmarked_commands(d)]
    for u in problems:
        print(f"not in a marked sample: {u}", file=sys.stderr)
    # last sample first, so rewriting one leaves the line numbers of the others in place
    for sample in sorted(
        (s for d in documents() for s in find_samples(d)), key=lambda s: (str(s.path), -s.start)
    ):
        real = run_sample(sample)
        diff = differences(sample, real)
        if diff is None:
            print(f"ok     {sample.where}")
        elif args.write:
            write(sample, real)
            print(f"wrote  {sample.where}")
        else:
            problems.append(diff)
            print(diff, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
