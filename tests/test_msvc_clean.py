"""scripts/check_msvc_clean.py: each MSVC rule flags what it should and nothing else; csrc/ is clean."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "check_msvc_clean.py"


def _load():
    spec = importlib.util.spec_from_file_location("check_msvc_clean", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["check_msvc_clean"] = mod  # dataclasses look the module up by name
    spec.loader.exec_module(mod)
    return mod


cmc = _load()


def rules(text: str) -> list:
    return [(f.rule, f.line) for f in cmc.check_source(text, "x.cu")]


@pytest.mark.parametrize("tok", ["and", "or", "not", "xor", "bitand", "not_eq", "or_eq"])
def test_alternative_tokens_flagged(tok):
    src = f"void f(bool a, bool b) {{\n  TORCH_CHECK(a {tok} b);\n}}\n"
    if tok == "not":
        src = "void f(bool a) {\n  TORCH_CHECK(not a);\n}\n"
    assert rules(src) == [("alt-token", 2)]


def test_alternative_tokens_ignored_in_comments_strings_and_identifiers():
    src = (
        "// a and b or not c\n"
        "/* and\n or */\n"
        'const char* s = "x and y or not z";\n'
        "#include <operator/and.h>\n"
        "int android = 0, order = 1, note = 2, xor_mask = 3;\n"
        "bool g(bool a, bool b) { return a && (b || !a); }\n"
    )
    assert rules(src) == []


def test_alternative_token_in_macro_definition_flagged():
    assert rules("#define BOTH(a, b) ((a) and (b))\n") == [("alt-token", 1)]


@pytest.mark.parametrize("const", ["M_PI", "M_LOG2E", "M_SQRT1_2", "M_LN2", "M_PIf", "M_2_SQRTPI"])
def test_math_constants_flagged(const):
    assert rules(f"float f(float x) {{\n  return x * {const};\n}}\n") == [("math-constant", 2)]


def test_math_like_names_not_flagged():
    src = "constexpr float kLog2e = 1.4426950408889634f;\nint M_PIXELS = 3; int NUM_PI = 1;\n// M_PI\n"
    assert rules(src) == []


def test_vla_with_parameter_bound_flagged():
    src = "void f(int n) {\n  float buf[n];\n  buf[0] = 1.f;\n}\n"
    assert rules(src) == [("vla", 2)]


def test_vla_with_runtime_local_bound_flagged():
    src = "void f(const float* x) {\n  int64_t len = x[0];\n  __shared__ float smem[len * 2];\n}\n"
    assert rules(src) == [("vla", 3)]


def test_product_in_an_expression_is_no_declaration():
    # `d * xm[k]` after an operator multiplies; the same words starting a statement declare
    src = "void f(int k, float d) {\n  float acc = 0;\n  acc += d * xm[k];\n  acc = d * xm[k];\n}\n"
    assert rules(src) == []
    assert rules("void f(int k) {\n  float * xm[k];\n}\n") == [("vla", 2)]


def test_constant_bounds_not_flagged():
    src = (
        "template <int kNThreads, int kWidth>\n"
        "__global__ void k(const float* x, int n) {\n"
        "  constexpr int kN = 4;\n"
        "  static constexpr int kM = 8;\n"
        "  const int c = 2;\n"
        "  enum { kE = 3 };\n"
        "  float a[kN]; float b[kM * kWidth]; float d[c]; float e[kE]; float g[16];\n"
        "  float h[Ktraits::kNItems]; float s[sizeof(float) * kNThreads];\n"
        "  extern __shared__ char smem[];\n"
        "  a[n % 4] = x[n];\n"
        "  return;\n"
        "}\n"
        "float get(const float* p, int i) { return p[i]; }\n"
    )
    assert rules(src) == []


def test_directive_inside_macro_arguments_flagged():
    src = (
        "void f(bool even) {\n"
        "  BOOL_SWITCH(even, kIsEven, [&] {\n"
        "#ifndef USE_ROCM\n"
        "    run<kIsEven>();\n"
        "#endif\n"
        "  });\n"
        "}\n"
    )
    assert rules(src) == [("directive-in-args", 3), ("directive-in-args", 5)]


def test_directives_outside_macro_arguments_not_flagged():
    src = (
        "#ifndef USE_ROCM\n"
        "#define ROCM_ONLY(x)\n"
        "#else\n"
        "#define ROCM_ONLY(x) x\n"
        "#endif\n"
        "#define SWITCH(c, ...) \\\n"
        "  [&] { if (c) { return __VA_ARGS__(); } }()\n"
        "void f(bool even) {\n"
        "  SWITCH(even, [&] { run(); });\n"
        "#if defined(X)\n"
        "  g(1);\n"
        "#endif\n"
        "}\n"
    )
    assert rules(src) == []


def test_plain_constexpr_in_switch_macro_lambda_flagged():
    src = (
        "#define BOOL_SWITCH(COND, CONST_NAME, ...) \\\n"
        "  [&] {                                    \\\n"
        "    if (COND) {                            \\\n"
        "      constexpr bool CONST_NAME = true;    \\\n"
        "      return __VA_ARGS__();                \\\n"
        "    } else {                               \\\n"
        "      static constexpr bool CONST_NAME = false; \\\n"
        "      return __VA_ARGS__();                \\\n"
        "    }                                      \\\n"
        "  }()\n"
    )
    assert rules(src) == [("lambda-constexpr", 4)]


def test_constexpr_in_plain_lambda_flagged_and_static_or_if_constexpr_not():
    src = (
        "void f() {\n"
        "  auto g = [&](int x) -> int {\n"
        "    constexpr int kA = 3;\n"
        "    static constexpr int kB = 4;\n"
        "    if constexpr (kB > 2) { return x; }\n"
        "    return kA;\n"
        "  };\n"
        "  constexpr int kOutside = 1;\n"
        "}\n"
    )
    assert rules(src) == [("lambda-constexpr", 3)]


def test_strip_keeps_positions():
    text = 'a /* b\nc */ "s\\"t" // d\n\'x\' R"(raw and\n)" 1\'000\n'
    out = cmc.strip_comments_and_strings(text)
    assert len(out) == len(text)
    assert out.count("\n") == text.count("\n")
    assert "and" not in out and "b" not in out and "1'000" in out


def test_cli_reports_and_fails_on_dirty_file(tmp_path):
    bad = tmp_path / "k.cu"
    bad.write_text("float f(bool a, bool b) { return (a and b) ? M_PI : 0.f; }\n")
    (tmp_path / "notes.txt").write_text("a and b\n")  # not a source file: ignored
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 1
    lines = r.stdout.strip().splitlines()
    assert lines == [f"{bad}:1:37: alt-token: alternative token 'and' (MSVC rejects it without "
                     "/permissive-); use the symbol",
                     f"{bad}:1:46: math-constant: 'M_PI' is not standard C++ (MSVC needs "
                     "_USE_MATH_DEFINES); define a literal constant"]


def test_cli_missing_path_is_an_error(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "nope")], capture_output=True, text=True)
    assert r.returncode == 2
    assert "does not exist" in r.stderr


def test_repository_sources_are_msvc_clean():
    r = subprocess.run([sys.executable, str(SCRIPT), str(ROOT / "csrc")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
