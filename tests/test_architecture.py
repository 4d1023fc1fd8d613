"""The package's import graph, read from the source with ast: floors import only downward
(mamba_kernels.layers.LAYERS), no module imports itself through others, and a function-local
import names only an optional third-party module, with a comment saying why."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

from mamba_kernels.layers import LAYERS

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "mamba_kernels"
STDLIB = set(sys.stdlib_module_names) if hasattr(sys, "stdlib_module_names") else set()


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path) -> Dict[str, Path]:
    return {module_name(p, root): p for p in sorted((root / PACKAGE).rglob("*.py"))}


def _resolve(node: ast.ImportFrom, here: str, is_package: bool) -> str:
    """The absolute module an ImportFrom names (``from ..facts import x`` in a.b.c -> a.facts)."""
    if not node.level:
        return node.module or ""
    base = here.split(".") if is_package else here.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def edges(root: Path) -> Dict[str, List[Tuple[str, int, bool]]]:
    """Per module: (imported module of ours, line, whether at module level) for every import."""
    mods = modules(root)
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
                if t == PACKAGE or t.startswith(PACKAGE + "."):
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


def circles(root: Path) -> List[List[str]]:
    """Every strongly connected set of two or more modules (Tarjan), each sorted."""
    graph: Dict[str, Set[str]] = {m: {t for t, _, _ in f} for m, f in edges(root).items()}
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


def unmarked_local_imports(root: Path) -> List[str]:
    """Imports inside a function or class that are not an optional third-party module with a
    comment on the import's line or the line above it."""
    bad = []
    for name, path in modules(root).items():
        lines = path.read_text(encoding="utf-8").splitlines()
        tree = ast.parse("\n".join(lines), str(path))
        for scope in ast.walk(tree):
            if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            for n in ast.walk(scope):
                if not isinstance(n, (ast.Import, ast.ImportFrom)):
                    continue
                if isinstance(n, ast.ImportFrom):
                    heads = [(n.module or "").split(".")[0]] if not n.level else [PACKAGE]
                else:
                    heads = [a.name.split(".")[0] for a in n.names]
                third_party = all(h not in STDLIB and h != PACKAGE for h in heads)
                commented = _explained(lines, n.lineno)
                if not (third_party and commented):
                    what = "no comment saying why" if third_party else "our own or standard-library module"
                    bad.append(f"{name}:{n.lineno} imports {', '.join(heads)} inside a function ({what})")
    return bad


def test_floors_import_only_downward():
    assert upward_imports(ROOT) == []


def test_no_import_circles():
    assert circles(ROOT) == []


def test_function_local_imports_are_optional_third_party_and_explained():
    assert unmarked_local_imports(ROOT) == []


def test_every_floor_is_a_package_with_a_purpose():
    for layer in LAYERS:
        init = ROOT / PACKAGE / layer / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc and "\n" not in doc.strip(), f"{init}: needs a one-line docstring saying its purpose"
    stray = [p.name for p in (ROOT / PACKAGE).glob("*.py")
             if p.name not in ("__init__.py", "__main__.py", "layers.py")]
    assert stray == [], f"modules outside the floors: {stray}"


def _copy(tmp_path: Path) -> Path:
    subprocess.run(["cp", "-r", str(ROOT / PACKAGE), str(tmp_path / PACKAGE)], check=True)
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
