"""scripts/sanitize.sh and its case list (scripts/sanitize_cases.py).

On CPU: every place in csrc where a launcher picks a kernel (each launch, each states-per-lane,
pass-group and cluster-size branch, each decode launch mode) is claimed by a kind of the case
list, every kind is reached by a case, each case's kinds are the ones the launchers' rules give
for its shape (restated in sanitize_cases.predict, whose constants are read back from the
policy headers here), the cases' inputs are valid (a dry run through the PyTorch reference
functions), and `--list` runs without a GPU. A new kernel kind without a case, or a retuned
threshold that moves a case to another kind, fails here.

On a GPU (marker ``sanitize``, only when selected with ``-m sanitize``: about ten minutes on an
H200): the whole script, whose first step checks with torch.profiler that each case launched
the kernels of its kinds.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import header_values as hv
import pytest

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"
SCRIPT = ROOT / "scripts" / "sanitize.sh"


def _load():
    spec = importlib.util.spec_from_file_location("sanitize_cases", ROOT / "scripts" / "sanitize_cases.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["sanitize_cases"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


sc = _load()


def dispatch_sites() -> set:
    """Every choice of kernel the launchers make, read from the CUDA sources."""
    sites = set()
    for path in sorted(CSRC.rglob("*.cu")):
        rel = path.relative_to(CSRC).as_posix()
        text = hv.code(path)
        n_var = 0
        for m in re.finditer(r"\b(\w+)\s*(<(?:[^<>;]|<[^<>;]*>)*>)?\s*<<<", text):
            if m.group(1) == "kernel":  # a variable: the launch's place in the file names it
                n_var += 1
                sites.add(f"{rel}:kernel#{n_var}")
            else:
                sites.add(f"{rel}:{m.group(1)}{' '.join((m.group(2) or '').split())}")
        for i, _ in enumerate(re.finditer(r"\bcudaLaunchKernelEx\s*\(", text), 1):
            sites.add(f"{rel}:cudaLaunchKernelEx#{i}")
        for m in re.finditer(r"(case\s+(\d+)|default)\s*:\s*return\s+launch_lanes<T,\s*(\d+)", text):
            assert m.group(2) in (None, m.group(3)), m.group(0)
            sites.add(f"lanes:{m.group(3)}")
        for m in re.finditer(r"by_states\(std::(true|false)_type\{\}\)", text):
            sites.add(f"lanes_var:{m.group(1)}")
        for m in re.finditer(r"\blaunch_lean_as<S,\s*T,\s*(\d+)>\s*\(", text):
            sites.add(f"launch_lean_as:{m.group(1)}")
        for m in re.finditer(r"\blaunch_kernel<S,\s*(\w+)>\s*\(", text):
            sites.add(f"launch_kernel:{m.group(1)}")
        for m in re.finditer(r"for\s*\(int cs = (\d+); cs >= (\d+)[^;]*; cs /= 2\)", text):
            cs = int(m.group(1))
            while cs >= int(m.group(2)):
                sites.add(f"cluster:{cs}")
                cs //= 2
    # the decode step's launch modes: an enum its launcher and general kernel share, in a header
    for path in sorted(CSRC.rglob("*.cu*")):
        m = re.search(r"enum\s+Mode\s*:\s*int\s*\{([^}]*)\}", hv.code(path))
        if m:
            for name in re.findall(r"\bk(\w+)\s*=", m.group(1)):
                sites.add(f"mode:{name.lower()}")
    return sites


def test_the_sources_have_dispatch_sites():
    # the parser itself: the launches and branches it must see today
    sites = dispatch_sites()
    for want in ("lanes:1", "lanes:2", "lanes:4", "cluster:16", "cluster:8", "mode:one", "mode:pair",
                 "mode:wide", "launch_lean_as:4", "launch_kernel:AnyDtype",
                 "selective_scan/bwd_lanes.cu:cudaLaunchKernelEx#1", "selective_scan/fwd.cu:kernel#2",
                 "causal_conv1d/update.cu:update_shift_kernel<T, W, W - 1>"):
        assert want in sites, f"{want} not found in csrc: {sorted(sites)}"
    assert len([s for s in sites if ".cu:" in s]) >= 25


def test_every_dispatch_site_is_claimed_by_a_kind():
    sites = dispatch_sites()
    claimed = {s for k in sc.KINDS.values() for s in k.sites}
    unclaimed = sorted(sites - claimed)
    stale = sorted(claimed - sites)
    assert not unclaimed, (
        f"kernel choices in csrc that no kind of scripts/sanitize_cases.py covers: {unclaimed}; add a Kind "
        "(and a Case that reaches it)")
    assert not stale, f"kinds claim dispatch sites csrc no longer has: {stale}"


def test_every_kind_is_reached_by_a_case():
    reached = {k for c in sc.CASES for k in c.kinds}
    assert set(sc.KINDS) - reached == set(), "kinds without a case"
    assert reached - set(sc.KINDS) == set(), "cases name unknown kinds"
    for c in sc.CASES:
        assert all(sc.KINDS[k].family == c.family for k in c.kinds), c.name
    assert len({c.name for c in sc.CASES}) == len(sc.CASES), "case names repeat"
    assert {c.family for c in sc.CASES} == set(sc.FAMILIES)


@pytest.mark.parametrize("case", sc.CASES, ids=lambda c: c.name)
def test_each_case_reaches_the_kinds_it_claims(case):
    # the launchers' rules at 132 SMs (an H100 / H200), restated in sanitize_cases.predict
    assert sorted(sc.predict(case)) == sorted(case.kinds)


def test_policy_constants_are_the_sources():
    pol = hv.SCAN_POLICY
    lane, fwd_lanes = hv.body(pol, "LanePolicy"), hv.body(pol, "FwdLanesPolicy")
    fwd, bwd_lanes = hv.body(pol, "FwdPolicy"), hv.body(pol, "BwdLanesPolicy")
    upd = hv.body(pol, "UpdatePolicy")
    header = hv.code(CSRC / "selective_scan" / "selective_scan.h")
    conv_bwd = hv.body(CSRC / "causal_conv1d" / "conv_common.cuh", "BwdPolicy")
    want = {
        "kLanes": hv.const(lane, "kLanes"),
        "kMinFwdWarpsPerSm": hv.const(lane, "kMinFwdWarpsPerSm"),
        "kLaneThreads": hv.const(lane, "kThreads"),
        "kFwdLanesThreads": hv.const(fwd_lanes, "kThreads"),
        "kFwdThreads": hv.const(fwd, "kThreads"),
        "kSliceFloats": hv.const(fwd, "kSliceFloats"),
        "kMinWarpsPerSm": hv.const(fwd, "kMinWarpsPerSm"),
        "kTargetWarpsPerSm": hv.const(fwd, "kTargetWarpsPerSm"),
        "kMinSegment": hv.const(fwd, "kMinSegment"),
        "kMaxStateShift": hv.const(bwd_lanes, "kMaxStateShift"),
        "kPairMinThreadsPerSm": hv.const(upd, "kPairMinThreadsPerSm"),
        "kMaxLanes": hv.const(upd, "kMaxLanes"),
        "kLeanFullRowsPerSm": hv.const(upd, "kLeanFullRowsPerSm"),
        "kLeanQuadMaxRowsPerSm": hv.const(upd, "kLeanQuadMaxRowsPerSm"),
        "kRowMaxRowsPerSm": hv.const(upd, "kRowMaxRowsPerSm"),
        "kChunk": hv.const(header, "kChunk"),
        "kBwdCarry": hv.const(header, "kBwdCarry"),
        "kMaxGridYZ": hv.const(hv.code(CSRC / "selective_scan" / "update.cu"), "kMaxGridYZ"),
        "kVecCL": hv.const(conv_bwd, "kVecCL"),
        "kVecCLLean": hv.const(conv_bwd, "kVecCLLean"),
        "kSsdPassVec": hv.value(CSRC / "ssd" / "ssd_policy.cuh", "kVec", "SsdPassPolicy"),
        "kSsdDbcBlocksPerSm": hv.value(CSRC / "ssd" / "ssd_policy.cuh", "kBlocksPerSm", "SsdDbcPolicy"),
    }
    m = re.search(r"kMinBlocks\s*=\s*fit_blocks_per_sm\(kThreads,\s*kS == 1 \? (\d+) : (\d+)\)", fwd_lanes)
    assert m, "FwdLanesPolicy::kMinBlocks changed form"
    want["kFwdLanesMinBlocks1"] = int(m.group(1))
    m = re.search(r"kBlocksPerSm\s*=\s*fit_blocks_per_sm\(LanePolicy::kThreads,\s*(\d+)\)", bwd_lanes)
    assert m, "BwdLanesPolicy::kBlocksPerSm changed form"
    want["kBwdBlocksPerSm"] = int(m.group(1))
    # fit_blocks_per_sm lowers neither on sm_90 (1536 threads an SM)
    assert want["kFwdLanesMinBlocks1"] * want["kFwdLanesThreads"] <= 1536
    assert want["kBwdBlocksPerSm"] * want["kLaneThreads"] <= 1536
    assert sc.POLICY == want
    # the cluster capacities predict() assumes are the H100 probe's, as docs/SCAN.md records them
    m = re.search(r"held (\d+) clusters of 16 \(\d+ blocks\) and (\d+) of 8",
                  (ROOT / "docs" / "SCAN.md").read_text())
    assert m and sc.CLUSTER_CAPACITY == {16: int(m.group(1)), 8: int(m.group(2))}


def test_predict_follows_the_thresholds():
    # the restated rules move with their constants (not fixed answers)
    case = next(c for c in sc.CASES if c.name == "scan_fwd_s2")
    assert sc.predict(case) == ["scan_fwd_lanes_s2"]
    saved = dict(sc.POLICY)
    try:
        sc.POLICY["kMinFwdWarpsPerSm"] = 5  # fewer warps wanted: 4 states per lane suffice
        assert sc.predict(case) == ["scan_fwd_lanes_s4"]
    finally:
        sc.POLICY.clear()
        sc.POLICY.update(saved)
    dec = next(c for c in sc.CASES if c.name == "decode_lean_p4")
    assert sc.predict(dec) == ["decode_lean_p4"]
    smaller = sc.Case("x", "decode", (), dict(dec.params, dim=dec.params["dim"] - 1))
    assert sc.predict(smaller) == ["decode_lean_p1"]  # one row under kLeanFullRowsPerSm x SMS


def test_our_kernels_are_in_namespace_mamba_kernels():
    # the sanitizer's kernel filter (kns=mamba_kernels) selects kernels by that substring
    for path in sorted(CSRC.rglob("*.cu*")):
        text = hv.code(path)
        first = text.find("__global__")
        if first >= 0:
            ns = text.find("namespace mamba_kernels {")
            assert 0 <= ns < first, f"{path}: a __global__ kernel outside namespace mamba_kernels"
    for tool in sc.TOOLS:
        args = sc.sanitizer_args(tool)
        assert args[:2] == ["--tool", tool] and "--error-exitcode" in args
        assert ("--kernel-name" in args) == (tool != "initcheck")
    # an option the installed compute-sanitizer does not list is left out
    assert "--kernel-name" not in sc.sanitizer_args("memcheck", help_text="--tool --print-limit")


def test_kind_patterns_tell_instantiations_apart():
    # verify (on the GPU) matches these on the profiler's demangled names
    ns = "void mamba_kernels::causal_conv1d::(anonymous namespace)::"
    wm1, w = ns + "update_shift_kernel<float, 4, 3>(P)", ns + "update_shift_kernel<__half, 3, 3>(P)"
    k = sc.KINDS
    assert re.search(k["conv_update_shift_wm1"].kernel,
                     wm1) and not re.search(k["conv_update_shift_w"].kernel, wm1)
    assert re.search(k["conv_update_shift_w"].kernel, w) and not re.search(k["conv_update_shift_wm1"].kernel,
                                                                           w)
    assert not re.search(k["conv_update_general"].kernel, ns + "state_update_kernel<float, float>(P)")
    ss = "void mamba_kernels::selective_scan::decode::(anonymous namespace)::"
    any_dtype = "mamba_kernels::selective_scan::decode::AnyDtype"
    generic = ss + f"state_update_kernel<float, {any_dtype}>(P)"
    typed = ss + "state_update_kernel<float, __nv_bfloat16>(P)"
    assert re.search(k["decode_generic_one"].kernel, generic) and not re.search(k["decode_typed_one"].kernel,
                                                                                generic)
    assert re.search(k["decode_typed_one"].kernel, typed) and not re.search(k["decode_generic_one"].kernel,
                                                                            typed)
    lanes = ss + "fwd_lanes_kernel<__nv_bfloat16, 4, true>(P, A)"
    assert [n for n in k if re.search(k[n].kernel, lanes)] == ["scan_fwd_lanes_s4"]
    assert not re.search(k["scan_fwd_classic_real"].kernel, ss + "bwd_kernel<float, false>(P)")
    sd = "void mamba_kernels::ssd::(anonymous namespace)::"
    for kernel in ("chunk_state_kernel", "chunk_scan_kernel", "varlen_state_kernel", "chunk_cb_kernel"):
        names = {t: sd + f"{kernel}<{t}>(mamba_kernels::ssd::SsdFwdParams)"
                 for t in ("float", "__half", "__nv_bfloat16")}
        part = {"chunk_state_kernel": "state", "chunk_scan_kernel": "scan",
                "varlen_state_kernel": "varlen", "chunk_cb_kernel": "cb"}[kernel]
        assert [t for t in names if re.search(k[f"ssd_fwd_{part}_f32"].kernel, names[t])] == ["float"]
        assert [t for t in names if re.search(k[f"ssd_fwd_{part}_16bit"].kernel, names[t])] == [
            "__half", "__nv_bfloat16"]
    vec = hv.value(CSRC / "ssd" / "ssd_policy.cuh", "kVec", "SsdPassPolicy")
    for w in (vec, 1):
        name = sd + f"state_pass_kernel<{w}>(mamba_kernels::ssd::SsdFwdParams)"
        kind = "vec" if w > 1 else "1"
        assert re.search(k[f"ssd_fwd_pass_{kind}"].kernel, name)
        assert not re.search(k[f"ssd_fwd_pass_{'1' if w > 1 else 'vec'}"].kernel, name)
    for kernel in ("gate_bwd_kernel", "chunk_dstate_kernel", "chunk_dcb_kernel", "chunk_dx_kernel",
                   "chunk_dbc_kernel", "chunk_ddt_kernel"):
        names = {t: sd + f"{kernel}<{t}>(mamba_kernels::ssd::SsdBwdParams)"
                 for t in ("float", "__half", "__nv_bfloat16")}
        part = kernel.replace("chunk_", "").replace("_kernel", "").replace("_bwd", "")
        assert [t for t in names if re.search(k[f"ssd_bwd_{part}_f32"].kernel, names[t])] == ["float"]
        assert [t for t in names if re.search(k[f"ssd_bwd_{part}_16bit"].kernel, names[t])] == [
            "__half", "__nv_bfloat16"]
        assert not any(re.search(k[f"ssd_fwd_{q}_f32"].kernel, names["float"])
                       for q in ("cb", "state", "scan"))
    for w, kind in ((vec, "vec"), (1, "1")):
        pass_bwd = sd + f"state_pass_bwd_kernel<{w}>(mamba_kernels::ssd::SsdBwdParams)"
        assert re.search(k[f"ssd_bwd_pass_{kind}"].kernel, pass_bwd)
        assert not any(re.search(k[f"ssd_fwd_pass_{q}"].kernel, pass_bwd) for q in ("vec", "1"))
    assert re.search(k["ssd_bwd_sum"].kernel, sd + "param_sum_kernel(mamba_kernels::ssd::SsdBwdParams)")


def test_parse_counts():
    assert sc.parse_counts("case a ran\n========= ERROR SUMMARY: 0 errors\n") == (0, 0, 0)
    assert sc.parse_counts("Fatal Python error: Aborted\n") == (-1, 0, 0)
    race = "========= RACECHECK SUMMARY: 3 hazards displayed (1 error, 2 warnings)\n"
    assert sc.parse_counts(race) == (1, 0, 2)
    two = (
        "========= Uninitialized __global__ memory read of size 4 bytes\n"
        "=========     at void at::native::vectorized_elementwise_kernel<4>(int)+0x1a0\n"
        "========= Invalid __global__ read of size 16 bytes\n"
        "=========     at void mamba_kernels::selective_scan::fwd_kernel<float, false>(P)+0x40 in f.cu:1\n"
        "========= ERROR SUMMARY: 2 errors\n"
    )
    assert sc.parse_counts(two) == (1, 1, 0)


def _reference_ops():
    """Stand-ins for the compiled ops that run the PyTorch reference functions on CPU tensors
    (their argument checks) and record each call."""
    import torch

    from causal_conv1d import causal_conv1d_fn, causal_conv1d_update
    from selective_scan import layernorm_gated, selective_scan_fn
    from selective_scan.selective_state_update import selective_state_update

    calls = []

    class Conv:
        @staticmethod
        def fwd(x, w, b, seq_idx, init, fs, silu):
            calls.append("conv.fwd")
            act = "silu" if silu else None
            if fs is not None:
                out, final = causal_conv1d_fn(x, w, b, seq_idx, init, True, None, act)
                assert final.shape == fs.shape
                return out
            return causal_conv1d_fn(x, w, b, seq_idx, init, False, None, act)

        @staticmethod
        def bwd(x, w, b, dout, seq_idx, init, dfs, dx, want_dinit, silu):
            calls.append("conv.bwd")
            assert dout.shape == x.shape and (dfs is None or dfs.shape == (x.shape[0], x.shape[1],
                                                                           w.shape[1] - 1))
            assert want_dinit == (init is not None)
            Conv.fwd(x, w, b, seq_idx, init, None, silu)

        @staticmethod
        def update(x, state, w, b, silu, cache, idx):
            calls.append("conv.update")
            return causal_conv1d_update(x, state, w, b, "silu" if silu else None, cache, idx)

    class Scan:
        @staticmethod
        def fwd(u, delta, A, B, C, D, z, bias, softplus, keep_y, steps, count, pairs):
            calls.append("scan.fwd")
            out = selective_scan_fn(u, delta, A, B, C, D, z, bias, delta_softplus=softplus)
            nf = A.shape[1] * (2 if A.is_complex() else 1)
            n = -(-u.shape[2] // steps) if count == -1 else count
            assert n in (-(-u.shape[2] // steps), -(-u.shape[2] // steps) + 1) and (not pairs or n % 2 == 0)
            shape = (u.shape[0], u.shape[1], n // 2, 2 * nf) if pairs else (u.shape[0], u.shape[1], n, nf)
            return out, out, torch.zeros(shape)

        @staticmethod
        def bwd(u, delta, A, B, C, D, z, bias, dout, ckpt, y, dz, out_z, softplus, steps, pairs):
            calls.append("scan.bwd")
            assert dout.shape == u.shape and y.shape == u.shape
            assert (dz.shape == u.shape) == (z is not None) and (out_z.shape == u.shape) == (z is not None)

    class Update:
        @staticmethod
        def update(state, x, dt, A, B, C, D, z, dt_bias, softplus, idx):
            calls.append("decode")
            return selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, softplus, idx)

    class Norm:
        @staticmethod
        def fwd(x, w, b, z, out, mean, rstd, eps, gs, nbg, rms):
            calls.append("norm.fwd")
            _, m, r = layernorm_gated._layer_norm_fwd(x, w, b, eps, z=z, out=out, group_size=gs,
                                                      norm_before_gate=nbg, is_rms_norm=rms)
            assert (mean is None) == rms and r.shape == rstd.shape
            rstd.copy_(r)
            if mean is not None:
                mean.copy_(m)

        @staticmethod
        def bwd(dy, x, w, b, z, mean, rstd, dx, dz, out, dw, db, eps, gs, nbg, rms):
            calls.append("norm.bwd")
            assert dx.shape == x.shape and (dz is None) == (z is None) and (db is None) == (b is None)
            assert dw.dtype == w.dtype and (db is None or db.dtype == b.dtype)
            layernorm_gated._layer_norm_bwd(dy, x, w, b, eps, mean, rstd, z, gs, nbg, rms,
                                            recompute_output=out is not None, dz=dz, out=out)

    class Ssd:
        @staticmethod
        def ssd_forward_cuda(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                             seq_idx=None, dt_softplus=False, dt_limit=(0.0, float("inf")), cu_seqlens=None):
            # the op's preconditions (csrc/ssd/ssd_host.cpp), and its outputs' shapes
            from selective_scan._ssd_meta import ssd_fwd_fake

            calls.append("ssd.fwd")
            batch, seqlen, nheads, headdim = x.shape
            assert dt.shape == (batch, seqlen, nheads) and A.shape == (nheads,)
            assert B.shape == C.shape and B.shape[:2] == (batch, seqlen) and nheads % B.shape[2] == 0
            assert B.dtype == C.dtype == x.dtype
            assert z is None or (z.shape == x.shape and z.dtype == x.dtype)
            assert D is None or D.shape in ((nheads,), (nheads, headdim))
            assert dt_bias is None or dt_bias.shape == (nheads,)
            assert initial_states is None or initial_states.shape == (batch, nheads, headdim, B.shape[3])
            if seq_idx is not None:
                assert seq_idx.dtype == torch.int32 and seq_idx.shape == (batch, seqlen)
                assert bool((seq_idx[:, 1:] >= seq_idx[:, :-1]).all()), "seq_idx must be nondecreasing"
            assert 1 <= chunk_size <= 256
            if cu_seqlens is not None:
                assert batch == 1 and cu_seqlens.dtype in (torch.int32, torch.int64) and cu_seqlens.dim() == 1
                assert int(cu_seqlens[0]) == 0 and int(cu_seqlens[-1]) == seqlen
                assert bool((cu_seqlens.diff() >= 0).all())
                ids = torch.repeat_interleave(torch.arange(len(cu_seqlens) - 1), cu_seqlens.diff().cpu())
                assert seq_idx is not None and torch.equal(seq_idx[0].cpu().long(), ids)
            return ssd_fwd_fake(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
                                cu_seqlens, dt_softplus, *dt_limit)

        @staticmethod
        def ssd_backward_cuda(dout, x, dt, A, B, C, out, chunk_size, D=None, z=None, dt_bias=None,
                              initial_states=None, dfinal_states=None, seq_idx=None, dt_softplus=False,
                              dt_limit=(0.0, float("inf"))):
            # the backward's own preconditions (csrc/ssd/ssd_host.cpp, prepare_ssd_bwd), the
            # forward's checked by running its reference check above
            from selective_scan._ssd_meta import ssd_bwd_fake

            Ssd.ssd_forward_cuda(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
                                 dt_softplus, dt_limit)
            calls[-1] = "ssd.bwd"
            batch, seqlen, nheads, headdim = x.shape
            assert dout.shape == x.shape and out.shape == x.shape
            assert dfinal_states is None or dfinal_states.shape == (batch, nheads, headdim, B.shape[3])
            return ssd_bwd_fake(dout, x, dt, A, B, C, out, chunk_size, D, z, dt_bias, initial_states,
                                dfinal_states, seq_idx, dt_softplus, *dt_limit)

    return calls, Conv, Scan, Update, Norm, Ssd


def test_case_inputs_are_valid_on_the_reference_path(monkeypatch):
    import torch

    monkeypatch.setenv("MAMBA_KERNELS_BACKEND", "reference")
    monkeypatch.setattr(sc, "DEVICE", "cpu")
    calls, conv, scan, update, norm, ssd = _reference_ops()
    for c in sc.CASES:
        gen = torch.Generator().manual_seed(1)
        before = len(calls)
        if c.family.startswith("conv"):
            sc.run_conv(c, gen, _ops=conv)
        elif c.family.startswith("scan"):
            sc.run_scan(c, gen, _ops=scan)
        elif c.family == "norm":
            sc.run_norm(c, gen, _norm_ops=norm)
        elif c.family.startswith("ssd"):
            sc.run_ssd(c, gen, _ssd_ops=ssd)
        else:
            sc.run_decode(c, gen, _update_ops=update)
        want = {"conv_fwd": ["conv.fwd"], "conv_bwd": ["conv.bwd", "conv.fwd"],
                "conv_update": ["conv.update"],
                "scan_fwd": ["scan.fwd"], "scan_bwd": ["scan.fwd", "scan.bwd"],
                "decode": ["decode"], "ssd_fwd": ["ssd.fwd"], "ssd_bwd": ["ssd.fwd", "ssd.bwd"],
                "norm": ["norm.fwd", "norm.bwd"] if c.params.get("bwd") else ["norm.fwd"]}[c.family]
        assert calls[before:] == want, c.name


def _run_list(*args, **env):
    environ = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHON=sys.executable, **env)
    return subprocess.run(["bash", str(SCRIPT), "--list", *args], cwd=ROOT, env=environ, capture_output=True,
                          text=True, timeout=120)


def test_list_runs_on_cpu_and_names_every_case():
    proc = _run_list()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for c in sc.CASES:
        assert re.search(rf"\b{c.name}\b", proc.stdout), c.name
    assert "NOT REACHED" not in proc.stdout and "PREDICTED" not in proc.stdout
    one = _run_list("--family", "decode", "--tool", "synccheck")
    assert one.returncode == 0, one.stdout + one.stderr
    names = {c.name for c in sc.CASES if c.family == "decode"}
    listed = {line.split()[1] for line in one.stdout.splitlines() if line.startswith("decode ")}
    assert listed == names
    assert "synccheck" in one.stdout and "memcheck" not in one.stdout
    bad = _run_list("--family", "nonsense")
    assert bad.returncode != 0


def test_list_does_not_import_torch():
    path = str(ROOT / "scripts" / "sanitize_cases.py")
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('s', {path!r})\n"
        "m = importlib.util.module_from_spec(spec); sys.modules['s'] = m; spec.loader.exec_module(m)\n"
        "rc = m.main(['list'])\n"
        "assert 'torch' not in sys.modules, 'list imported torch'\n"
        "sys.exit(rc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


_STAND_IN = """#!/usr/bin/env bash
# compute-sanitizer's command line, and its reports, for the driver's bookkeeping
case "$1" in
  --help) echo "--tool --error-exitcode --print-limit --kernel-name --racecheck-report"; exit 0 ;;
  --version) echo "Stand-in Version 0"; exit 0 ;;
esac
echo "$@" >> "$STAND_IN_LOG"
tool=""
while [ $# -gt 0 ]; do
  case "$1" in --tool) tool=$2; shift 2 ;; --*) shift 2 ;; *) break ;; esac
done
shift 3  # python, the driver, "run"
if [ "$tool" = synccheck ] && [ "$1" = decode_typed_one ]; then
  echo "========= Barrier error detected"
  echo "=========     at void mamba_kernels::selective_scan::k()+0x10"
  echo "========= ERROR SUMMARY: 1 error"
  exit 99
fi
if [ "$tool" = memcheck ] && [ $# -gt 1 ]; then
  for c; do echo "case $c ran in 0.1 s"; done
  echo "Fatal Python error: Aborted"
  exit 134
fi
for c; do echo "case $c ran in 0.1 s"; done
echo "========= ERROR SUMMARY: 0 errors"
"""


def _run_stand_in(tmp_path, *args):
    """The driver's sanitize verb with the stand-in for compute-sanitizer: (process, the stand-in's
    command lines, the output folder)."""
    fake = tmp_path / "compute-sanitizer"
    fake.write_text(_STAND_IN)
    fake.chmod(0o755)
    calls = tmp_path / "calls.txt"
    calls.write_text("")
    env = dict(os.environ, COMPUTE_SANITIZER=str(fake), STAND_IN_LOG=str(calls))
    out = tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "scripts" / "sanitize_cases.py"), "sanitize", "--out", str(out),
           "--no-verify", *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return proc, calls.read_text().splitlines(), out


def test_driver_bookkeeping_with_a_stand_in_sanitizer(tmp_path):
    # the driver's processes, retries, counts, summary and exit status, with a stand-in for
    # compute-sanitizer (what it checks needs a GPU): memcheck's shared process dies after its
    # cases ran, so each case runs again alone (clean); synccheck finds an error in one case
    proc, lines, out = _run_stand_in(tmp_path, "--family", "decode", "--tool", "memcheck",
                                     "--tool", "synccheck", "--jobs", "2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    decode = [c.name for c in sc.CASES if c.family == "decode"]
    memcheck = [ln for ln in lines if "--tool memcheck" in ln]
    synccheck = [ln for ln in lines if "--tool synccheck" in ln]
    assert len(memcheck) == 1 + len(decode) and len(synccheck) == len(decode)
    assert all("--kernel-name kns=mamba_kernels" in ln for ln in lines)
    n = len(decode)
    assert re.search(rf"memcheck\s+decode\s+cases\s+{n} errors\s+0 seconds", proc.stdout)
    assert re.search(rf"synccheck\s+decode\s+cases\s+{n} errors\s+1 seconds", proc.stdout)
    assert re.search(r"^memcheck: [\d.]+ s wall$", proc.stdout, re.M)
    summary = (out / "summary.md").read_text()
    assert f"| memcheck | decode | {n} | 0 |" in summary
    assert "died after its cases ran" in summary and f"| synccheck | decode | {n} | 1 |" in summary
    assert (out / "sanitize-logs.tar.gz").stat().st_size > 0
    assert sorted(p.name for p in out.iterdir()) == ["sanitize-logs.tar.gz", "summary.md", "summary.tsv"]


def test_a_tool_defect_skips_its_pair_and_says_why(tmp_path):
    # synccheck does not run the case its defect names (the stand-in would pass it: the point is
    # that the driver never starts it), the summary says so, and the exit status stays 0
    (tool, case), reason = next(iter(sc.TOOL_DEFECTS.items()))
    family = next(c.family for c in sc.CASES if c.name == case)
    proc, started, out = _run_stand_in(tmp_path, "--family", family, "--tool", tool, "--jobs", "4")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    others = [c.name for c in sc.CASES if c.family == family and c.name != case]
    assert len(started) == len(others) and not [ln for ln in started if ln.endswith(" " + case)]
    assert f"{tool}: {case} not run: {reason}" in proc.stdout
    summary = (out / "summary.md").read_text()
    row = next(ln for ln in summary.splitlines() if ln.startswith(f"| {tool} | {family} |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # every case counted, the skipped one not among the processes that ran, its status said
    assert cells[2] == str(len(others) + 1) and cells[4] == str(len(others))
    assert sc.NOT_RUN_DEFECT in cells[5]
    # every pair names a real case and a real tool, and says where the evidence is
    for (t, c), why in sc.TOOL_DEFECTS.items():
        assert t in sc.TOOLS and c in {k.name for k in sc.CASES} and "docs/KERNELS.md" in why


def test_script_is_valid_bash():
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.sanitize
@pytest.mark.gpu
def test_sanitizers_find_no_errors(request, tmp_path):
    """The whole run: compute-sanitizer's four tools over every case (about ten minutes on an H200)."""
    if "sanitize" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("selected only with -m sanitize (about ten minutes on an H200)")
    if sc.find_sanitizer() is None and shutil.which("compute-sanitizer") is None:
        pytest.skip("compute-sanitizer not found")
    proc = subprocess.run(["bash", str(SCRIPT), "--out", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True,
                          timeout=1800)
    summary = (tmp_path / "summary.md").read_text() if (tmp_path / "summary.md").exists() else ""
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:] + summary
