"""The stable-ABI binding against the classic one: kernel time and the time of the Python call.

Both bindings register the same ``torch.ops.mamba_kernels`` ops, so one process can hold only
one of them. ``measure`` times the build that is first on ``sys.path`` and writes JSON;
``compare`` reads two such files and prints a markdown table:

    PYTHONPATH=<stable build> python3 bench/compare_bindings.py measure --out stable.json
    PYTHONPATH=<classic build> python3 bench/compare_bindings.py measure --out classic.json
    python3 bench/compare_bindings.py compare stable.json classic.json

"kernel" is CUDA-graph replay (no host work), "call" is back-to-back Python calls timed on the
host clock (what the user waits for). Small shapes show the per-call host cost of a binding;
the large ones show that both drive the same kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable, Dict, List, Tuple

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _timing import gpu_description, safe, time_ms, utc_now, wall_ms  # noqa: E402
from provenance import ours_extension_lines  # noqa: E402

Case = Tuple[str, Callable[[], Callable[[int], None]]]


def _conv_cases() -> List[Case]:
    from causal_conv1d import causal_conv1d_fn, causal_conv1d_update

    def fwd(b: int, d: int, L: int, grad: bool) -> Callable[[], Callable[[int], None]]:
        def make() -> Callable[[int], None]:
            x = torch.randn(b, d, L, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
            w = torch.randn(d, 4, device="cuda", requires_grad=grad)
            bias = torch.randn(d, device="cuda", requires_grad=grad)
            g = torch.randn(b, d, L, device="cuda", dtype=torch.bfloat16)

            def call(i: int) -> None:
                y = causal_conv1d_fn(x, w, bias, activation="silu")
                if grad:
                    y.backward(g)
            return call
        return make

    def update(b: int, d: int) -> Callable[[], Callable[[int], None]]:
        def make() -> Callable[[int], None]:
            x = torch.randn(b, d, device="cuda", dtype=torch.bfloat16)
            state = torch.randn(b, d, 3, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(d, 4, device="cuda")
            return lambda i: causal_conv1d_update(x, state, w, None, "silu")
        return make

    return [
        ("conv fwd 1x64x128", fwd(1, 64, 128, False)),
        ("conv fwd 4x4096x4096", fwd(4, 4096, 4096, False)),
        ("conv fwd+bwd 1x64x128", fwd(1, 64, 128, True)),
        ("conv fwd+bwd 4x4096x4096", fwd(4, 4096, 4096, True)),
        ("conv update 1x64", update(1, 64)),
        ("conv update 64x4096", update(64, 4096)),
    ]


def _scan_cases() -> List[Case]:
    from selective_scan import selective_scan_fn, selective_state_update

    def scan(b: int, d: int, L: int, grad: bool) -> Callable[[], Callable[[int], None]]:
        def make() -> Callable[[int], None]:
            dt = torch.bfloat16

            def rn(*s, dtype=dt, scale=1.0):
                return (scale * torch.randn(*s, device="cuda", dtype=dtype)).requires_grad_(grad)

            u, delta = rn(b, d, L), rn(b, d, L, scale=0.5)
            A = (-torch.rand(d, 16, device="cuda") - 0.5).requires_grad_(grad)
            B, C = rn(b, 1, 16, L), rn(b, 1, 16, L)
            D = torch.randn(d, device="cuda", requires_grad=grad)
            z = rn(b, d, L)
            g = torch.randn(b, d, L, device="cuda", dtype=dt)

            def call(i: int) -> None:
                y = selective_scan_fn(u, delta, A, B, C, D, z, None, True)
                if grad:
                    y.backward(g)
            return call
        return make

    def decode(b: int, d: int) -> Callable[[], Callable[[int], None]]:
        def make() -> Callable[[int], None]:
            state = torch.randn(b, d, 16, device="cuda", dtype=torch.bfloat16)
            x, dt = torch.randn(b, d, device="cuda", dtype=torch.bfloat16), torch.rand(
                b, d, device="cuda", dtype=torch.bfloat16)
            A = -torch.rand(d, 16, device="cuda")
            B, C = torch.randn(b, 16, device="cuda", dtype=torch.bfloat16), torch.randn(
                b, 16, device="cuda", dtype=torch.bfloat16)
            D = torch.randn(d, device="cuda")
            return lambda i: selective_state_update(state, x, dt, A, B, C, D, dt_softplus=True)
        return make

    return [
        ("scan fwd 1x64x128", scan(1, 64, 128, False)),
        ("scan fwd 4x2048x2048", scan(4, 2048, 2048, False)),
        ("scan fwd+bwd 1x64x128", scan(1, 64, 128, True)),
        ("scan fwd+bwd 4x2048x2048", scan(4, 2048, 2048, True)),
        ("state update 1x64", decode(1, 64)),
        ("state update 64x4096", decode(64, 4096)),
    ]


def measure(out: str) -> int:
    os.environ.setdefault("MAMBA_KERNELS_BACKEND", "cuda")
    import causal_conv1d._cuda as conv_ext
    import selective_scan._cuda as scan_ext

    for line in ours_extension_lines(root=None):  # compiled files of our packages, or ProvenanceError
        print(f"provenance: {line}", flush=True)

    info = json.loads(conv_ext.BUILD_INFO)
    res: Dict[str, object] = {
        "binding": info.get("binding", "classic"),
        "build_info": {"causal_conv1d": info, "selective_scan": json.loads(scan_ext.BUILD_INFO)},
        "files": [conv_ext.__file__, scan_ext.__file__],
        "torch": torch.__version__,
        "gpu": gpu_description(),
        "date": utc_now(),
        "cases": {},
    }
    notes: List[str] = []
    for name, make in _conv_cases() + _scan_cases():
        fn, calls = make(), 300 if "1x64" in name else 30
        kernel = safe(lambda fn=fn: time_ms(fn, 1, graph=True, reps=20), notes, name)
        call = safe(lambda fn=fn, calls=calls: wall_ms(fn, 1, calls=calls), notes, name)
        res["cases"][name] = {"kernel_ms": kernel, "call_ms": call}
        print(f"{name}: kernel {kernel} ms, call {call} ms", flush=True)
        torch.cuda.empty_cache()
    res["notes"] = notes
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


def _us(v) -> str:
    return "-" if v is None else f"{1e3 * v:.1f}"


def compare(a_path: str, b_path: str) -> int:
    with open(a_path) as f:
        a = json.load(f)
    with open(b_path) as f:
        b = json.load(f)
    print(f"{a['date']}, {a['gpu']}, torch {a['torch']}; microseconds per call "
          f"(A = {a['binding']}, B = {b['binding']})\n")
    print("| case | kernel A | kernel B | A/B | call A | call B | call A - B |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, ra in a["cases"].items():
        rb = b["cases"].get(name, {})
        ka, kb, ca, cb = ra.get("kernel_ms"), rb.get("kernel_ms"), ra.get("call_ms"), rb.get("call_ms")
        kr = f"{ka / kb:.3f}" if ka and kb else "-"
        cd = f"{1e3 * (ca - cb):+.1f}" if ca is not None and cb is not None else "-"
        print(f"| {name} | {_us(ka)} | {_us(kb)} | {kr} | {_us(ca)} | {_us(cb)} | {cd} |")
    for r in (a, b):
        for n in r.get("notes", []):
            print(f"\n- {r['binding']}: {n}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", required=True)
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    args = ap.parse_args(argv)
    return measure(args.out) if args.cmd == "measure" else compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
