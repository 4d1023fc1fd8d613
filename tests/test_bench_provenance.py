"""bench/provenance.py: the side-by-side harness refuses a side that is not what it claims.

Each case builds a small fake "original" install on disk (a mamba_ssm/ops/selective_scan_interface.py
that does ``import selective_scan_cuda``, as the original's does) and runs the helper in a fresh
interpreter with this checkout first on sys.path, where a plain ``import selective_scan_cuda``
finds OUR compatibility module: the layout in which the old harness timed our kernel twice.
The compiled case builds a real (tiny) extension with the C compiler, skipped without one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")


def fake_original(tmp_path, ext_source: str = "") -> str:
    """An install dir: mamba_ssm (its __init__ would fail if run) whose interface imports
    selective_scan_cuda, plus, when given, a selective_scan_cuda.py with ``ext_source``."""
    orig = tmp_path / "orig"
    ops = orig / "mamba_ssm" / "ops"
    ops.mkdir(parents=True)
    init = "__version__ = '0.0.fake'\nraise ImportError('not run')\n"
    (orig / "mamba_ssm" / "__init__.py").write_text(init)
    (ops / "__init__.py").write_text("")
    (ops / "selective_scan_interface.py").write_text("import selective_scan_cuda\n")
    if ext_source:
        (orig / "selective_scan_cuda.py").write_text(ext_source)
    return str(orig)


def compiled_original(tmp_path) -> tuple:
    """(install dir, .so path): fake_original plus a real compiled selective_scan_cuda, a
    single-phase extension module built with the C compiler."""
    orig = fake_original(tmp_path)
    src = tmp_path / "ext.c"
    src.write_text(textwrap.dedent("""
        #include <Python.h>
        static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "selective_scan_cuda", NULL, -1, NULL};
        PyMODINIT_FUNC PyInit_selective_scan_cuda(void) { return PyModule_Create(&def); }
    """))
    so = os.path.join(orig, f"selective_scan_cuda{EXT_SUFFIX}")
    inc = sysconfig.get_paths()["include"]
    subprocess.run(["cc", "-shared", "-fPIC", f"-I{inc}", str(src), "-o", so], check=True, timeout=120)
    return orig, so


def helper(code: str, *path_after: str) -> subprocess.CompletedProcess:
    """Run ``code`` with the helper imported, this checkout first on sys.path, ``path_after``
    appended after it (as the old harness appended the original's directory)."""
    prelude = f"import sys\nsys.path[:0] = [{ROOT!r}, {BENCH!r}]\nsys.path += {list(path_after)!r}\n"
    prelude += "import provenance\n"
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)


def test_plain_import_finds_ours_first(tmp_path):
    # the trap itself: with the original's dir after ours, its interface binds our module
    orig = fake_original(tmp_path, "FAKE = True\n")
    r = helper("""
        import mamba_ssm.ops.selective_scan_interface as i
        print(i.selective_scan_cuda.__file__)
    """, orig)
    assert r.returncode != 0  # mamba_ssm's __init__ runs on a plain import; without it:
    r = helper("""
        import importlib.util, os
        pkg = os.path.join(sys.path[-1], "mamba_ssm")
        spec = importlib.util.spec_from_file_location("mamba_ssm", os.path.join(pkg, "__init__.py"),
                                                      submodule_search_locations=[pkg])
        sys.modules["mamba_ssm"] = importlib.util.module_from_spec(spec)
        import mamba_ssm.ops.selective_scan_interface as i
        print(i.selective_scan_cuda.__file__)
        provenance.check_original_interface(i, sys.path[-1])
    """, orig)
    assert os.path.join(ROOT, "selective_scan_cuda.py") in r.stdout
    assert r.returncode != 0 and "is not a compiled extension" in r.stderr


def test_refuses_an_original_without_its_compiled_extension(tmp_path):
    orig = fake_original(tmp_path, "FAKE = True\n")
    r = helper("provenance.load_original_scan(sys.path[-1])", orig)
    assert r.returncode != 0
    assert "expected one compiled selective_scan_cuda" in r.stderr and "selective_scan_cuda.py" in r.stderr


def test_command_line_says_provenance_failed(tmp_path):
    orig = fake_original(tmp_path, "FAKE = True\n")
    cmd = [sys.executable, os.path.join(BENCH, "provenance.py"), "check", "orig", "--orig-dir", orig]
    env = {**os.environ, "PYTHONPATH": ROOT}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 1 and "PROVENANCE FAILED (orig)" in r.stderr


def test_refuses_when_the_name_is_taken_already(tmp_path):
    orig = fake_original(tmp_path)
    (tmp_path / "orig" / f"selective_scan_cuda{EXT_SUFFIX}").write_bytes(b"")  # never loaded: refused first
    r = helper("""
        import selective_scan_cuda  # ours, imported before the original could be bound
        provenance.load_original_scan(sys.path[-1])
    """, orig)
    assert r.returncode != 0 and "was already imported from" in r.stderr


def test_compiled_check_and_root():
    r = helper("""
        import _json, os
        lib = os.path.dirname(_json.__file__)
        print(provenance.require_compiled("x", _json, lib))
        import selective_scan_cuda
        for mod, root in ((_json, os.path.dirname(lib) + "/elsewhere"), (selective_scan_cuda, None)):
            try:
                provenance.require_compiled("x", mod, root)
            except provenance.ProvenanceError as e:
                print("refused:", e)
    """)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].endswith(EXT_SUFFIX)
    assert "is not under" in lines[1] and "is not a compiled extension" in lines[2]


def test_ours_client_binds_our_compat_module(tmp_path):
    # mamba_ssm's own Python (here the fake) on ours: accepted when its interface binds our
    # selective_scan_cuda.py, refused when a stray one elsewhere comes first
    orig = fake_original(tmp_path)
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "selective_scan_cuda.py").write_text("FAKE = True\n")
    code = """
        import importlib.util, os
        pkg = os.path.join({where!r}, "mamba_ssm")
        spec = importlib.util.spec_from_file_location("mamba_ssm", os.path.join(pkg, "__init__.py"),
                                                      submodule_search_locations=[pkg])
        sys.modules["mamba_ssm"] = importlib.util.module_from_spec(spec)
        {first}
        print("\\n".join(provenance.check_ours_client(compiled=False)))
    """
    r = helper(code.format(where=orig, first=""))
    assert r.returncode == 0, r.stderr
    assert f"selective_scan_cuda: {os.path.join(ROOT, 'selective_scan_cuda.py')}" in r.stdout
    r = helper(code.format(where=orig, first=f"sys.path.insert(0, {str(stray)!r})"))
    assert r.returncode != 0 and "expected" in r.stderr and str(stray) in r.stderr


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_binds_the_originals_compiled_extension(tmp_path):
    # the fix: a real compiled selective_scan_cuda in the original's dir is what its interface
    # binds, although ours is first on sys.path; its file is reported
    orig, so = compiled_original(tmp_path)
    r = helper("""
        iface, lines = provenance.load_original_scan(sys.path[-1])
        import selective_scan_cuda
        assert selective_scan_cuda is iface.selective_scan_cuda
        print("\\n".join(lines))
    """, orig)
    assert r.returncode == 0, r.stderr
    assert f"mamba_ssm.ops.selective_scan_interface.selective_scan_cuda: {os.path.realpath(so)}" in r.stdout
    assert "mamba_ssm 0.0.fake from" in r.stdout


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_loads_the_original_beside_ours(tmp_path):
    # bench/e2e_ab.py holds both sides: the original's compiled file comes back as a module of
    # its own, and `import selective_scan_cuda` still finds ours (a single-phase extension like
    # this one would otherwise be entered into sys.modules by the import machinery)
    orig, so = compiled_original(tmp_path)
    r = helper("""
        import selective_scan_cuda as ours
        module, path = provenance.load_original_extension(sys.path[-1], "selective_scan_cuda")
        assert module is not ours and module.__file__ == path, (module, path)
        assert sys.modules["selective_scan_cuda"] is ours, sys.modules["selective_scan_cuda"]
        import selective_scan_cuda
        assert selective_scan_cuda is ours
        print(path)
    """, orig)
    assert r.returncode == 0, r.stderr
    assert os.path.realpath(so) in r.stdout


def test_compat_sides_name_both_files_or_refuse(tmp_path):
    # the side-by-side host scripts take both selective_scan_cuda modules from one helper: ours
    # only on this checkout's compiled extensions (where they are not built, it refuses and
    # names them), the original's compiled file by path, and a header line for every file
    orig, so = compiled_original(tmp_path)
    r = helper("""
        try:
            ours, original, lines = provenance.compat_scan_sides(sys.path[-1])
        except provenance.ProvenanceError as e:
            print("REFUSED", e)
        else:
            assert original is not ours and original.__file__ == lines[-1].split(": ", 1)[1]
            print("\\n".join(lines))
    """, orig)
    assert r.returncode == 0, r.stderr
    if r.stdout.startswith("REFUSED"):
        assert "ours: selective_scan._cuda does not import" in r.stdout, r.stdout
    else:
        compat = os.path.realpath(os.path.join(ROOT, "selective_scan_cuda.py"))
        assert r.stdout.splitlines()[0] == "ours: " + compat, r.stdout
        assert f"original: {so}" in r.stdout or f"original: {os.path.realpath(so)}" in r.stdout, r.stdout
