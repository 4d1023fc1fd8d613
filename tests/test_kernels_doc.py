"""docs/KERNELS.md "Tuning policies" names the policy structs of the headers it lists, and holds
no copy of their values (a retuning then changes the header alone)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Set

import header_values

ROOT = Path(__file__).resolve().parent.parent


def _policy_rows() -> List[List[str]]:
    """The cells of each row of the section's table, below its heading and rule."""
    text = (ROOT / "docs" / "KERNELS.md").read_text()
    section = re.search(r"^## Tuning policies\n(.*?)(?=^## )", text, re.M | re.S)
    assert section, "docs/KERNELS.md has no '## Tuning policies' section"
    lines = [ln for ln in section.group(1).splitlines() if ln.startswith("|")]
    return [[c.strip() for c in ln.strip()[1:-1].split("|")] for ln in lines[2:]]


def test_the_policy_table_names_every_policy_struct_of_its_headers():
    table: Dict[str, Set[str]] = {}
    header = ""
    for cells in _policy_rows():
        header = cells[0].strip("`") or header  # an empty cell: the header of the row above
        assert header, f"a row before the first header: {cells}"
        table.setdefault(header, set()).update(re.findall(r"`(\w+)(?:<\w+>)?`", cells[1]))
    assert table, "the Tuning policies table lists no header"
    for header, named in table.items():
        defined = set(re.findall(r"\bstruct (\w+Policy)\s*\{", header_values.code(header)))
        assert defined and named == defined, (
            f"{header}: the table names {sorted(named)}, the header defines {sorted(defined)}")


def test_the_policy_table_copies_no_value():
    # the "what it fixes" column names quantities; a digit there is a value copied from a header
    # ("kS = 1, 2, 4" names the template's instances, not a tuning)
    for cells in _policy_rows():
        fixes = cells[-1].replace("kS = 1, 2, 4", "")
        assert not re.search(r"\d", fixes), f"a value in docs/KERNELS.md's policy table: {cells}"
