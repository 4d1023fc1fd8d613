"""bench/RESULTS.md, written from the records in bench/results/*.json (standard library only).

    python3 bench/results.py render              # rewrite bench/RESULTS.md from bench/results/
    python3 bench/results.py check               # exit 1 when bench/RESULTS.md is not what render writes
    python3 bench/results.py update NEW.json...  # a benchmark's --json records into their tables, then render

A table file holds one op (or one client's end-to-end rows) against its original:
``order``, ``title``, ``op``, ``client``, ``about``, ``against``, ``records`` and, while it has no
records, ``pending`` (why). A record is one measured case; ``REQUIRED`` lists its fields. Figures
and ratios may be strings, so that a figure keeps the digits it was written with; a figure may be
a range ("34-41") or null where only the ratio was recorded. ``ratio_kind`` says which way a ratio
reads: "speedup" is the original's time over ours (or our rate over the original's), above 1 is
ours faster; "ours/original" is our time or bytes over the original's, below 1 is ours better.
``update`` replaces the record of the same (shape, variant, dtype) in the table of the same
(op, client) and appends the others.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Dict, List, Optional, Sequence, Tuple

BENCH = os.path.dirname(os.path.abspath(__file__))
TABLES = os.path.join(BENCH, "results")
PAGE = os.path.join(BENCH, "RESULTS.md")

REQUIRED = ("op", "client", "shape", "dtype", "ours", "original", "unit", "ratio", "ratio_kind",
            "gpu", "date", "commit", "command")
OPTIONAL = ("variant", "interval", "ratio_graph", "computed")
TABLE_KEYS = ("order", "title", "op", "client", "about", "against", "records")
RATIO_KINDS = ("speedup", "ours/original")
_NUMBER = re.compile(r"^-?\d+(\.\d+)?(e-?\d+)?$")
_RANGE = re.compile(r"^\d+(\.\d+)?-\d+(\.\d+)?$")


class RecordError(ValueError):
    """A table file or record that the page cannot be written from; the message says where."""


def _is_number(v: object) -> bool:
    if isinstance(v, str):
        return bool(_NUMBER.match(v))
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_record(rec: object, where: str) -> None:
    if not isinstance(rec, dict):
        raise RecordError(f"{where}: a record is a JSON object, got {type(rec).__name__}")
    missing = [k for k in REQUIRED if k not in rec]
    if missing:
        raise RecordError(f"{where}: missing field(s) {', '.join(missing)}")
    unknown = sorted(set(rec) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise RecordError(f"{where}: unknown field(s) {', '.join(unknown)}")
    for k in ("op", "shape", "dtype", "unit", "gpu", "date", "commit", "command"):
        if not isinstance(rec[k], str) or not rec[k].strip():
            raise RecordError(f"{where}: field {k!r} must be a non-empty string, got {rec[k]!r}")
    if rec["client"] is not None and not isinstance(rec["client"], str):
        raise RecordError(f"{where}: field 'client' must be a string or null, got {rec['client']!r}")
    for k in ("ours", "original"):
        v = rec[k]
        if v is not None and not _is_number(v) and not (isinstance(v, str) and _RANGE.match(v)):
            raise RecordError(f"{where}: field {k!r} must be a number, a range 'a-b' or null, got {v!r}")
    for k in ("ratio", "ratio_graph"):
        if k in rec and rec[k] is not None and not _is_number(rec[k]):
            raise RecordError(f"{where}: field {k!r} must be a number or null, got {rec[k]!r}")
    if rec["ratio"] is None and rec["ours"] is None:
        raise RecordError(f"{where}: a record needs a figure or a ratio")
    if rec["ratio_kind"] not in RATIO_KINDS:
        raise RecordError(f"{where}: field 'ratio_kind' must be one of {', '.join(RATIO_KINDS)}, "
                          f"got {rec['ratio_kind']!r}")
    if "interval" in rec:
        iv = rec["interval"]
        if not (isinstance(iv, list) and len(iv) == 2 and all(_is_number(x) for x in iv)):
            raise RecordError(f"{where}: field 'interval' must be [low, high], got {iv!r}")
    if "computed" in rec and not isinstance(rec["computed"], bool):
        raise RecordError(f"{where}: field 'computed' must be true or false, got {rec['computed']!r}")


def check_table(table: object, where: str) -> None:
    if not isinstance(table, dict):
        raise RecordError(f"{where}: a table file holds a JSON object")
    missing = [k for k in TABLE_KEYS if k not in table]
    if missing:
        raise RecordError(f"{where}: missing table field(s) {', '.join(missing)}")
    if not isinstance(table["records"], list):
        raise RecordError(f"{where}: 'records' must be a list")
    if not table["records"] and not table.get("pending"):
        raise RecordError(f"{where}: a table without records says why in 'pending'")
    for i, rec in enumerate(table["records"]):
        check_record(rec, f"{where}: record {i}")
        for k in ("op", "client"):
            if rec[k] != table[k]:
                raise RecordError(f"{where}: record {i}: {k} {rec[k]!r} is not the table's {table[k]!r}")


def load_tables(directory: Optional[str] = None) -> List[Tuple[str, dict]]:
    directory = directory or TABLES
    tables = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".json"):
            continue
        path = os.path.join(directory, name)
        try:
            with open(path) as f:
                table = json.load(f)
        except json.JSONDecodeError as e:
            raise RecordError(f"{name}: not JSON: {e}") from None
        check_table(table, name)
        tables.append((path, table))
    orders = [t["order"] for _, t in tables]
    if len(set(orders)) != len(orders):
        raise RecordError("two table files have the same 'order'")
    return sorted(tables, key=lambda pt: pt[1]["order"])


def _num(v: object) -> str:
    """A figure as written: strings verbatim, numbers from a benchmark to six significant digits."""
    return v if isinstance(v, str) else f"{v:g}"


def _figure(v: object, unit: str) -> str:
    return "-" if v is None else f"{_num(v)} {unit}"


def _ratio(rec: dict) -> str:
    if rec["ratio"] is None:
        return "-"
    r = _num(rec["ratio"])
    text = f"{r}x" if rec["ratio_kind"] == "speedup" else f"ours/orig {r}"
    if rec.get("computed"):
        text += "*"
    if "interval" in rec:
        text += f" ({_num(rec['interval'][0])}-{_num(rec['interval'][1])})"
    if rec.get("ratio_graph") is not None:
        text += f", graph {_num(rec['ratio_graph'])}x"
    return text


INTRO = """\
# Results against the originals

Our kernels against the packages they replace (causal-conv1d 1.7.0; mamba_ssm 2.3.2.post1's CUDA
scan, Triton kernels and models), both built for sm_90 and timed in one process, each row with its
date, commit and command (`[n]`, under its table). `1.81x` is a speedup (the original's time over
ours); `ours/orig 0.893` our time or size over the original's; `*` a ratio computed from the row's
two figures; brackets a 95 % interval of paired rounds. Written by `python3 bench/results.py
render` from bench/results/*.json (refresh a table: its benchmark with `--json PATH`, then
`python3 bench/results.py update PATH`); the dated passes behind the figures are in
[docs/notes/bench-passes.md](../docs/notes/bench-passes.md), the sanitizer's results in
[docs/KERNELS.md](../docs/KERNELS.md#sanitizer-checks)."""


def _float(v: object) -> Optional[float]:
    try:
        return float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def glance(tables: Sequence[Tuple[str, dict]]) -> List[str]:
    """The page's first table: per table, the lowest and highest speedup over its rows (rows that
    give ours/orig instead, memory and size, are counted but not ranged)."""
    out = ["\n## At a glance", "| table | speedup, lowest - highest | rows | latest |", "|---|---|---|---|"]
    for _, t in tables:
        recs = t["records"]
        if not recs:
            out.append(f"| {t['title']} | not measured yet | 0 | - |")
            continue
        sp = [x for x in (_float(r["ratio"]) for r in recs if r["ratio_kind"] == "speedup") if x is not None]
        span = "-" if not sp else (f"{min(sp):g}x" if min(sp) == max(sp) else f"{min(sp):g}x - {max(sp):g}x")
        out.append(f"| [{t['title']}](#{_anchor(t['title'])}) | {span} | {len(recs)} | "
                   f"{max(r['date'][:10] for r in recs)} |")
    return out


def _anchor(title: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    kept = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def render(tables: Sequence[Tuple[str, dict]]) -> str:
    out = [INTRO] + glance(tables)
    for _, t in tables:
        out.append(f"\n## {t['title']}")
        if not t["records"]:
            out.append(f"Not measured yet (against {t['against']}): {t['pending']}")
            continue
        gpus = sorted({r["gpu"] for r in t["records"]})
        out.append(t["about"] + f" Against: {t['against']}. On: {'; '.join(gpus)}.")
        commands: Dict[str, int] = {}
        out.append("\n| case | dtype | ours | original | ratio | date | commit | command |")
        out.append("|---|---|---|---|---|---|---|---|")
        for r in t["records"]:
            n = commands.setdefault(r["command"], len(commands) + 1)
            case = r["shape"] + (f", {r['variant']}" if r.get("variant") else "")
            figures = f"{_figure(r['ours'], r['unit'])} | {_figure(r['original'], r['unit'])}"
            cells = [case, r["dtype"], figures, _ratio(r), r["date"], r["commit"], f"[{n}]"]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
        out.extend(f"[{n}] `{c}`  " for c, n in commands.items())
        out[-1] = out[-1].rstrip()
    return "\n".join(out) + "\n"


def render_page(directory: Optional[str] = None) -> str:
    return render(load_tables(directory))


def record(**fields: object) -> dict:
    """One record in the tables' schema, checked: what a benchmark's ``--json`` writes."""
    rec = {k: fields[k] for k in REQUIRED if k in fields}
    rec.update({k: fields[k] for k in OPTIONAL if k in fields and fields[k] is not None})
    extra = set(fields) - set(REQUIRED) - set(OPTIONAL)
    if extra:
        raise RecordError(f"record: unknown field(s) {', '.join(sorted(extra))}")
    check_record(rec, "record")
    return rec


def speedup_record(op: str, shape: str, dtype: str, ours: float, original: Optional[float], unit: str,
                   context: Dict[str, str], client: Optional[str] = None, ratio: Optional[float] = None,
                   **optional: object) -> dict:
    """A timed case: the ratio is the original's time over ours unless given (a paired median)."""
    if ratio is None and original is not None and ours > 0:
        ratio = round(original / ours, 3)
    return record(op=op, client=client, shape=shape, dtype=dtype, ours=round(ours, 5),
                  original=None if original is None else round(original, 5), unit=unit, ratio=ratio,
                  ratio_kind="speedup", **context, **optional)


def write_records(path: str, records: Sequence[dict]) -> None:
    for i, rec in enumerate(records):
        check_record(rec, f"{path}: record {i}")
    with open(path, "w") as f:
        json.dump({"records": list(records)}, f, indent=1)
        f.write("\n")


def _key(rec: dict) -> Tuple[object, ...]:
    return rec["shape"], rec.get("variant"), rec["dtype"]


def update(new_files: Sequence[str], directory: Optional[str] = None) -> List[str]:
    """Merge records into their tables; returns the table files written."""
    directory = directory or TABLES
    tables = load_tables(directory)
    by_op = {(t["op"], t["client"]): (p, t) for p, t in tables}
    touched: Dict[str, dict] = {}
    for new in new_files:
        with open(new) as f:
            data = json.load(f)
        recs = data.get("records") if isinstance(data, dict) else None
        if not isinstance(recs, list):
            raise RecordError(f"{new}: expected an object with a 'records' list")
        for i, rec in enumerate(recs):
            check_record(rec, f"{new}: record {i}")
            hit = by_op.get((rec["op"], rec["client"]))
            if hit is None:
                raise RecordError(f"{new}: record {i}: no table in {directory} for op {rec['op']!r}, "
                                  f"client {rec['client']!r}")
            path, table = hit
            same = [j for j, old in enumerate(table["records"]) if _key(old) == _key(rec)]
            if same:
                table["records"][same[0]] = rec
            else:
                table["records"].append(rec)
            touched[path] = table
    for path, table in touched.items():
        table.pop("pending", None)  # it has records now
        with open(path, "w") as f:
            json.dump(table, f, indent=1)
            f.write("\n")
    return sorted(touched)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("render", help="rewrite bench/RESULTS.md from bench/results/")
    sub.add_parser("check", help="exit 1 when bench/RESULTS.md differs from what render writes")
    up = sub.add_parser("update", help="merge --json records into their tables, then render")
    up.add_argument("files", nargs="+")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "update":
            for path in update(args.files):
                print(f"updated {os.path.relpath(path)}")
        page = render_page()
    except RecordError as e:
        print(f"results: {e}", file=sys.stderr)
        return 2
    if args.cmd == "check":
        with open(PAGE) as f:
            if f.read() != page:
                print("bench/RESULTS.md differs from the records: run python3 bench/results.py render",
                      file=sys.stderr)
                return 1
        return 0
    with open(PAGE, "w") as f:
        f.write(page)
    print(f"wrote {os.path.relpath(PAGE)} ({page.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
