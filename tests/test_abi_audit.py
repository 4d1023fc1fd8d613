"""scripts/abi_audit.py on real shared objects built here with g++: a C++ torch symbol or a
shim function torch 2.10 does not export fails the audit; calls into torch 2.10's stable shim
pass."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
AUDIT = ROOT / "scripts" / "abi_audit.py"
pytestmark = pytest.mark.skipif(
    shutil.which("g++") is None or shutil.which("nm") is None, reason="needs g++ and nm"
)


def shared_object(tmp_path: Path, name: str, source: str) -> Path:
    src = tmp_path / f"{name}.cpp"
    src.write_text(source)
    out = tmp_path / f"{name}.so"
    subprocess.run(["g++", "-shared", "-fPIC", str(src), "-o", str(out)], check=True)
    return out


def audit(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(AUDIT), *map(str, paths)], capture_output=True, text=True)


STABLE_CALLS = """
#include <cstdint>
extern "C" int32_t aoti_torch_get_dim(void*, int64_t*);
extern "C" int32_t torch_call_dispatcher(const char*, const char*, void*, uint64_t);
extern "C" int32_t aoti_torch_get_current_cuda_stream(int32_t, void**);
int64_t mk_dim(void* t) { int64_t d = 0; aoti_torch_get_dim(t, &d); return d; }
int32_t mk_call(void* s) { return torch_call_dispatcher("aten::empty_like", "", s, 0); }
void* mk_stream() { void* s = nullptr; aoti_torch_get_current_cuda_stream(0, &s); return s; }
"""


def test_clean_binary_passes(tmp_path):
    result = audit(shared_object(tmp_path, "clean", STABLE_CALLS))
    assert result.returncode == 0, result.stdout
    assert "clean.so: OK (stable ABI of torch 2.10)" in result.stdout


@pytest.mark.parametrize(
    "name, source, symbol, why",
    [
        (
            "cxx_c10",  # what a c10/ATen header pulls in: a C++ function of libc10
            "namespace c10 { void mk_c10_function(); }\nvoid mk_bad() { c10::mk_c10_function(); }\n",
            "_ZN3c1015mk_c10_functionEv",
            "a C++ torch/ATen/c10 symbol",
        ),
        (
            "cxx_const_method",
            "namespace at { struct T { int dim() const; }; }\n"
            "int mk_bad(const at::T& t) { return t.dim(); }\n",
            "_ZNK2at1T3dimEv",
            "a C++ torch/ATen/c10 symbol",
        ),
        (
            "newer_shim",  # torch 2.14's shim function: what building without the target pulls in
            'extern "C" int torch_has_storage(void*, bool*);\n'
            "bool mk_bad(void* t) { bool b = false; torch_has_storage(t, &b); return b; }\n",
            "torch_has_storage",
            "not exported by torch 2.10",
        ),
    ],
)
def test_non_stable_symbol_fails(tmp_path, name, source, symbol, why):
    clean = shared_object(tmp_path, "clean", STABLE_CALLS)
    bad = shared_object(tmp_path, name, STABLE_CALLS + source)
    result = audit(clean, bad)
    assert result.returncode == 1, result.stdout
    assert f"{name}.so: {symbol}: {why}" in result.stdout
    assert f"{name}.so: FAILED" in result.stdout
    assert "clean.so: OK" in result.stdout


def test_export_list_is_torch_2_10s_stable_shim():
    sys.path.insert(0, str(AUDIT.parent))
    try:
        import abi_audit
    finally:
        sys.path.pop(0)
    names = abi_audit.exported()
    # the entry points the stable binding uses, all present in 2.10 ...
    for name in ("torch_call_dispatcher", "torch_library_impl", "aoti_torch_empty_strided",
                 "aoti_torch_get_current_cuda_stream", "aoti_torch_create_device_guard"):
        assert name in names
    # ... and later additions absent
    assert "torch_has_storage" not in names
    assert all(n.startswith(("aoti_torch_", "torch_")) for n in names)


def test_unreadable_file_is_its_own_exit_code(tmp_path):
    missing = tmp_path / "nothing.so"
    result = audit(missing)
    assert result.returncode == 2 and "cannot read its symbols" in result.stdout


def test_load_check_knows_every_op_the_python_side_fakes():
    # scripts/stable_load_check.py reads the op names from the bindings' schema tables; they must
    # be exactly the ops the packages register fake implementations for
    sys.path.insert(0, str(ROOT / "scripts"))
    import stable_load_check

    faked = []
    for py in ("causal_conv1d/_ops.py", "selective_scan/_ops.py", "selective_scan/_update_ops.py",
               "selective_scan/_norm_ops.py", "selective_scan/_ssd_ops.py"):
        faked += re.findall(r'register_fake\("(\w+)"\)', (ROOT / py).read_text())
    assert len(faked) == 11  # the SSD forward and backward among them
    assert sorted(stable_load_check.defined_ops()) == sorted(faked)
