"""The knob registry (facts/knob_table.py, re-exported by runtime/knobs.py) is the one place a
knob is defined: its records are sound, the code takes every name from it, and the README and
docs/BUILDING.md document exactly the knobs it holds."""

import ast
import re
from pathlib import Path

import pytest

from mamba_kernels.facts import knob_table, variant
from mamba_kernels.runtime import knobs

ROOT = Path(__file__).resolve().parent.parent
NAME = re.compile(r"\bMAMBA_KERNELS_[A-Z0-9_]*[A-Z0-9]\b")
# The product's code, where a knob's name may be written only in the registry.
CODE = ("mamba_kernels", "ci", "causal_conv1d", "selective_scan", "build_backend",
        "setup.py", "causal_conv1d_cuda.py", "selective_scan_cuda.py")
REGISTRY = ROOT / "mamba_kernels" / "facts" / "knob_table.py"
# bench/ and scripts/ are scripts run from their own folder on the GPU machine, whose import order
# decides what they load and measure; they write a knob's name as a user types it, and are only
# held to naming knobs the registry has.
TOOLS = ("bench", "scripts")
FOREIGN = {"TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "NVCC_THREADS"}  # the build's knobs of other names


def _files(roots):
    for r in roots:
        p = ROOT / r
        yield from ([p] if p.is_file() else sorted(p.rglob("*.py")))


def _section(text: str, heading: str) -> str:
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def _rows(section: str):
    """(variable cell, values cell, effect cell) of each row of the section's table."""
    for line in section.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            yield cells[0], cells[1], cells[2]


def _names(cell: str):
    return [n.strip("`") for n in cell.split(", ")]


# ----------------------------------------------------------------------------- the records


def test_every_record_is_sound():
    assert len(knobs.KNOBS) == len(knobs.BY_NAME) >= 17
    for k in knobs.KNOBS:
        assert k.name.startswith(knob_table.PREFIX) or k.name in FOREIGN, k.name
        assert k.kind in knob_table.KINDS and k.audience in knob_table.AUDIENCES, k
        assert k.doc and "\n" not in k.doc, k.name
        if k.kind == "choice":
            assert k.default == k.values[0] and len(set(k.values)) == len(k.values), k
        if k.kind == "bool":
            assert k.default is not None and knobs.parse_bool(k.name, k.default) in (True, False)
        if k.kind == "number" and k.default is not None:
            assert float(k.default) > 0, k


@pytest.mark.parametrize("bad", [dict(kind="flag"), dict(audience="users"),
                                 dict(kind="choice", default="b", values=("a", "b")),
                                 dict(kind="text", values=("a",))])
def test_a_malformed_record_is_refused(bad):
    fields = dict(name="MAMBA_KERNELS_X", kind="text", audience="runtime", doc="x")
    with pytest.raises(ValueError, match="MAMBA_KERNELS_X"):
        knob_table.Knob(**{**fields, **bad})


def test_runtime_knobs_names_every_record():
    # every record has its *_VAR name in runtime/knobs.py, where the floors above read it
    exported = {v for n, v in vars(knobs).items() if n.endswith("_VAR") and isinstance(v, str)}
    assert exported == set(knobs.BY_NAME)
    assert knobs.BY_NAME is knob_table.BY_NAME


def test_the_parsers_take_their_values_from_the_registry():
    for value in knob_table.BACKEND.values:
        assert knobs.backend_mode({knobs.BACKEND_VAR: value.upper()}) == value
    for value in knob_table.SCAN_STATES.values:
        assert knobs.scan_states({knobs.SCAN_STATES_VAR: value}) == value
    assert knobs.BINDINGS == knob_table.BINDING.values
    assert set(knobs.BINDINGS) == {"auto", *variant.BINDINGS}
    assert knobs.backend_mode({}) == knob_table.BACKEND.default
    assert knobs.binding_choice({}) == knob_table.BINDING.default
    assert knobs.scan_states({}) == knob_table.SCAN_STATES.default
    assert knobs.env_positive_int(knobs.MAX_JOBS_VAR, {knobs.MAX_JOBS_VAR: " 4 "}) == 4
    assert knobs.env_positive_int(knobs.MAX_JOBS_VAR, {}) is None
    with pytest.raises(ValueError, match="MAX_JOBS='0' must be a positive integer"):
        knobs.env_positive_int(knobs.MAX_JOBS_VAR, {knobs.MAX_JOBS_VAR: "0"})


# ----------------------------------------------------------------------------- the code


def _literal_names(path: Path):
    """(line, name) of each knob name written in a string literal or as a keyword argument of
    ``path``, docstrings left out (they document)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            docs.add(id(body[0].value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            for name in NAME.findall(node.value):
                yield node.lineno, name
        elif isinstance(node, ast.keyword) and node.arg and NAME.fullmatch(node.arg):
            yield node.value.lineno, node.arg


def test_no_knob_name_is_written_outside_the_registry():
    found = [f"{p.relative_to(ROOT)}:{line}: {name}"
             for p in _files(CODE) if p != REGISTRY for line, name in _literal_names(p)]
    assert found == [], "take these names from mamba_kernels.runtime.knobs:\n" + "\n".join(found)


def test_the_scan_sees_a_name_written_in_code(tmp_path):
    # the check above can fail: a definition, a message and an environment keyword are all seen
    p = tmp_path / "m.py"
    p.write_text('"""MAMBA_KERNELS_DOC is documentation."""\nX = "MAMBA_KERNELS_NEW"\n'
                 'msg = f"set MAMBA_KERNELS_BACKEND={1}"\nenv = dict(MAMBA_KERNELS_RELEASE="1")\n')
    assert sorted(n for _, n in _literal_names(p)) == ["MAMBA_KERNELS_BACKEND", "MAMBA_KERNELS_NEW",
                                                       "MAMBA_KERNELS_RELEASE"]


def test_every_name_the_code_and_docs_mention_is_a_knob():
    # comments, docstrings, bench/ and scripts/ and the docs: a name the registry lacks is a typo
    # or an undocumented knob (the C macro of the build's header is the one other name of ours)
    known = set(knobs.BY_NAME) | {knob_table.BUILD_INFO_MACRO}
    texts = list(_files(CODE + TOOLS)) + sorted(ROOT.glob("*.md")) + sorted((ROOT / "docs").rglob("*.md"))
    unknown = sorted({f"{p.relative_to(ROOT)}: {n}" for p in texts
                      for n in NAME.findall(p.read_text(encoding="utf-8")) if n not in known})
    assert unknown == []


# ----------------------------------------------------------------------------- the docs


def _check_values(k: knob_table.Knob, cell: str):
    if k.kind == "choice":
        listed = re.findall(r"`([^`]+)`", cell)
        assert listed == list(k.values), (k.name, cell)
        assert f"`{k.default}` (default)" in cell, (k.name, cell)
    elif k.kind == "bool":
        assert cell == "boolean", (k.name, cell)
    elif k.default is not None:
        assert f"(default `{k.default}`)" in cell, (k.name, cell)


def test_the_readme_documents_every_runtime_and_install_knob():
    section = _section((ROOT / "README.md").read_text(encoding="utf-8"), "## Environment knobs")
    rows = {n: values for var, values, _ in _rows(section) for n in _names(var)}
    want = {k.name for k in knob_table.of("runtime") + knob_table.of("install")}
    assert set(rows) == want
    for name, values in rows.items():
        _check_values(knobs.BY_NAME[name], values)
    # the sentence after the table names the build's knobs (`_X` is MAMBA_KERNELS_X), all of them
    sentence = section[section.index("The build's knobs ("):]
    sentence = sentence[:sentence.index("):")]
    named = {n if not n.startswith("_") else knob_table.PREFIX + n[1:]
             for n in re.findall(r"`([A-Z_][A-Z0-9_]*)`", sentence)}
    assert named == {k.name for k in knob_table.of("build")}


def test_building_md_documents_every_build_knob():
    section = _section((ROOT / "docs" / "BUILDING.md").read_text(encoding="utf-8"), "## The build's knobs")
    rows = {n: values for var, values, _ in _rows(section) for n in _names(var)}
    assert set(rows) == {k.name for k in knob_table.of("build")}
    for name, values in rows.items():
        k = knobs.BY_NAME[name]
        _check_values(k, values)
        if k.kind == "number":
            assert values == "positive integers", (name, values)


def test_the_docs_check_fails_on_a_knob_the_registry_lacks(monkeypatch):
    extra = knob_table.Knob("MAMBA_KERNELS_NEW", "bool", "runtime", "a knob not yet documented", "0")
    monkeypatch.setattr(knob_table, "KNOBS", knob_table.KNOBS + (extra,))
    monkeypatch.setitem(knob_table.BY_NAME, extra.name, extra)
    with pytest.raises(AssertionError):
        test_the_readme_documents_every_runtime_and_install_knob()
