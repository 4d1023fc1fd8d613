"""The bad-input probe of every command-line verb, as a table (issue 42, item 4: the command
line's half; the public functions' half is tests/test_probe_functions.py).

Each row is (verb, case, argv, environment, expected exit status, regex on the first line of
stderr). Every row runs ``main(argv)`` in this process (what ``python -m mamba_kernels`` runs),
so an exception that escapes a verb fails the row instead of printing a traceback; the row
then checks the documented exit status (docs/INSTALL.md, "Exit status"), that stderr holds no
traceback, and that its first line names the argument, the rule and the value seen. Indexes
are folders made in the test (no network); installs find no wheel there, so nothing is
installed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, Tuple

import pytest

from mamba_kernels.cli.main import main


@dataclass(frozen=True)
class Row:
    verb: str
    case: str
    argv: Tuple[str, ...]  # {tmp} is the test's temporary folder, {empty} an empty folder in it
    status: int
    stderr: str  # a regex the first line of stderr must match (of stdout where `on_stdout`)
    env: Dict[str, str] = field(default_factory=dict)
    on_stdout: bool = False  # resolve's "no wheel fits" is its answer, on stdout


ROWS = (
    # info / doctor: arguments and knobs
    Row("info", "unknown option", ("info", "--bogus"), 2, r"unrecognized arguments: --bogus"),
    Row("info", "extra positional", ("info", "extra"), 2, r"unrecognized arguments: extra"),
    Row(
        "info",
        "unknown backend knob",
        ("info",),
        2,
        r"MAMBA_KERNELS_BACKEND='bogus' is not a backend",
        {"MAMBA_KERNELS_BACKEND": "bogus"},
    ),
    Row(
        "doctor",
        "unknown option",
        ("doctor", "--fix-everything"),
        2,
        r"unrecognized arguments: --fix-everything",
    ),
    Row(
        "doctor",
        "unknown scan-states knob",
        ("doctor",),
        2,
        r"MAMBA_KERNELS_SCAN_STATES.*'sometimes'",
        {"MAMBA_KERNELS_SCAN_STATES": "sometimes"},
    ),
    # resolve: the target described by hand
    Row(
        "resolve",
        "torch not a version",
        ("resolve", "--torch", "notaversion", "--index", "{empty}"),
        2,
        r"--torch must look like 'M\.m' or 'M\.m\.p', got 'notaversion'",
    ),
    Row(
        "resolve",
        "cuda not a version",
        ("resolve", "--cuda", "abc", "--index", "{empty}"),
        2,
        r"cuda must look like '12\.6', got 'abc'",
    ),
    Row(
        "resolve",
        "python not a version",
        ("resolve", "--python", "three", "--index", "{empty}"),
        2,
        r"--python must look like 'M\.m' or 'M\.m\.p', got 'three'",
    ),
    Row(
        "resolve",
        "unknown platform",
        ("resolve", "--platform", "nowhere", "--index", "{empty}"),
        2,
        r"--platform must be one of .* got 'nowhere'",
    ),
    Row(
        "resolve",
        "empty index",
        ("resolve", "--index", ""),
        2,
        r"argument --index: must be a path or a URL, got ''",
    ),
    Row(
        "resolve",
        "missing index folder",
        ("resolve", "--index", "{tmp}/nothing-here"),
        2,
        r"--index .*nothing-here: no such file or directory",
    ),
    Row(
        "resolve",
        "missing index from the environment",
        ("resolve",),
        2,
        r"MAMBA_KERNELS_INDEX.*nothing-here: no such file or directory",
        {"MAMBA_KERNELS_INDEX": "{tmp}/nothing-here"},
    ),
    Row(
        "resolve",
        "index with no wheel",
        ("resolve", "--index", "{empty}"),
        3,
        r"no wheel fits: no wheel of .* index",
        on_stdout=True,
    ),
    Row(
        "resolve",
        "refused index",
        ("resolve", "--index", "http://127.0.0.1:9/", "--timeout", "1"),
        2,
        r"--index http://127\.0\.0\.1:9/: cannot be fetched: .*refused .*attempts.*give another --index",
    ),
    Row(
        "resolve",
        "timeout not a number",
        ("resolve", "--timeout", "soon", "--index", "{empty}"),
        2,
        r"argument --timeout: must be a number of seconds above 0 .* got 'soon'",
    ),
    # install / download
    Row(
        "install",
        "timeout below zero",
        ("install", "--timeout", "-1", "--index", "{empty}"),
        2,
        r"argument --timeout: must be a number of seconds above 0 .* got '-1'",
    ),
    Row(
        "install",
        "missing index folder",
        ("install", "--index", "{tmp}/nothing-here"),
        4,
        r"--index .*nothing-here: no such file or directory",
    ),
    Row(
        "install",
        "index with no wheel",
        ("install", "--index", "{empty}"),
        3,
        r"no wheel fits; build from source: .*(/path/to/mamba-kernels|--no-build-isolation /)",
    ),
    Row(
        "install",
        "unknown option",
        ("install", "--force-everything"),
        2,
        r"unrecognized arguments: --force-everything",
    ),
    Row(
        "download",
        "no destination",
        ("download", "--index", "{empty}"),
        2,
        r"the following arguments are required: --dest",
    ),
    Row(
        "download",
        "missing index folder",
        ("download", "--dest", "{tmp}/wh", "--index", "{tmp}/nothing-here"),
        4,
        r"--index .*nothing-here: no such file or directory",
    ),
    Row(
        "download",
        "unknown platform",
        ("download", "--dest", "{tmp}/wh", "--platform", "amiga"),
        2,
        r"--platform must be one of .* got 'amiga'",
    ),
    # matrix / index: release tooling
    Row(
        "matrix",
        "unsupported torch",
        ("matrix", "--torch", "0.1"),
        2,
        r"torch must be one of the supported releases .* got '0\.1'",
    ),
    Row("matrix", "unsupported cuda", ("matrix", "--cuda", "99.9"), 2, r"cuda must be one of .* got '99\.9'"),
    Row(
        "matrix",
        "unknown option",
        ("matrix", "--format", "nope"),
        2,
        r"unrecognized arguments: --format nope",
    ),
    Row("index", "no folders", ("index",), 2, r"the following arguments are required: WHEEL_DIR, OUT_DIR"),
    Row(
        "index",
        "missing wheel folder",
        ("index", "{tmp}/nothing-here", "{tmp}/site"),
        2,
        r"WHEEL_DIR '.*nothing-here': must be a directory \(it does not exist\)",
    ),
    Row(
        "index",
        "a link among the wheels",
        ("index", "{tmp}/linked", "{tmp}/site"),
        2,
        r"'.*linked/elsewhere': is a symlink: the index reads only regular files and folders",
    ),
    Row("(none)", "unknown verb", ("explode",), 2, r"invalid choice: 'explode'"),
)


@pytest.mark.parametrize("row", ROWS, ids=[f"{r.verb}: {r.case}" for r in ROWS])
def test_cli_probe(row: Row, tmp_path, monkeypatch, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "elsewhere").symlink_to(tmp_path / "empty")

    def fill(s: str) -> str:
        return s.replace("{empty}", str(tmp_path / "empty")).replace("{tmp}", str(tmp_path))

    monkeypatch.chdir(tmp_path)  # outside any checkout: no hint may say `pip install ... .`
    monkeypatch.delenv("MAMBA_KERNELS_INDEX", raising=False)
    for k, v in row.env.items():
        monkeypatch.setenv(k, fill(v))
    try:
        status = main([fill(a) for a in row.argv])
    except SystemExit as e:  # argparse's own exits (usage errors, --help)
        status = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    assert "Traceback" not in err + out
    assert status == row.status, err
    said = out if row.on_stdout else err
    first = said.strip().splitlines()[0] if said.strip() else ""
    assert re.search(row.stderr, first), first
    assert "--no-build-isolation ." not in err + out
