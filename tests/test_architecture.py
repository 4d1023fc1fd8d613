"""The package's import graph, read from the source with ast: floors import only downward
(mamba_kernels.layers.LAYERS), no module imports itself through others, and a function-local
import names only an optional third-party module, with a comment saying why.

ci/ (the release tooling, outside the wheel) sits above every floor: it may import the package,
nothing shipped imports it, its modules import each other without a circle, and a function-local
import there names only what may be absent where its other commands run (a third-party module,
the kernel packages or a ci module that needs them), with a comment; never the standard library
or mamba_kernels."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

from mamba_kernels.layers import LAYERS

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "mamba_kernels"
CI = "ci"
# What the wheel ships or the build runs (pyproject's packages and py-modules, setup.py, the
# build backend): none of it may import ci.
SHIPPED = ("mamba_kernels", "causal_conv1d", "selective_scan", "selective_scan_cuda.py",
           "causal_conv1d_cuda.py", "setup.py", "build_backend")
STDLIB = set(sys.stdlib_module_names) if hasattr(sys, "stdlib_module_names") else set()


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path, package: str = PACKAGE) -> Dict[str, Path]:
    return {module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}


def _resolve(node: ast.ImportFrom, here: str, is_package: bool) -> str:
    """The absolute module an ImportFrom names (``from ..facts import x`` in a.b.c -> a.facts)."""
    if not node.level:
        return node.module or ""
    base = here.split(".") if is_package else here.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def edges(root: Path, package: str = PACKAGE) -> Dict[str, List[Tuple[str, int, bool]]]:
    """Per module of ``package``: (imported module of the package, line, whether at module level)
    for every import."""
    mods = modules(root, package)
    out: Dict[str, List[Tuple[str, int, bool]]] = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        top = {id(n) for n in tree.body}
        for n in tree.body:  # module level includes `if TYPE_CHECKING:` and try/except blocks
            if isinstance(n, (ast.If, ast.Try)):
                top.update(id(c) for c in ast.walk(n) if isinstance(c, (ast.Import, ast.ImportFrom)))
        found: List[Tuple[str, int, bool]] = []
        for n in ast.walk(tree):
            targets: List[str] = []
            if isinstance(n, ast.Import):
                targets = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                base = _resolve(n, name, path.name == "__init__.py")
                # `from pkg import mod` names a module when pkg.mod is one of ours
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in n.names]
            for t in targets:
                if t == package or t.startswith(package + "."):
                    found.append((t, n.lineno, id(n) in top))
        out[name] = found
    return out


def floor(module: str) -> Optional[int]:
    """The index in LAYERS of the floor a module is on; None for the package's own top modules."""
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def upward_imports(root: Path) -> List[str]:
    bad = []
    for mod, found in edges(root).items():
        here = floor(mod)
        for target, line, _ in found:
            there = floor(target)
            if here is not None and there is not None and there > here:
                bad.append(f"{mod}:{line} imports {target} ({LAYERS[there]} is above {LAYERS[here]})")
            if here is not None and there is None and target != PACKAGE + ".layers":
                bad.append(f"{mod}:{line} imports {target}, which is on no floor")
    return bad


def circles(root: Path, package: str = PACKAGE) -> List[List[str]]:
    """Every strongly connected set of two or more modules (Tarjan), each sorted."""
    graph: Dict[str, Set[str]] = {m: {t for t, _, _ in f} for m, f in edges(root, package).items()}
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1 or v in graph[v]:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _explained(lines: List[str], lineno: int) -> bool:
    """A comment on the import's line, or above it or above the imports right before it."""
    if "#" in lines[lineno - 1]:
        return True
    i = lineno - 2
    while i >= 0 and lines[i].strip().startswith(("import ", "from ")):
        i -= 1
    return i >= 0 and lines[i].strip().startswith("#")


def _optional(head: str, package: str) -> bool:
    """Whether a module of ``package`` may import ``head`` inside a function (with a comment)."""
    if head in STDLIB or head == PACKAGE:
        return False
    return head != package or package == CI  # a ci module may import one that needs torch


def unmarked_local_imports(root: Path, package: str = PACKAGE) -> List[str]:
    """Imports inside a function or class that are not an optional module with a comment on the
    import's line or the line above it: in the package, optional means third-party; in ci/, any
    module but the standard library's and mamba_kernels (which ci/ always has)."""
    bad = []
    for name, path in modules(root, package).items():
        lines = path.read_text(encoding="utf-8").splitlines()
        tree = ast.parse("\n".join(lines), str(path))
        for scope in ast.walk(tree):
            if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            for n in ast.walk(scope):
                if not isinstance(n, (ast.Import, ast.ImportFrom)):
                    continue
                if isinstance(n, ast.ImportFrom):
                    heads = [(n.module or "").split(".")[0]] if not n.level else [package]
                else:
                    heads = [a.name.split(".")[0] for a in n.names]
                optional = all(_optional(h, package) for h in heads)
                commented = _explained(lines, n.lineno)
                if not (optional and commented):
                    what = "no comment saying why" if optional else "our own or standard-library module"
                    bad.append(f"{name}:{n.lineno} imports {', '.join(heads)} inside a function ({what})")
    return bad


def test_floors_import_only_downward():
    assert upward_imports(ROOT) == []


def test_no_import_circles():
    assert circles(ROOT) == []


def test_function_local_imports_are_optional_third_party_and_explained():
    assert unmarked_local_imports(ROOT) == []


def imports_of_ci(root: Path) -> List[str]:
    """Every import of ci in what the wheel ships or the build runs."""
    bad = []
    for top in SHIPPED:
        path = root / top
        for f in [path] if path.suffix == ".py" else sorted(path.rglob("*.py")):
            for n in ast.walk(ast.parse(f.read_text(encoding="utf-8"), str(f))):
                names = [a.name for a in n.names] if isinstance(n, ast.Import) else (
                    [n.module or ""] if isinstance(n, ast.ImportFrom) and not n.level else [])
                bad += [f"{f.relative_to(root)}:{n.lineno} imports {m}" for m in names
                        if m.split(".")[0] == CI]
    return bad


def test_ci_sits_above_the_package():
    assert imports_of_ci(ROOT) == []
    assert circles(ROOT, CI) == []
    assert unmarked_local_imports(ROOT, CI) == []


def test_every_floor_is_a_package_with_a_purpose():
    for layer in LAYERS:
        init = ROOT / PACKAGE / layer / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc and "\n" not in doc.strip(), f"{init}: needs a one-line docstring saying its purpose"
    stray = [p.name for p in (ROOT / PACKAGE).glob("*.py")
             if p.name not in ("__init__.py", "__main__.py", "layers.py")]
    assert stray == [], f"modules outside the floors: {stray}"


def _copy(tmp_path: Path) -> Path:
    for top in (*SHIPPED, CI):
        subprocess.run(["cp", "-r", str(ROOT / top), str(tmp_path / top)], check=True)
    return tmp_path


def test_the_checks_fail_on_an_injected_upward_import_circle_and_local_import(tmp_path):
    root = _copy(tmp_path)
    support = root / PACKAGE / "facts" / "support.py"
    text = support.read_text(encoding="utf-8")
    support.write_text(text + "\nfrom ..release import matrix  # noqa: F401\n\n\ndef _late():\n"
                       "    import json\n    return json\n", encoding="utf-8")
    assert any("facts.support" in b and "release.matrix" in b for b in upward_imports(root))
    assert any("mamba_kernels.facts.support" in c and "mamba_kernels.release.matrix" in c
               for c in circles(root))
    assert any("facts.support" in b and "json" in b for b in unmarked_local_imports(root))


def test_the_ci_checks_fail_on_an_injected_ci_import_circle_and_local_import(tmp_path):
    root = _copy(tmp_path)
    version = root / PACKAGE / "facts" / "version.py"
    version.write_text(version.read_text(encoding="utf-8") + "\nimport ci.plan  # noqa: F401\n")
    assert any("version.py" in b and "ci.plan" in b for b in imports_of_ci(root))
    plan = root / CI / "plan.py"
    plan.write_text(plan.read_text(encoding="utf-8") + "\nfrom ci import preflight  # noqa: F401\n\n\n"
                    "def _late():\n    from mamba_kernels.facts import support\n    import json\n"
                    "    return json, support\n", encoding="utf-8")
    assert any("ci.plan" in c and "ci.preflight" in c for c in circles(root, CI))
    bad = unmarked_local_imports(root, CI)
    assert any("ci.plan" in b and "mamba_kernels" in b for b in bad)
    assert any("ci.plan" in b and "json" in b for b in bad)


# A function longer than this says why in its docstring, in a sentence starting "Long:".
MAX_FUNCTION_LINES = 80


def long_functions(root: Path) -> List[str]:
    """Functions over MAX_FUNCTION_LINES lines in what ships and in ci/ whose docstring gives no
    "Long:" reason."""
    bad = []
    for top in (*SHIPPED, CI):
        path = root / top
        for f in [path] if path.suffix == ".py" else sorted(path.rglob("*.py")):
            for n in ast.walk(ast.parse(f.read_text(encoding="utf-8"), str(f))):
                if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                lines = n.end_lineno - n.lineno + 1
                if lines > MAX_FUNCTION_LINES and "Long:" not in (ast.get_docstring(n) or ""):
                    bad.append(f"{f.relative_to(root)}:{n.lineno} {n.name} ({lines} lines)")
    return bad


def test_long_functions_say_why():
    assert long_functions(ROOT) == []


def test_the_length_check_fails_on_an_injected_long_function(tmp_path):
    root = _copy(tmp_path)
    version = root / PACKAGE / "facts" / "version.py"
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    version.write_text(version.read_text(encoding="utf-8") + f"\n\ndef _sprawl():\n{body}    return 0\n")
    assert any("_sprawl" in b for b in long_functions(root))


# A CUDA kernel's body longer than this is split into the phases of an agent struct
# (docs/KERNELS.md, "Adding an op"); the phases, not the kernel, hold the work.
MAX_KERNEL_LINES = 150

# Kernels kept whole, each with the measurement that keeps it so (docs/notes/bench-passes.md).
LONG_KERNELS_KEPT: dict = {}


def _strip_comments(text: str) -> str:
    """C++ text with // and /* */ comments blanked (newlines kept), so braces in them do not count."""
    return re.sub(r"//[^\n]*|/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)


def _kernel_name(head: str) -> str:
    """The name in a kernel's declaration after `__global__`, past its __launch_bounds__(...)."""
    lb = head.find("__launch_bounds__")
    if lb >= 0:
        depth, i = 0, head.index("(", lb)
        while True:
            depth += {"(": 1, ")": -1}.get(head[i], 0)
            i += 1
            if depth == 0:
                break
        head = head[i:]
    name = re.search(r"(\w+)\s*\(", head)
    return name.group(1) if name else "?"


def long_kernels(csrc: Path, kept=()) -> List[str]:
    """`__global__` functions under csrc whose body (opening to closing brace) exceeds MAX_KERNEL_LINES,
    but for those named in `kept` ("path/under/csrc.cu kernel_name")."""
    bad = []
    for f in sorted([*csrc.rglob("*.cu"), *csrc.rglob("*.cuh")]):
        text = _strip_comments(f.read_text(encoding="utf-8"))
        for m in re.finditer(r"__global__", text):
            start = text.find("{", m.end())
            if start < 0 or ";" in text[m.end():start]:  # a declaration without a body
                continue
            depth, i = 0, start
            while i < len(text):
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                if depth == 0:
                    break
                i += 1
            lines = text.count("\n", start, i) + 1
            name = _kernel_name(text[m.end():start])
            if lines > MAX_KERNEL_LINES and f"{f.relative_to(csrc)} {name}" not in kept:
                line = text.count("\n", 0, m.start()) + 1
                bad.append(f"{f.relative_to(csrc)}:{line} {name} ({lines} lines)")
    return bad


def test_kernel_bodies_are_phases():
    assert long_kernels(ROOT / "csrc", LONG_KERNELS_KEPT) == []


def test_kernels_kept_whole_are_still_long():
    """An exception that no longer applies (the kernel split or gone) leaves the list."""
    long_now = {f"{b.split(':')[0]} {b.split(' ')[1]}" for b in long_kernels(ROOT / "csrc")}
    assert set(LONG_KERNELS_KEPT) <= long_now, set(LONG_KERNELS_KEPT) - long_now


def test_the_kernel_length_check_fails_on_an_injected_long_kernel(tmp_path):
    csrc = tmp_path / "csrc"
    (csrc / "k").mkdir(parents=True)
    body = "".join(f"  x[{i}] = {i};  // {{ a brace in a comment\n" for i in range(MAX_KERNEL_LINES))
    (csrc / "k" / "long.cu").write_text(
        f"__global__ void short_one(float* x) {{ x[0] = 0; }}\n"
        f"template <int N>\n__global__ void __launch_bounds__(128) sprawl(float* x) {{\n{body}}}\n",
        encoding="utf-8")
    assert long_kernels(csrc) == [f"k/long.cu:3 sprawl ({MAX_KERNEL_LINES + 2} lines)"]
