#!/usr/bin/env python3
"""Check that the C++/CUDA sources stay compilable by MSVC (docs/COMPAT.md §7.1).

Rules, each one a construct GCC and Clang accept but MSVC (the host compiler of every
Windows wheel) rejects or miscompiles:

  alt-token        alternative operator tokens (``and``, ``or``, ``not``, ...): MSVC only knows
                   them with /permissive- or <ciso646>.
  math-constant    ``M_PI``, ``M_LOG2E``, ...: not standard; MSVC defines them only with
                   _USE_MATH_DEFINES. Write a literal constant instead.
  vla              an array whose bound is a run-time variable of the same file: a GCC extension.
  directive-in-args  a preprocessor directive inside a macro's argument list (for example an
                   ``#ifndef USE_ROCM`` inside a ``BOOL_SWITCH(...)`` lambda): undefined behaviour,
                   rejected by MSVC.
  lambda-constexpr  a plain ``constexpr`` local inside a lambda (the dispatch-switch pattern):
                   MSVC loses its constexpr-ness when a nested lambda uses it as a template
                   argument; declare it ``static constexpr``.

Usage: ``python scripts/check_msvc_clean.py [PATH ...]`` (default: csrc/ next to this script).
Prints ``path:line:col: rule: message`` per finding; exit 0 only when there are none.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Set

SOURCE_SUFFIXES = (".cu", ".cuh", ".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp", ".hxx", ".inl")

ALT_TOKENS = ("and", "and_eq", "bitand", "bitor", "compl", "not", "not_eq", "or", "or_eq", "xor", "xor_eq")
_ALT_RE = re.compile(r"\b(" + "|".join(ALT_TOKENS) + r")\b")

# The <math.h> extension constants (POSIX / glibc / BSD), with the glibc float/long double suffixes.
_MATH_RE = re.compile(
    r"\bM_(?:E|LOG2E|LOG10E|LN2|LN10|PI|PI_2|PI_4|1_PI|2_PI|2_SQRTPI|SQRT2|SQRT1_2|SQRT3|LNPI|EULER|"
    r"TWOPI|SQRTPI|LOG2_E)(?:f|l|f16|f32|f64|f128)?\b"
)

# Scalar types whose non-const declarations make an identifier a run-time value.
_INT_TYPES = (
    r"(?:unsigned\s+|signed\s+)?(?:int|long\s+long|long|short|char|size_t|ssize_t|ptrdiff_t|"
    r"u?int(?:8|16|32|64)_t|index_t|auto)"
)
_DECL_RE = re.compile(r"(?<![\w:])((?:\w+\s+)*?)" + _INT_TYPES + r"\s*[&*]?\s*(\w+)\s*(?=[=;,)\[{])")
# A declaration ``T name[bound]`` (the bound without nested brackets), then ; = , { or another [.
_ARRAY_RE = re.compile(r"(?<!\w)(\w+|>)\s*[*&\s]\s*(\w+)\s*\[([^\[\]]+)\]\s*(?=[;=,{\[])")
# Words that can precede ``name[...]`` in an expression statement, so ``name[...]`` is no declaration.
_NOT_TYPES = {"return", "else", "case", "throw", "delete", "new", "goto", "co_return", "co_yield", "do",
              "sizeof", "typeid", "decltype", "alignof", "and", "or", "not"}
_CONST_WORDS = {"const", "constexpr", "static", "consteval"}
_EXPRESSION_ENDS = set("=+-*/%^|&?:!~")  # a character that leaves an expression open
_LAMBDA_RE = re.compile(r"\[[\w\s&=,*]*\]\s*(?:\([^()]*\))?\s*(?:mutable\s*)?"
                        r"(?:->\s*[\w:<>]+\s*)?\{")
_CONSTEXPR_DECL_RE = re.compile(
    r"(?<![\w])((?:static|inline|const)\s+)*constexpr\s+(?!\()[\w:<>]+\s+\w+\s*[=({]"
)


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    col: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.rule}: {self.message}"


def strip_comments_and_strings(text: str) -> str:
    """Blank out comments and string/char literals, keeping every newline and column in place."""
    out: List[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c == "/" and nxt == "*":
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c == "R" and nxt == '"' and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^()\\\s]{0,16})\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i + m.end())
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append('R"' + "".join(ch if ch == "\n" else " " for ch in text[i + 2 : j - 1]) + '"')
            i = j
        elif c in "\"'":
            # A digit separator (1'000'000) is not a character literal.
            if c == "'" and i > 0 and text[i - 1].isalnum() and nxt.isalnum():
                out.append(c)
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * max(0, j - i - 2) + (c if j - i >= 2 else ""))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _line_col(text: str, pos: int) -> tuple[int, int]:
    line = text.count("\n", 0, pos) + 1
    col = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return line, col


def _directive_spans(code: str) -> List[tuple[int, int]]:
    """(start, end) of every preprocessor directive, continuation lines included."""
    spans = []
    for m in re.finditer(r"^[ \t]*#", code, flags=re.M):
        end = m.start()
        while True:
            nl = code.find("\n", end)
            if nl < 0:
                end = len(code)
                break
            if code[nl - 1] == "\\":
                end = nl + 1
                continue
            end = nl
            break
        spans.append((m.start(), end))
    return spans


def _check_alt_tokens(path: str, code: str, spans: List[tuple[int, int]]) -> Iterable[Finding]:
    skip = [(a, b) for a, b in spans if re.match(r"[ \t]*#\s*(include|pragma|error|warning)\b", code[a:b])]
    for m in _ALT_RE.finditer(code):
        if any(a <= m.start() < b for a, b in skip):
            continue
        # A member or qualified name (x.not, ns::or) is an identifier, not an operator; C++ forbids it anyway.
        line, col = _line_col(code, m.start())
        word = m.group(1)
        yield Finding(path, line, col, "alt-token",
                      f"alternative token '{word}' (MSVC rejects it without /permissive-); use the symbol")


def _check_math_constants(path: str, code: str) -> Iterable[Finding]:
    for m in _MATH_RE.finditer(code):
        line, col = _line_col(code, m.start())
        yield Finding(path, line, col, "math-constant",
                      f"'{m.group(0)}' is not standard C++ (MSVC needs _USE_MATH_DEFINES); "
                      "define a literal constant")


def _runtime_names(code: str) -> Set[str]:
    """Identifiers declared in this file as non-constant integer variables or parameters."""
    names: Set[str] = set()
    const_names: Set[str] = set()
    for m in _DECL_RE.finditer(code):
        qualifiers = set(m.group(1).split())
        name = m.group(2)
        # Template parameters (template <int kN>) are compile-time constants.
        before = code[max(0, m.start() - 200) : m.start()]
        in_template = re.search(r"template\s*<[^<>;{}]*$", before) is not None
        if qualifiers & _CONST_WORDS or in_template:
            const_names.add(name)
        else:
            names.add(name)
    for m in re.finditer(r"\benum\b[^{;]*\{([^}]*)\}", code):
        const_names.update(re.findall(r"\b([A-Za-z_]\w*)\s*(?:=|,|$)", m.group(1)))
    return names - const_names


def _check_vlas(path: str, code: str, spans: List[tuple[int, int]]) -> Iterable[Finding]:
    runtime = _runtime_names(code)
    for m in _ARRAY_RE.finditer(code):
        if m.group(1) in _NOT_TYPES or any(a <= m.start() < b for a, b in spans):
            continue
        # `acc += d * x[k];` is a product in an expression, not a declaration of x: an operator
        # right before the "type" word (a declaration starts a statement)
        before = code[: m.start()].rstrip()
        if before and before[-1] in _EXPRESSION_ENDS:
            continue
        name, bound = m.group(2), m.group(3)
        # Identifiers of the bound, not members (a.n, p->n) nor qualified static members (T::kN).
        words = set(re.findall(r"(?<![\w.:>])([A-Za-z_]\w*)\b(?!\s*::)", bound))
        bad = sorted(w for w in words if w in runtime)
        if bad:
            line, col = _line_col(code, m.start(2))
            yield Finding(path, line, col, "vla",
                          f"array '{name}' has run-time bound '{bound.strip()}' ({', '.join(bad)} "
                          "is a variable): a variable-length array, which MSVC rejects")


def _check_directives_in_args(path: str, code: str, spans: List[tuple[int, int]]) -> Iterable[Finding]:
    # One entry per open parenthesis: the ALL_CAPS name before it, if any (a macro by convention).
    stack: List[Optional[str]] = []
    starts: Dict[int, int] = {a: b for a, b in spans}
    i, n = 0, len(code)
    while i < n:
        if i in starts:
            macros = [s for s in stack if s]
            if macros:
                line, col = _line_col(code, i)
                directive = code[i : starts[i]].strip().split("\\")[0].strip()
                yield Finding(path, line, col, "directive-in-args",
                              f"'{directive}' inside the arguments of macro {macros[-1]}(...); MSVC "
                              "rejects directives in macro arguments: move the #if out of the call or "
                              "use a macro such as ROCM_ONLY(x)")
            i = starts[i]
            continue
        c = code[i]
        if c == "(":
            m = re.search(r"(\w+)\s*$", code[max(0, i - 80) : i])
            word = m.group(1) if m else ""
            stack.append(word if len(word) > 1 and re.fullmatch(r"[A-Z][A-Z0-9_]*", word) else None)
        elif c == ")" and stack:
            stack.pop()
        i += 1


def _matching_brace(code: str, open_pos: int) -> int:
    depth = 0
    for j in range(open_pos, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(code)


def _check_lambda_constexpr(path: str, code: str) -> Iterable[Finding]:
    seen: Set[int] = set()
    for lam in _LAMBDA_RE.finditer(code):
        # Skip array subscripts (a[i] {..} cannot occur) and attribute lists [[...]].
        if code[max(0, lam.start() - 1)] == "[" or code[lam.start() : lam.start() + 2] == "[[":
            continue
        brace = lam.end() - 1
        body = code[brace : _matching_brace(code, brace) + 1]
        for m in _CONSTEXPR_DECL_RE.finditer(body):
            pos = brace + m.start()
            if pos in seen or "static" in (m.group(0).split("constexpr")[0]).split():
                continue
            seen.add(pos)
            line, col = _line_col(code, pos)
            yield Finding(path, line, col, "lambda-constexpr",
                          "plain 'constexpr' local inside a lambda; MSVC drops its constexpr-ness in "
                          "nested lambdas and template arguments: declare it 'static constexpr'")


def check_source(text: str, path: str = "<string>") -> List[Finding]:
    """All findings for one source file's text, sorted by position."""
    code = strip_comments_and_strings(text)
    spans = _directive_spans(code)
    findings: List[Finding] = []
    findings += _check_alt_tokens(path, code, spans)
    findings += _check_math_constants(path, code)
    findings += _check_vlas(path, code, spans)
    findings += _check_directives_in_args(path, code, spans)
    findings += _check_lambda_constexpr(path, code)
    return sorted(findings, key=lambda f: (f.line, f.col, f.rule))


def iter_sources(paths: Iterable[Path]) -> Iterable[Path]:
    for p in paths:
        if p.is_dir():
            yield from sorted(q for q in p.rglob("*") if q.is_file() and q.suffix in SOURCE_SUFFIXES)
        elif p.is_file():
            yield p
        else:
            raise FileNotFoundError(f"path {str(p)!r} does not exist")


def check_paths(paths: Iterable[Path]) -> List[Finding]:
    findings: List[Finding] = []
    for src in iter_sources(paths):
        findings += check_source(src.read_text(encoding="utf-8", errors="replace"), str(src))
    return findings


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    paths = [Path(a) for a in args] or [Path(__file__).resolve().parent.parent / "csrc"]
    try:
        findings = check_paths(paths)
    except FileNotFoundError as e:
        print(f"check_msvc_clean: error: {e}", file=sys.stderr)
        return 2
    for f in findings:
        print(f)
    n = sum(1 for _ in iter_sources(paths))
    print(f"check_msvc_clean: {n} file(s), {len(findings)} finding(s)", file=sys.stderr)
    return 1 if findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
