"""The one way tests read a constant out of the CUDA sources (the policy headers above all), so
that a test that mirrors a kernel's number follows the header instead of repeating it.

``value(path, name)`` for a file-level constant, ``value(path, name, struct=...)`` for a member
of a policy struct; an initialiser must be plain arithmetic on integers (``int64_t(132) * 256``
is), and a name must be defined once where it is looked for."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional, Union

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "csrc"
SCAN_POLICY = CSRC / "selective_scan" / "scan_policy.cuh"


def code(path: Union[str, Path]) -> str:
    """The file (a path under the checkout, or absolute) without its comments."""
    text = re.sub(r"/\*.*?\*/", " ", (ROOT / path).read_text(), flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def body(path: Union[str, Path], struct: str) -> str:
    """The braces of ``struct <struct> {...}`` in the file, without comments."""
    text = code(path)
    start = text.index(f"struct {struct} {{")
    depth, i = 0, text.index("{", start)
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    raise AssertionError(f"struct {struct} is not closed in {path}")


def const(text: str, name: str) -> int:
    """The value of the one ``name = <integer arithmetic>;`` in ``text``."""
    found = re.findall(rf"\b{name}\s*=\s*([^;]+);", text)
    assert len(found) == 1, f"{name}: expected one definition, found {found}"
    expr = re.sub(r"int64_t\(([^()]*)\)", r"(\1)", found[0])
    assert re.fullmatch(r"[\d\s()*+<-]+", expr), f"{name} = {found[0]}: not a plain number"
    return int(eval(expr))  # digits and operators only (checked above)


def value(path: Union[str, Path], name: str, struct: Optional[str] = None) -> int:
    """A constant of the file, or of one of its structs."""
    return const(body(path, struct) if struct else code(path), name)


def policy(struct: str, name: str) -> int:
    """A constant of a policy struct of csrc/selective_scan/scan_policy.cuh."""
    return value(SCAN_POLICY, name, struct)
