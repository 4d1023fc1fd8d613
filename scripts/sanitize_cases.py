"""The cases scripts/sanitize.sh runs under compute-sanitizer, and the driver that runs them.

Every kernel kind the launchers in csrc can choose (conv forward, backward and update; the
selective scan's lane kernels at 1, 2 and 4 states per lane, its cluster kernels, its classic
kernels; each decode kernel; the gated norm's kernels) is a ``Kind``; every ``Case`` is one small problem
meant to reach one or more kinds. Which kind a shape reaches is the launchers' choice, made in
C++ from the sizes, strides and the GPU's SM count; ``predict`` restates that choice here (the
constants in ``POLICY`` are the policy headers', which tests/test_sanitize_script.py reads back
from csrc), so that the case list can be checked on a machine without a GPU, and ``verify``
checks it on the GPU by recording which kernels each case launched (torch.profiler, never
under a sanitizer).

    python3 scripts/sanitize_cases.py list [--tool T] [--family F] [--json]   (no torch needed)
    python3 scripts/sanitize_cases.py run CASE...      one process: run the cases (on a GPU)
    python3 scripts/sanitize_cases.py verify CASE...   which kernels each case launches
    python3 scripts/sanitize_cases.py sanitize --out DIR [--tool T] [--family F] [--jobs N]
                                                       what scripts/sanitize.sh calls
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
FAMILIES = ("conv_fwd", "conv_bwd", "conv_update", "scan_fwd", "scan_bwd", "decode", "norm", "ssd_fwd",
            "ssd_bwd")
# Tools that get one process per case (the others: one process per family). synccheck over
# several tests in one process once ended in "Fatal Python error: Aborted" with 0 errors
# reported (docs/KERNELS.md, "Sanitizer checks"), so it never shares a process.
ISOLATED_TOOLS = ("synccheck",)
# (tool, case) pairs a tool cannot run, each with the reason and the evidence: the case still
# runs under the other tools, and the summary lists the pair as "not run (tool defect)".
NOT_RUN_DEFECT = "not run (tool defect)"
TOOL_DEFECTS = {
    ("synccheck", "scan_bwd_cluster16_two_groups"):
        "compute-sanitizer 2025.3's synccheck faults (illegal address, 0 errors reported) on any "
        "grid of 12 clusters of 16 blocks that uses st.async and cluster barriers, ours or the "
        "stand-alone scripts/cluster_synccheck_probe.cu; one or two such clusters, and 12 or 40 "
        "clusters of 8, run clean (docs/KERNELS.md, \"The synccheck abort\")",
}
# The GPU the predictions are made for: an H100 / H200 (132 SMs).
SMS = 132


# ------------------------------------------------------------------------------------- kinds


@dataclass(frozen=True)
class Kind:
    family: str
    kernel: str  # a regex on the demangled name of the kernel that this kind launches
    what: str
    sites: Tuple[str, ...]  # the dispatch sites in csrc it stands for (test_sanitize_script.py)
    launches: Tuple[int, int] = (1, 1 << 30)  # how many launches of `kernel` a case of it makes


def _k(family: str, kernel: str, what: str, *sites: str, launches: Tuple[int, int] = (1, 1 << 30)) -> Kind:
    return Kind(family, kernel, what, sites, launches)


CC, SS, LN, SD = "causal_conv1d/", "selective_scan/", "layernorm_gated/", "ssd/"
KINDS: Dict[str, Kind] = {
    # causal_conv1d forward (csrc/causal_conv1d/fwd.cu, fwd_launch)
    "conv_fwd_cf_lean": _k("conv_fwd", r"::fwd_channel_first_lean<", "channel-first lean",
                           CC + "fwd.cu:fwd_channel_first_lean<T, W>"),
    "conv_fwd_cf": _k("conv_fwd", r"::fwd_channel_first<[^<>]*, false>", "channel-first general",
                      CC + "fwd.cu:fwd_channel_first<T, W, false>"),
    "conv_fwd_cf_seq": _k("conv_fwd", r"::fwd_channel_first<[^<>]*, true>", "channel-first with seq_idx",
                          CC + "fwd.cu:fwd_channel_first<T, W, true>"),
    "conv_fwd_cl_tile": _k("conv_fwd", r"::fwd_channel_last_tile<", "channel-last tile (lean)",
                           CC + "fwd.cu:fwd_channel_last_tile<T, W>"),
    "conv_fwd_cl": _k("conv_fwd", r"::fwd_channel_last<[^<>]*, false>", "channel-last general",
                      CC + "fwd.cu:fwd_channel_last<T, W, false>"),
    "conv_fwd_cl_seq": _k("conv_fwd", r"::fwd_channel_last<[^<>]*, true>",
                          "channel-last with seq_idx (varlen)",
                          CC + "fwd.cu:fwd_channel_last<T, W, true>"),
    # causal_conv1d backward (bwd.cu, bwd_launch)
    "conv_bwd_cl_lean_silu": _k("conv_bwd", r"::bwd_channel_last_lean<[^<>]*, true>",
                                "channel-last lean, silu",
                                CC + "bwd.cu:bwd_channel_last_lean<T, W, true>"),
    "conv_bwd_cl_lean": _k("conv_bwd", r"::bwd_channel_last_lean<[^<>]*, false>", "channel-last lean",
                           CC + "bwd.cu:bwd_channel_last_lean<T, W, false>"),
    "conv_bwd_cf_lean_silu": _k("conv_bwd", r"::bwd_channel_first_lean<[^<>]*, true>",
                                "channel-first lean, silu",
                                CC + "bwd.cu:bwd_channel_first_lean<T, W, true>"),
    "conv_bwd_cf_lean": _k("conv_bwd", r"::bwd_channel_first_lean<[^<>]*, false>", "channel-first lean",
                           CC + "bwd.cu:bwd_channel_first_lean<T, W, false>"),
    "conv_bwd_cl": _k("conv_bwd", r"::bwd_channel_last<[^<>]*, false>", "channel-last general",
                      CC + "bwd.cu:bwd_channel_last<T, W, false>"),
    "conv_bwd_cl_seq": _k("conv_bwd", r"::bwd_channel_last<[^<>]*, true>", "channel-last with seq_idx",
                          CC + "bwd.cu:bwd_channel_last<T, W, true>"),
    "conv_bwd_cf": _k("conv_bwd", r"::bwd_channel_first<[^<>]*, false>", "channel-first general",
                      CC + "bwd.cu:bwd_channel_first<T, W, false>"),
    "conv_bwd_cf_seq": _k("conv_bwd", r"::bwd_channel_first<[^<>]*, true>", "channel-first with seq_idx",
                          CC + "bwd.cu:bwd_channel_first<T, W, true>"),
    "conv_bwd_reduce": _k("conv_bwd", r"::reduce_partials\b", "deterministic dweight/dbias reduction",
                          CC + "bwd.cu:reduce_partials"),
    # causal_conv1d update (update.cu, update_launch)
    "conv_update_shift_wm1": _k("conv_update", r"::update_shift_kernel<[^<>]*, (?:2, 1|3, 2|4, 3)>",
                                "lean, state_len W-1",
                                CC + "update.cu:update_shift_kernel<T, W, W - 1>"),
    "conv_update_shift_w": _k("conv_update", r"::update_shift_kernel<[^<>]*, (?:2, 2|3, 3|4, 4)>",
                              "lean, state_len W",
                              CC + "update.cu:update_shift_kernel<T, W, W>"),
    "conv_update_general": _k("conv_update", r"::update_kernel<", "general (circular cache, longer state)",
                              CC + "update.cu:update_kernel<T, W>"),
    # selective scan forward (fwd_lanes.cu launch_fwd_lanes; fwd.cu launch_fwd)
    "scan_fwd_lanes_s4": _k("scan_fwd", r"::fwd_lanes_kernel<[^<>]*, 4, true>",
                            "lanes, 4 states a lane, variable B/C",
                            "lanes:4", "lanes_var:true", SS + "fwd_lanes.cu:fwd_lanes_kernel<T, kS, kVarBC>"),
    "scan_fwd_lanes_s4_fixed": _k("scan_fwd", r"::fwd_lanes_kernel<[^<>]*, 4, false>",
                                  "lanes, 4 states, fixed B",
                                  "lanes_var:false"),
    "scan_fwd_lanes_s2": _k("scan_fwd", r"::fwd_lanes_kernel<[^<>]*, 2, true>", "lanes, 2 states a lane",
                            "lanes:2"),
    "scan_fwd_lanes_s2_fixed": _k("scan_fwd", r"::fwd_lanes_kernel<[^<>]*, 2, false>",
                                  "lanes, 2 states, fixed B"),
    "scan_fwd_lanes_s1": _k("scan_fwd", r"::fwd_lanes_kernel<[^<>]*, 1, true>", "lanes, 1 state a lane",
                            "lanes:1"),
    "scan_fwd_lanes_s1_fixed": _k("scan_fwd", r"::fwd_lanes_kernel<[^<>]*, 1, false>",
                                  "lanes, 1 state, fixed B"),
    "scan_fwd_classic_real": _k("scan_fwd", r"::fwd_kernel<[^<>]*, false>", "classic, real A, dstate > 16",
                                SS + "fwd.cu:kernel#2"),
    "scan_fwd_classic_complex": _k("scan_fwd", r"::fwd_kernel<[^<>]*, true>", "classic, complex A"),
    "scan_fwd_classic_segments": _k("scan_fwd", r"::fwd_kernel<", "classic, the sequence cut into segments",
                                    SS + "fwd.cu:kernel#1", launches=(2, 2)),  # states pass, full pass
    # selective scan backward (bwd_lanes.cu launch_bwd_lanes_for; bwd.cu launch_bwd; sum_partials.cu)
    "scan_bwd_lanes": _k("scan_bwd", r"::bwd_lanes_kernel<[^<>]*, true, false>",
                         "lanes, variable B/C, a row a block",
                         SS + "bwd_lanes.cu:kernel#1"),
    "scan_bwd_lanes_fixed": _k("scan_bwd", r"::bwd_lanes_kernel<[^<>]*, false, false>", "lanes, fixed B"),
    "scan_bwd_cluster16": _k("scan_bwd", r"::bwd_lanes_kernel<[^<>]*, true, true>",
                             "cluster of 16, the exchange",
                             SS + "bwd_lanes.cu:cudaLaunchKernelEx#1", "cluster:16"),
    "scan_bwd_cluster8": _k("scan_bwd", r"::bwd_lanes_kernel<[^<>]*, true, true>",
                            "cluster of 8, the exchange",
                            "cluster:8"),
    "scan_bwd_spaced": _k("scan_bwd", r"::bwd_lanes_kernel<", "states 1024 steps apart in pairs, one pass",
                          launches=(1, 1)),
    "scan_bwd_windows": _k("scan_bwd", r"::bwd_lanes_kernel<", "states 1024 steps apart, in windows (carry)",
                           launches=(2, 1 << 30)),  # a launch a window
    "scan_bwd_classic_real": _k("scan_bwd", r"::bwd_kernel<[^<>]*, false>", "classic, real A, dstate > 16",
                                SS + "bwd.cu:kernel#1"),
    "scan_bwd_classic_complex": _k("scan_bwd", r"::bwd_kernel<[^<>]*, true>", "classic, complex A"),
    "scan_bwd_sum_partials": _k("scan_bwd", r"::sum_partials_kernel\b", "the partial sums' reduction",
                                SS + "sum_partials.cu:sum_partials_kernel"),
    # selective_state_update (update.cu launch_state_update; each kind launched from update_<kind>.cu)
    "decode_generic_one": _k("decode", r"::state_update_kernel<[^<>]*AnyDtype", "generic, a row a thread",
                             "launch_kernel:AnyDtype", "mode:one"),
    "decode_generic_pair": _k("decode", r"::state_update_kernel<[^<>]*AnyDtype",
                              "generic, two batch rows a thread",
                              "mode:pair"),
    "decode_generic_wide": _k("decode", r"::state_update_kernel<[^<>]*AnyDtype", "generic, two chunks a lane",
                              "mode:wide"),
    "decode_typed_one": _k("decode", r"::state_update_kernel<(?![^<>]*AnyDtype)", "typed, a row a thread",
                           SS + "update_full.cu:state_update_kernel<S, T>", "launch_kernel:T"),
    "decode_typed_pair": _k("decode", r"::state_update_kernel<(?![^<>]*AnyDtype)", "typed, pair"),
    "decode_typed_wide": _k("decode", r"::state_update_kernel<(?![^<>]*AnyDtype)",
                            "typed, wide (dstate > 128)"),
    "decode_lean_p1": _k("decode", r"::state_update_lean<[^<>]*, 1>", "lean, one pass a warp",
                         SS + "update_lean.cu:state_update_lean<S, T, kP>", "launch_lean_as:1"),
    "decode_lean_p2": _k("decode", r"::state_update_lean<[^<>]*, 2>", "lean, passes two at a time",
                         "launch_lean_as:2"),
    "decode_lean_p4": _k("decode", r"::state_update_lean<[^<>]*, 4>", "lean, passes four at a time",
                         "launch_lean_as:4"),
    "decode_row": _k("decode", r"::state_update_row<[^<>]*, false>", "row kernel (heads, slot indices)",
                     SS + "update_row.cu:state_update_row<S, T, false>"),
    "decode_row_mamba1": _k("decode", r"::state_update_row<[^<>]*, true>", "row kernel, Mamba-1's fixed step",
                            SS + "update_row.cu:state_update_row<S, T, true>"),
    # the gated norm (csrc/layernorm_gated: fwd.cu launch_typed, bwd.cu launch_typed, launch_norm_bwd)
    "norm_fwd_vec": _k("norm", r"::norm_fwd_kernel<[^<>]*, true>", "forward, 16-byte packs",
                       LN + "fwd.cu:norm_fwd_kernel<T, true>"),
    "norm_fwd_scalar": _k("norm", r"::norm_fwd_kernel<[^<>]*, false>", "forward, one element a pack",
                          LN + "fwd.cu:norm_fwd_kernel<T, false>"),
    "norm_bwd_vec": _k("norm", r"::norm_bwd_kernel<[^<>]*, true>", "backward, 16-byte packs",
                       LN + "bwd.cu:norm_bwd_kernel<T, true>"),
    "norm_bwd_scalar": _k("norm", r"::norm_bwd_kernel<[^<>]*, false>", "backward, one element a pack",
                          LN + "bwd.cu:norm_bwd_kernel<T, false>"),
    "norm_bwd_reduce": _k("norm", r"::norm_reduce_kernel\b", "dweight / dbias: the chunks' partial sums",
                          LN + "bwd.cu:norm_reduce_kernel"),
    # Mamba-2 SSD forward (csrc/ssd/fwd.cu launch_typed): four launches a call (five with
    # cu_seqlens); the 16-bit instantiations multiply on tensor cores, fp32 with FMAs
    "ssd_fwd_cb_16bit": _k("ssd_fwd", r"::chunk_cb_kernel<(?:__nv_bfloat16|__half)>",
                           "C B^T per chunk and group, 16-bit (tensor cores)",
                           SD + "fwd.cu:chunk_cb_kernel<T>", launches=(1, 1)),
    "ssd_fwd_cb_f32": _k("ssd_fwd", r"::chunk_cb_kernel<float>", "C B^T, fp32 (FMA)", launches=(1, 1)),
    "ssd_fwd_state_16bit": _k("ssd_fwd", r"::chunk_state_kernel<(?:__nv_bfloat16|__half)>",
                              "chunk states with dt / dA_cumsum, 16-bit (tensor cores)",
                              SD + "fwd.cu:chunk_state_kernel<T>", launches=(1, 1)),
    "ssd_fwd_state_f32": _k("ssd_fwd", r"::chunk_state_kernel<float>", "chunk states, fp32 (FMA)",
                            launches=(1, 1)),
    # the state passing walks: SsdPassPolicy::kVec state elements a thread (any width above 1 in
    # the kernel's name) when headdim x dstate allows, else 1
    "ssd_fwd_pass_vec": _k("ssd_fwd", r"::state_pass_kernel<[2-9]>", "state passing, 16-byte accesses",
                           SD + "fwd.cu:state_pass_kernel<SsdPassPolicy::kVec>", launches=(1, 1)),
    "ssd_fwd_pass_1": _k("ssd_fwd", r"::state_pass_kernel<1>", "state passing, one element a thread",
                         SD + "fwd.cu:state_pass_kernel<1>", launches=(1, 1)),
    "ssd_fwd_scan_16bit": _k("ssd_fwd", r"::chunk_scan_kernel<(?:__nv_bfloat16|__half)>",
                             "chunk scan, 16-bit (tensor cores, FMA diagonal)",
                             SD + "fwd.cu:chunk_scan_kernel<T>", launches=(1, 1)),
    "ssd_fwd_scan_f32": _k("ssd_fwd", r"::chunk_scan_kernel<float>", "chunk scan, fp32 (FMA)",
                           launches=(1, 1)),
    "ssd_fwd_varlen_16bit": _k("ssd_fwd", r"::varlen_state_kernel<(?:__nv_bfloat16|__half)>",
                               "each packed sequence's final state (cu_seqlens), 16-bit",
                               SD + "fwd.cu:varlen_state_kernel<T>", launches=(1, 1)),
    "ssd_fwd_varlen_f32": _k("ssd_fwd", r"::varlen_state_kernel<float>", "varlen final states, fp32",
                             launches=(1, 1)),
    # Mamba-2 SSD backward (csrc/ssd/bwd.cu launch_typed): after the forward's C B^T, chunk states
    # and state passing again (the recomputation; kinds of ssd_fwd), eight launches a call
    "ssd_bwd_gate_16bit": _k("ssd_bwd", r"::gate_bwd_kernel<(?:__nv_bfloat16|__half)>",
                             "dy = dout silu(z) and dz, 16-bit", SD + "bwd.cu:gate_bwd_kernel<T>",
                             launches=(1, 1)),
    "ssd_bwd_gate_f32": _k("ssd_bwd", r"::gate_bwd_kernel<float>", "dy and dz, fp32", launches=(1, 1)),
    "ssd_bwd_dstate_16bit": _k("ssd_bwd", r"::chunk_dstate_kernel<(?:__nv_bfloat16|__half)>",
                               "each chunk's own state gradient, 16-bit (tensor cores)",
                               SD + "bwd.cu:chunk_dstate_kernel<T>", launches=(1, 1)),
    "ssd_bwd_dstate_f32": _k("ssd_bwd", r"::chunk_dstate_kernel<float>", "chunk state gradients, fp32 (FMA)",
                             launches=(1, 1)),
    "ssd_bwd_pass_vec": _k("ssd_bwd", r"::state_pass_bwd_kernel<[2-9]>",
                           "reverse state passing, decay partials, 16-byte accesses",
                           SD + "bwd.cu:state_pass_bwd_kernel<SsdPassPolicy::kVec>", launches=(1, 1)),
    "ssd_bwd_pass_1": _k("ssd_bwd", r"::state_pass_bwd_kernel<1>",
                         "reverse state passing, one element a thread",
                         SD + "bwd.cu:state_pass_bwd_kernel<1>", launches=(1, 1)),
    "ssd_bwd_dcb_16bit": _k("ssd_bwd", r"::chunk_dcb_kernel<(?:__nv_bfloat16|__half)>",
                            "d(C B^T) over a group's heads, dA_cumsum / dt partials, 16-bit (tensor cores)",
                            SD + "bwd.cu:chunk_dcb_kernel<T>", launches=(1, 1)),
    "ssd_bwd_dcb_f32": _k("ssd_bwd", r"::chunk_dcb_kernel<float>", "d(C B^T), fp32 (FMA)", launches=(1, 1)),
    "ssd_bwd_dx_16bit": _k("ssd_bwd", r"::chunk_dx_kernel<(?:__nv_bfloat16|__half)>",
                           "dx (anti-causal, FMA diagonal), state-weight partials, 16-bit (tensor cores)",
                           SD + "bwd.cu:chunk_dx_kernel<T>", launches=(1, 1)),
    "ssd_bwd_dx_f32": _k("ssd_bwd", r"::chunk_dx_kernel<float>", "dx, fp32 (FMA)", launches=(1, 1)),
    "ssd_bwd_dbc_16bit": _k("ssd_bwd", r"::chunk_dbc_kernel<(?:__nv_bfloat16|__half)>",
                            "dB and dC over a group's heads, 16-bit (tensor cores)",
                            SD + "bwd.cu:chunk_dbc_kernel<T>", launches=(1, 1)),
    "ssd_bwd_dbc_f32": _k("ssd_bwd", r"::chunk_dbc_kernel<float>", "dB and dC, fp32 (FMA)", launches=(1, 1)),
    "ssd_bwd_dbcsum_16bit": _k("ssd_bwd", r"::dbc_sum_kernel<(?:__nv_bfloat16|__half)>",
                               "dB and dC: chunk_dbc's head-split slabs added in order, 16-bit out",
                               SD + "bwd.cu:dbc_sum_kernel<T>", launches=(1, 1)),
    "ssd_bwd_dbcsum_f32": _k("ssd_bwd", r"::dbc_sum_kernel<float>", "dB and dC slabs added, fp32 out",
                             launches=(1, 1)),
    "ssd_bwd_ddt_16bit": _k("ssd_bwd", r"::chunk_ddt_kernel<(?:__nv_bfloat16|__half)>",
                            "per-step sums, reverse cumsum, the dt chain, 16-bit tiles",
                            SD + "bwd.cu:chunk_ddt_kernel<T>", launches=(1, 1)),
    "ssd_bwd_ddt_f32": _k("ssd_bwd", r"::chunk_ddt_kernel<float>", "per-step sums, fp32 tiles",
                          launches=(1, 1)),
    "ssd_bwd_sum": _k("ssd_bwd", r"::param_sum_kernel\b", "dA, dt_bias, D gradients: fixed-order sums",
                      SD + "bwd.cu:param_sum_kernel", launches=(1, 1)),
}


# ------------------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    name: str
    family: str
    kinds: Tuple[str, ...]  # what it is meant to reach (predict() must agree)
    params: Dict[str, object] = field(default_factory=dict)
    note: str = ""


def _c(name: str, family: str, kinds: Sequence[str], note: str = "", **params) -> Case:
    return Case(name, family, tuple(kinds), params, note)


F32, F16, BF16 = "float32", "float16", "bfloat16"
# the kinds a 16-bit SSD forward case reaches, in launch order (pass: "vec" when headdim x dstate
# is a multiple of SsdPassPolicy::kVec, else "1")
def _ssd16(pass_: str = "vec") -> List[str]:
    return ["ssd_fwd_cb_16bit", "ssd_fwd_state_16bit", f"ssd_fwd_pass_{pass_}", "ssd_fwd_scan_16bit"]


SSD16 = _ssd16()

# the kinds every SSD backward case reaches (with seqlen > 0), in launch order
SSD_BWD = ["gate", "dstate", "pass", "dcb", "dx", "dbc", "ddt", "sum"]


def _ssd_bwd_kinds(kind: str, pass_: str = "vec", dbc_sum: bool = False) -> List[str]:
    """The kinds in launch order; dbc_sum: chunk_dbc splits heads (dbc_splits), so dbc_sum follows it."""
    order = [*SSD_BWD[:6], "dbcsum", *SSD_BWD[6:]] if dbc_sum else SSD_BWD
    return [f"ssd_bwd_pass_{pass_}" if k == "pass" else "ssd_bwd_sum" if k == "sum" else f"ssd_bwd_{k}_{kind}"
            for k in order]


CASES: List[Case] = [
    # ---- conv forward: odd lengths and dims, tile ends, seq_idx with padding, states
    _c("conv_fwd_cf_lean", "conv_fwd", ["conv_fwd_cf_lean"], "L a multiple of the vector, past one chunk",
       batch=2, dim=40, L=544, width=4, dtype=BF16, layout="cf"),
    _c("conv_fwd_cf_init_final", "conv_fwd", ["conv_fwd_cf"], "odd L, initial and final states",
       batch=2, dim=37, L=131, width=3, dtype=F32, layout="cf", init=True, final=True),
    _c("conv_fwd_cf_seq", "conv_fwd", ["conv_fwd_cf_seq"], "seq_idx with a padded tail",
       batch=3, dim=24, L=333, width=4, dtype=F16, layout="cf", seq_idx=True),
    _c("conv_fwd_cl_tile", "conv_fwd", ["conv_fwd_cl_tile"], "partial 64-step and channel tiles",
       batch=2, dim=136, L=131, width=4, dtype=BF16, layout="cl"),
    _c("conv_fwd_cl_init_final", "conv_fwd", ["conv_fwd_cl"], "initial and final states, odd dim",
       batch=2, dim=100, L=77, width=2, dtype=F32, layout="cl", init=True, final=True),
    _c("conv_fwd_cl_varlen", "conv_fwd", ["conv_fwd_cl_seq"], "varlen: seq_idx, padding, initial states",
       batch=3, dim=64, L=300, width=4, dtype=BF16, layout="cl", seq_idx=True, init=True),
    # ---- conv backward
    _c("conv_bwd_cl_lean", "conv_bwd", ["conv_bwd_cl_lean_silu"], "", batch=2, dim=72, L=133, width=4,
       dtype=BF16, layout="cl", silu=True),
    _c("conv_bwd_cl_lean_nosilu", "conv_bwd", ["conv_bwd_cl_lean"], "", batch=2, dim=40, L=70, width=3,
       dtype=F32, layout="cl", silu=False),
    _c("conv_bwd_cf_lean", "conv_bwd", ["conv_bwd_cf_lean_silu"], "", batch=2, dim=24, L=1040, width=4,
       dtype=BF16, layout="cf", silu=True),
    _c("conv_bwd_cf_lean_det", "conv_bwd", ["conv_bwd_cf_lean", "conv_bwd_reduce"],
       "deterministic: workspace rows and reduce_partials", batch=2, dim=20, L=520, width=2, dtype=F32,
       layout="cf", silu=False, deterministic=True),
    _c("conv_bwd_cl_states", "conv_bwd", ["conv_bwd_cl"], "initial / final states and their gradients",
       batch=2, dim=100, L=131, width=4, dtype=F32, layout="cl", init=True, dfinal=True),
    _c("conv_bwd_cl_varlen_det", "conv_bwd", ["conv_bwd_cl_seq", "conv_bwd_reduce"], "varlen, deterministic",
       batch=3, dim=64, L=300, width=4, dtype=BF16, layout="cl", seq_idx=True, deterministic=True),
    _c("conv_bwd_cf_states", "conv_bwd", ["conv_bwd_cf"], "odd L, states", batch=2, dim=37, L=131, width=3,
       dtype=F16, layout="cf", init=True, dfinal=True),
    _c("conv_bwd_cf_seq", "conv_bwd", ["conv_bwd_cf_seq"], "", batch=3, dim=24, L=333, width=4, dtype=F32,
       layout="cf", seq_idx=True),
    # ---- conv update
    _c("conv_update_shift_wm1", "conv_update", ["conv_update_shift_wm1"], "odd batch (a part row pair)",
       batch=5, dim=200, width=4, state_len=3, L=1, dtype=BF16),
    _c("conv_update_shift_w", "conv_update", ["conv_update_shift_w"], "two tokens", batch=4, dim=130, width=3,
       state_len=3, L=2, dtype=F32),
    _c("conv_update_circular", "conv_update", ["conv_update_general"],
       "circular cache, slot indices, padding",
       batch=6, dim=130, width=4, state_len=7, L=3, dtype=F16, cache_seqlens=True, indices=True),
    # ---- scan forward (SMS = 132: lane kernels pick states per lane by batch x dim)
    _c("scan_fwd_s4", "scan_fwd", ["scan_fwd_lanes_s4"], "batch x dim 11616, odd L", batch=2, dim=5808, L=71,
       dstate=16, dtype=BF16),
    _c("scan_fwd_s4_fixed_b", "scan_fwd", ["scan_fwd_lanes_s4_fixed"], "fixed B", batch=2, dim=5808, L=70,
       dstate=16, dtype=F32, var_b=False),
    _c("scan_fwd_s2", "scan_fwd", ["scan_fwd_lanes_s2"], "batch x dim 8196, 16-bit B/C", batch=4, dim=2049,
       L=70,
       dstate=16, dtype=F16),
    _c("scan_fwd_s2_many_blocks", "scan_fwd", ["scan_fwd_lanes_s2_fixed"],
       "few channels but more 1-state blocks than one wave: 2 states; fixed C", batch=1, dim=5000, L=40,
       dstate=12, dtype=F32, var_c=False),
    _c("scan_fwd_s1", "scan_fwd", ["scan_fwd_lanes_s1"], "32-step tiles, full-tile copy and the tail",
       batch=2,
       dim=40, L=197, dstate=16, dtype=BF16),
    _c("scan_fwd_s1_fixed_groups", "scan_fwd", ["scan_fwd_lanes_s1_fixed"], "fixed B, dstate 5, no z",
       batch=2, dim=48, L=33, dstate=5, dtype=F32, var_b=False, z=False),
    _c("scan_fwd_s1_spaced", "scan_fwd", ["scan_fwd_lanes_s1"], "states 1024 steps apart in pairs",
       batch=1, dim=40, L=2049, dstate=16, dtype=F32, state_steps=1024, state_pairs=True),
    _c("scan_fwd_classic_real", "scan_fwd", ["scan_fwd_classic_real"], "dstate 256 (opt-in shared memory)",
       batch=2, dim=8, L=100, dstate=256, dtype=BF16),
    _c("scan_fwd_classic_segments", "scan_fwd", ["scan_fwd_classic_real", "scan_fwd_classic_segments"],
       "2 segments", batch=1, dim=64, L=2049, dstate=32, dtype=F32),
    _c("scan_fwd_classic_complex", "scan_fwd", ["scan_fwd_classic_complex", "scan_fwd_classic_segments"],
       "complex A, 2 segments", batch=1, dim=32, L=2100, dstate=8, dtype=F32, cplx=True),
    # ---- scan backward (each runs the forward op first for the states)
    _c("scan_bwd_lanes_row", "scan_bwd", ["scan_bwd_lanes", "scan_bwd_sum_partials"],
       "3 channel groups, a row a block (no cluster)", batch=2, dim=40, L=130, dstate=16, dtype=BF16),
    _c("scan_bwd_lanes_fixed_b", "scan_bwd", ["scan_bwd_lanes_fixed", "scan_bwd_sum_partials"],
       "fixed B, odd L",
       batch=2, dim=48, L=97, dstate=16, dtype=F32, var_b=False),
    _c("scan_bwd_cluster16", "scan_bwd", ["scan_bwd_cluster16", "scan_bwd_sum_partials"],
       "one cluster of 16, a group a block", batch=1, dim=256, L=130, dstate=16, dtype=F32),
    _c("scan_bwd_cluster16_two_groups", "scan_bwd", ["scan_bwd_cluster16", "scan_bwd_sum_partials"],
       "mamba_ssm's small block: 12 clusters of 16, 2 groups a block (the exchange adds)", batch=4, dim=1536,
       L=130, dstate=16, dtype=BF16),
    _c("scan_bwd_cluster8", "scan_bwd", ["scan_bwd_cluster8", "scan_bwd_sum_partials"], "one cluster of 8",
       batch=1, dim=128, L=200, dstate=16, dtype=F32),
    _c("scan_bwd_spaced", "scan_bwd", ["scan_bwd_cluster16", "scan_bwd_spaced", "scan_bwd_sum_partials"],
       "states 1024 apart in pairs, 2 segments in one pass", batch=1, dim=256, L=1100, dstate=16, dtype=F32,
       state_steps=1024, state_pairs=True),
    _c("scan_bwd_windows", "scan_bwd", ["scan_bwd_cluster8", "scan_bwd_windows", "scan_bwd_sum_partials"],
       "states 1024 apart, 3 windows, the last chunk one step", batch=1, dim=128, L=2049, dstate=16,
       dtype=BF16, state_steps=1024),
    _c("scan_bwd_windows_row", "scan_bwd", ["scan_bwd_lanes", "scan_bwd_windows", "scan_bwd_sum_partials"],
       "windows without clusters", batch=1, dim=40, L=2049, dstate=16, dtype=F32, state_steps=1024,
       state_pairs=True),
    _c("scan_bwd_classic_real", "scan_bwd", ["scan_bwd_classic_real", "scan_bwd_sum_partials"], "dstate 32",
       batch=2, dim=24, L=130, dstate=32, dtype=BF16),
    _c("scan_bwd_classic_complex", "scan_bwd", ["scan_bwd_classic_complex", "scan_bwd_sum_partials"],
       "complex A, fixed C", batch=1, dim=32, L=97, dstate=8, dtype=F32, cplx=True, var_c=False),
    # ---- decode (selective_state_update): sizes are (batch, nheads or None, dim, dstate)
    _c("decode_generic_one", "decode", ["decode_generic_one"], "dstate 17 (a partial chunk)",
       batch=3, nheads=2, dim=33, dstate=17, state=F32),
    _c("decode_generic_pair", "decode", ["decode_generic_pair"], "bf16 A: the generic kernel, pair",
       batch=2, nheads=None, dim=8192, dstate=128, state=F32, act=BF16, A=BF16),
    _c("decode_generic_wide", "decode", ["decode_generic_wide"], "fp32 state, dstate 256, mixed dtypes",
       batch=2, nheads=None, dim=40, dstate=256, state=F32, act=F16, dt=F32),
    _c("decode_typed_one", "decode", ["decode_typed_one"], "batch past the lean kernel's grid (65535)",
       batch=65536, nheads=None, dim=1, dstate=16, state=F32, act=F32),
    _c("decode_typed_pair", "decode", ["decode_typed_pair"], "batch past 65535, pair", batch=65537,
       nheads=None,
       dim=4, dstate=16, state=BF16, act=BF16),
    _c("decode_typed_wide", "decode", ["decode_typed_wide"], "fp32 state, dstate 256", batch=3, nheads=2,
       dim=24,
       dstate=256, state=F32, act=BF16),
    _c("decode_lean_p1", "decode", ["decode_lean_p1"], "x, dt, z two apart along the channels", batch=1,
       nheads=None, dim=96, dstate=16, state=F32, act=BF16, strided=True),
    _c("decode_lean_p2", "decode", ["decode_lean_p2"], "16-bit state, 33792 rows, A broadcast (Mamba-2)",
       batch=4, nheads=8, dim=1056, dstate=16, state=BF16, act=BF16, A_bcast=True),
    _c("decode_lean_p4", "decode", ["decode_lean_p4"], "fp32 state, 33792 rows, strided x", batch=4,
       nheads=None,
       dim=8448, dstate=16, state=F32, act=BF16, strided=True),
    _c("decode_row_idx", "decode", ["decode_row"], "heads and slot indices with a padded row", batch=3,
       nheads=4, dim=96, dstate=16, state=F16, act=BF16, slots=6),
    _c("decode_row_mamba1", "decode", ["decode_row_mamba1"], "Mamba-1's step, a part warp", batch=5,
       nheads=None,
       dim=100, dstate=16, state=F32, act=BF16),
    _c("decode_row_mamba1_bf16", "decode", ["decode_row_mamba1"], "Mamba-1's step, bf16 state", batch=1,
       nheads=None, dim=96, dstate=16, state=BF16, act=BF16),
    # ---- the gated norm: (rows, ngroups * group_size); "bwd" runs the forward, then the backward
    _c("norm_fwd_bench_groups", "norm", ["norm_fwd_vec"], "Mamba-2's groups of 640, gate after, RMS",
       rows=67, group_size=640, ngroups=8, dtype=BF16, z=True, rms=True),
    _c("norm_fwd_odd_layer", "norm", ["norm_fwd_scalar"], "group of 77 (no vector), LayerNorm, gate first",
       rows=9, group_size=77, ngroups=3, dtype=F16, z=True, nbg=False, rms=False, bias=True),
    _c("norm_fwd_team256", "norm", ["norm_fwd_vec"], "16 KiB groups: 8-warp teams, the block barrier",
       rows=5, group_size=4096, ngroups=2, dtype=F32, rms=False, bias=True, strided=True),
    _c("norm_bwd_groups", "norm", ["norm_fwd_vec", "norm_bwd_vec", "norm_bwd_reduce"],
       "groups of 640, gate after, RMS, recomputed output", rows=300, group_size=640, ngroups=2, dtype=BF16,
       z=True, rms=True, bwd=True, recompute=True),
    _c("norm_bwd_odd_layer", "norm", ["norm_fwd_scalar", "norm_bwd_scalar", "norm_bwd_reduce"],
       "group of 99, LayerNorm with bias, gate first, fp16 weight", rows=41, group_size=99, ngroups=2,
       dtype=F32, z=True, nbg=False, rms=False, bias=True, wtype=F16, bwd=True),
    _c("norm_bwd_team512", "norm", ["norm_fwd_vec", "norm_bwd_vec", "norm_bwd_reduce"],
       "one 16 KiB group: a 512-thread backward team", rows=6, group_size=8192, ngroups=1, dtype=BF16,
       z=True, rms=False, bias=True, bwd=True),
    # ---- Mamba-2 SSD forward: (batch, seqlen, nheads, headdim, ngroups, dstate, chunk)
    _c("ssd_fwd_bf16", "ssd_fwd", SSD16,
       "3 chunks of 128 (short last), 2 groups, z, D per channel, initial states, seq_idx, dt_bias",
       batch=2, L=300, nheads=4, headdim=64, ngroups=2, dstate=64, chunk=128, dtype=BF16, z=True,
       D="channel", init=True, seq_idx=True),
    _c("ssd_fwd_f16_partial_tiles", "ssd_fwd", _ssd16("1"),
       "headdim 37, dstate 81: partial channel and state tiles, an odd state (one element a thread "
       "in the state passing); x a strided slice; chunk 64",
       batch=1, L=150, nheads=2, headdim=37, ngroups=1, dstate=81, chunk=64, dtype=F16, strided=True),
    _c("ssd_fwd_f32", "ssd_fwd",
       ["ssd_fwd_cb_f32", "ssd_fwd_state_f32", "ssd_fwd_pass_vec", "ssd_fwd_scan_f32"],
       "chunk 256 and one step past it, dstate 16, z", batch=2, L=257, nheads=2, headdim=32, ngroups=1,
       dstate=16, chunk=256, dtype=F32, z=True),
    _c("ssd_fwd_varlen_bf16", "ssd_fwd",
       SSD16[:3] + ["ssd_fwd_varlen_16bit", "ssd_fwd_scan_16bit"],
       "cu_seqlens: 4 packed sequences (one empty, one on a chunk boundary), initial states",
       batch=1, L=300, nheads=2, headdim=64, ngroups=1, dstate=64, chunk=64, dtype=BF16, init=True,
       cu_seqlens=(0, 70, 70, 128, 300)),
    _c("ssd_fwd_varlen_f32", "ssd_fwd",
       ["ssd_fwd_cb_f32", "ssd_fwd_state_f32", "ssd_fwd_pass_vec", "ssd_fwd_varlen_f32", "ssd_fwd_scan_f32"],
       "cu_seqlens, int64 offsets", batch=1, L=100, nheads=2, headdim=32, ngroups=1, dstate=16, chunk=64,
       dtype=F32, cu_seqlens=(0, 33, 100), cu_int64=True),
    # ---- Mamba-2 SSD backward (the forward first, then the backward with its recomputation)
    _c("ssd_bwd_bf16", "ssd_bwd", _ssd_bwd_kinds("16bit", dbc_sum=True),
       "3 chunks of 128 (short last), 2 groups of 2 heads, z, D per channel, initial / final states, seq_idx",
       batch=2, L=300, nheads=4, headdim=64, ngroups=2, dstate=64, chunk=128, dtype=BF16, z=True,
       D="channel", init=True, seq_idx=True, dfinal=True),
    _c("ssd_bwd_f16_partial_tiles", "ssd_bwd", _ssd_bwd_kinds("16bit", "1", dbc_sum=True),
       "headdim 37, dstate 81: partial channel and state tiles, an odd state; x a strided slice; chunk 64",
       batch=1, L=150, nheads=2, headdim=37, ngroups=1, dstate=81, chunk=64, dtype=F16, strided=True),
    _c("ssd_bwd_f32", "ssd_bwd", _ssd_bwd_kinds("f32", dbc_sum=True),
       "chunk 256 and one step past it, dstate 16, z, 8 heads in one group", batch=2, L=257, nheads=8,
       headdim=32, ngroups=1, dstate=16, chunk=256, dtype=F32, z=True, dfinal=True),
]


def select(cases: Sequence[Case], families: Optional[Sequence[str]] = None,
           names: Optional[Sequence[str]] = None) -> List[Case]:
    out = [c for c in cases if not families or c.family in families]
    if names:
        known = {c.name for c in cases}
        bad = [n for n in names if n not in known]
        if bad:
            raise SystemExit(f"unknown case(s): {', '.join(bad)}")
        out = [c for c in out if c.name in names]
    return out


# ---------------------------------------------------------------- the launchers' choices, restated

# From csrc/selective_scan/scan_policy.cuh, csrc/causal_conv1d/conv_common.cuh and the .cu files;
# tests/test_sanitize_script.py compares each with the source.
POLICY = {
    "kLanes": 16,
    "kMinFwdWarpsPerSm": 11,
    "kFwdLanesThreads": 128,
    "kFwdLanesMinBlocks1": 4,  # FwdLanesPolicy<1>::kMinBlocks at 128 threads
    "kLaneThreads": 256,  # LanePolicy::kThreads (the lane backward's block)
    "kBwdBlocksPerSm": 2,
    "kFwdThreads": 128,
    "kSliceFloats": 8,
    "kMinWarpsPerSm": 4,
    "kTargetWarpsPerSm": 8,
    "kMinSegment": 1024,
    "kChunk": 64,
    "kMaxStateShift": 4,
    "kBwdCarry": 6,
    "kPairMinThreadsPerSm": 1984,
    "kMaxLanes": 32,
    "kLeanFullRowsPerSm": 256,  # the decode step's thresholds: per SM, times the GPU's SMS
    "kLeanQuadMaxRowsPerSm": 4096,
    "kRowMaxRowsPerSm": 4096,
    "kMaxGridYZ": 65535,
    "kVecCL": 4,  # causal_conv1d BwdPolicy
    "kVecCLLean": 2,
    "kSsdPassVec": 4,  # csrc/ssd/ssd_policy.cuh SsdPassPolicy::kVec
    "kSsdDbcBlocksPerSm": 12,  # SsdDbcPolicy::kBlocksPerSm
}
# Clusters the H100 SXM held (docs/SCAN.md, "Rows per cluster"): a lower bound for the H200's.
CLUSTER_CAPACITY = {16: 14, 8: 30}
_SIZE = {F32: 4, F16: 2, BF16: 2}


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _vec16(dtype: str) -> int:
    return 16 // _SIZE[dtype]


def predict_conv(c: Case) -> List[str]:
    p = c.params
    fam, layout = c.family, p.get("layout", "cf")
    states = p.get("init") or p.get("final") or p.get("dfinal")
    if fam == "conv_update":
        lean = not p.get("cache_seqlens") and p["state_len"] in (p["width"] - 1, p["width"])
        if not lean:
            return ["conv_update_general"]
        return ["conv_update_shift_wm1" if p["state_len"] == p["width"] - 1 else "conv_update_shift_w"]
    seq = bool(p.get("seq_idx"))
    # every case's x, out, dout and dx are contiguous in their layout (vector access)
    lean_common = not seq and not states
    if fam == "conv_fwd":
        if layout == "cl":
            if lean_common and p["dim"] % _vec16(p["dtype"]) == 0:
                return ["conv_fwd_cl_tile"]
            return ["conv_fwd_cl_seq" if seq else "conv_fwd_cl"]
        if lean_common and p["L"] % _vec16(p["dtype"]) == 0:
            return ["conv_fwd_cf_lean"]
        return ["conv_fwd_cf_seq" if seq else "conv_fwd_cf"]
    silu = "_silu" if p.get("silu", True) else ""
    # channel-last backward: vector access needs dim a multiple of BwdPolicy::kVecCL, the lean
    # kernel of kVecCLLean
    cl_vec = p["dim"] % POLICY["kVecCL"] == 0 and p["dim"] % POLICY["kVecCLLean"] == 0
    if layout == "cl" and lean_common and cl_vec:
        kinds = ["conv_bwd_cl_lean" + silu]
    elif layout == "cf" and lean_common and p["L"] % _vec16(p["dtype"]) == 0:
        kinds = ["conv_bwd_cf_lean" + silu]
    elif layout == "cl":
        kinds = ["conv_bwd_cl_seq" if seq else "conv_bwd_cl"]
    else:
        kinds = ["conv_bwd_cf_seq" if seq else "conv_bwd_cf"]
    if p.get("deterministic"):
        kinds.append("conv_bwd_reduce")
    return kinds


def lanes_states_per_lane(batch: int, dim: int, ngroups: int = 1, sms: int = SMS) -> int:
    """fwd_lanes.cu, lanes_states_per_lane."""
    P = POLICY
    want = sms * P["kMinFwdWarpsPerSm"] * 32
    channels = batch * dim
    if channels * (P["kLanes"] // 4) >= want:
        return 4
    if channels * (P["kLanes"] // 2) >= want:
        return 2
    ch_per_block = P["kFwdLanesThreads"] // P["kLanes"]  # FwdLanesPolicy<1>::kCh
    blocks = _ceil(dim // ngroups, ch_per_block) * batch * ngroups
    return 2 if blocks > sms * P["kFwdLanesMinBlocks1"] else 1


def fwd_segments(batch: int, dim: int, L: int, dstate: int, cplx: bool, sms: int = SMS) -> int:
    """fwd.cu, fwd_segments and the rounding in launch_fwd."""
    P = POLICY
    tpr = _pow2_at_least(_ceil(dstate, P["kSliceFloats"] // (2 if cplx else 1)))
    warps = batch * dim * tpr // 32 + 1
    if warps >= sms * P["kMinWarpsPerSm"]:
        return 1
    want = _ceil(sms * P["kTargetWarpsPerSm"], warps)
    most = L // P["kMinSegment"]
    nseg = want if want < most else (most if most > 1 else 1)
    seg_len = _ceil(_ceil(L, nseg), P["kChunk"]) * P["kChunk"]
    return _ceil(L, seg_len)


def bwd_lanes_layout(batch: int, dim: int, ngroups: int, var_b: bool, var_c: bool, sms: int = SMS,
                     capacity: Optional[Dict[int, int]] = None) -> Tuple[int, int, int]:
    """bwd_lanes.cu, lanes_bwd_args: (groups a block, row blocks, blocks a cluster)."""
    capacity = CLUSTER_CAPACITY if capacity is None else capacity
    P = POLICY
    channels = P["kLaneThreads"] // P["kLanes"]
    groups = _ceil(dim // ngroups, channels)
    bg = batch * ngroups
    rows = _ceil(sms * P["kBwdBlocksPerSm"], bg)
    rows = max(1, min(rows, groups))
    gpb = _ceil(groups, rows)
    row_blocks = _ceil(groups, gpb)
    cluster = 1
    if var_b and var_c and groups % gpb == 0:
        for cs in (16, 8):
            if row_blocks % cs == 0 and bg * (row_blocks // cs) <= capacity.get(cs, 0):
                cluster = cs
                break
    return gpb, row_blocks, cluster


def predict_scan(c: Case) -> List[str]:
    p = c.params
    batch, dim, L, N = p["batch"], p["dim"], p["L"], p["dstate"]
    cplx, ng = bool(p.get("cplx")), int(p.get("groups", 1))
    var_b, var_c = p.get("var_b", True), p.get("var_c", True)
    lanes = not cplx and 1 <= N <= POLICY["kLanes"]
    if c.family == "scan_fwd":
        if lanes:
            s = lanes_states_per_lane(batch, dim, ng)
            return [f"scan_fwd_lanes_s{s}" + ("" if var_b and var_c else "_fixed")]
        kinds = ["scan_fwd_classic_complex" if cplx else "scan_fwd_classic_real"]
        if fwd_segments(batch, dim, L, N, cplx) > 1:
            kinds.append("scan_fwd_classic_segments")
        return kinds
    if not lanes:
        return ["scan_bwd_classic_complex" if cplx else "scan_bwd_classic_real", "scan_bwd_sum_partials"]
    _, row_blocks, cluster = bwd_lanes_layout(batch, dim, ng, var_b, var_c)
    if cluster > 1:
        kinds = [f"scan_bwd_cluster{cluster}"]
    else:
        kinds = ["scan_bwd_lanes" if var_b and var_c else "scan_bwd_lanes_fixed"]
    steps = int(p.get("state_steps", POLICY["kChunk"]))
    if steps > POLICY["kChunk"]:  # bwd.cu, bwd_window_chunks
        per = steps // POLICY["kChunk"]
        if _ceil(L, POLICY["kChunk"]) > per:
            per_step = batch * ng * (row_blocks // cluster) * N * (int(var_b) + int(var_c))
            carry = batch * dim * POLICY["kLanes"] * POLICY["kBwdCarry"]
            windows = per_step * per * POLICY["kChunk"] + carry < per_step * L
            kinds.append("scan_bwd_windows" if windows else "scan_bwd_spaced")
        else:
            kinds.append("scan_bwd_spaced")
    return kinds + ["scan_bwd_sum_partials"]


def predict_decode(c: Case, sms: int = SMS) -> List[str]:
    """update.cu (launch_for_state, shape_for, lean_fits, row_fits), update_row.cu (row_is_mamba1)
    and update_lean.cu (launch_lean), on a GPU of ``sms`` multiprocessors."""
    p = c.params
    P = POLICY
    batch, nheads, dim, N = p["batch"], p.get("nheads"), p["dim"], p["dstate"]
    heads = 1 if nheads is None else nheads
    state, act = p["state"], p.get("act", F32)
    V = 16 // _SIZE[state]
    chunks = _ceil(N, V)
    lanes = _pow2_at_least(min(chunks, P["kMaxLanes"]))
    if chunks > P["kMaxLanes"]:
        mode = "wide"
    elif batch >= 2 and (batch // 2) * heads * dim * lanes >= P["kPairMinThreadsPerSm"] * sms:
        mode = "pair"
    else:
        mode = "one"
    # the cases' state, A, B and C are contiguous (A per state unless A_bcast): vector-readable
    fast = N % V == 0
    typed = fast and p.get("dt", act) == act and p.get("A", F32) == F32
    if not typed:
        return [f"decode_generic_{mode}"]
    lean = mode != "wide" and heads <= P["kMaxGridYZ"] and batch <= P["kMaxGridYZ"]
    if not lean:
        return [f"decode_typed_{mode}"]
    rows = batch * heads * dim
    row = not p.get("A_bcast") and rows <= P["kRowMaxRowsPerSm"] * sms and not p.get("strided")
    if row:
        mamba1 = nheads in (None, 1) and not p.get("slots") and N == 16 and lanes == 16 // V
        return ["decode_row_mamba1" if mamba1 else "decode_row"]
    passes = lanes if lanes > 1 and rows >= P["kLeanFullRowsPerSm"] * sms else 1
    if passes == 1:
        return ["decode_lean_p1"]
    if _SIZE[state] == 4 and passes % 4 == 0 and rows < P["kLeanQuadMaxRowsPerSm"] * sms:
        return ["decode_lean_p4"]
    return ["decode_lean_p2"]


def predict_norm(c: Case) -> List[str]:
    """layernorm_gated fwd.cu / bwd.cu: 16-byte packs when the group holds whole vectors (the
    cases' operands are aligned, their row strides whole vectors), else one element a pack."""
    p = c.params
    mode = "vec" if p["group_size"] % (16 // _SIZE[p["dtype"]]) == 0 else "scalar"
    kinds = [f"norm_fwd_{mode}"]
    if p.get("bwd"):
        kinds += [f"norm_bwd_{mode}", "norm_bwd_reduce"]
    return kinds
def predict_ssd(c: Case) -> List[str]:
    """fwd.cu, launch_typed: C B^T, the chunk states and the chunk scan when batch x chunks > 0,
    state passing always, the varlen states with cu_seqlens."""
    p = c.params
    kind = "f32" if p["dtype"] == F32 else "16bit"
    chunks = p["batch"] * _ceil(p["L"], p["chunk"])
    varlen = [f"ssd_fwd_varlen_{kind}"] if p.get("cu_seqlens") else []
    head = [f"ssd_fwd_cb_{kind}", f"ssd_fwd_state_{kind}"] if chunks else []
    return head + [f"ssd_fwd_pass_{_pass_width(p)}"] + varlen + ([f"ssd_fwd_scan_{kind}"] if chunks else [])


def _pass_width(p: dict) -> str:
    """fwd.cu / bwd.cu: the state passing takes kVec elements a thread when headdim x dstate is a
    multiple of it (our buffers are aligned), else one."""
    return "vec" if p["headdim"] * p["dstate"] % POLICY["kSsdPassVec"] == 0 else "1"


def dbc_splits(p: dict, sms: int = SMS) -> int:
    """bwd.cu, head_splits for chunk_dbc: a group's heads over enough blocks for about
    kSsdDbcBlocksPerSm an SM, one block per (step tile x 64-state tile, group, batch x chunk)
    (step tiles of 64, fp32 32), at most a split a head."""
    tile = 32 if p["dtype"] == F32 else 64
    chunks = p["batch"] * _ceil(p["L"], p["chunk"])
    blocks = _ceil(p["chunk"], tile) * _ceil(p["dstate"], 64) * p["ngroups"] * chunks
    if blocks == 0:
        return 1
    return max(1, min(_ceil(POLICY["kSsdDbcBlocksPerSm"] * sms, blocks), p["nheads"] // p["ngroups"]))


def predict_ssd_bwd(c: Case) -> List[str]:
    """bwd.cu, launch_typed: the gate when there are steps; the chunk kernels when batch x chunks
    > 0 (dbc_sum after chunk_dbc where it splits heads); reverse state passing and the parameter
    sums always."""
    p = c.params
    kind = "f32" if p["dtype"] == F32 else "16bit"
    steps = p["batch"] * p["L"]
    pass_ = f"ssd_bwd_pass_{_pass_width(p)}"
    kinds = _ssd_bwd_kinds(kind, _pass_width(p), dbc_sum=dbc_splits(p) > 1)
    return [k for k in kinds if steps or k in (pass_, "ssd_bwd_sum")]


def predict(c: Case) -> List[str]:
    """The kinds case c reaches on a 132-SM GPU, by the launchers' rules restated above."""
    if c.family.startswith("conv"):
        return predict_conv(c)
    if c.family.startswith("scan"):
        return predict_scan(c)
    if c.family == "norm":
        return predict_norm(c)
    if c.family == "ssd_bwd":
        return predict_ssd_bwd(c)
    if c.family.startswith("ssd"):
        return predict_ssd(c)
    return predict_decode(c)


# ------------------------------------------------------------------------------- running a case


# where the cases' tensors go: "cuda", or "cpu" for tests/test_sanitize_script.py's dry run of the
# inputs through the PyTorch reference functions
DEVICE = "cuda"


def _torch():
    import torch

    return torch


def _dt(name: str):
    return getattr(_torch(), name)


def _rand(*shape, dtype=F32, scale=1.0, shift=0.0, gen=None):
    """Random values made on the CPU and copied over (a copy initialises memory for initcheck)."""
    torch = _torch()
    t = torch.randn(*shape, generator=gen) * scale + shift
    return t.to(_dt(dtype)).to(DEVICE)


def _conv_x(batch, dim, L, dtype, layout, gen):
    if layout == "cl":
        return _rand(batch, L, dim, dtype=dtype, gen=gen).transpose(1, 2)
    return _rand(batch, dim, L, dtype=dtype, gen=gen)


def _seq_idx(batch, L, gen):
    torch = _torch()
    rows = []
    for _ in range(batch):
        cuts = sorted(torch.randperm(L - 1, generator=gen)[:3].add(1).tolist())
        row = torch.zeros(L, dtype=torch.int32)
        for cut in cuts:
            row[cut:] += 1
        row[L - max(L // 7, 1):] = -1  # padding
        rows.append(row)
    return torch.stack(rows).to(DEVICE)


def run_conv(c: Case, gen, _ops=None) -> None:
    torch = _torch()
    if _ops is None:
        from causal_conv1d import _ops

    p = c.params
    batch, dim, W, dtype = p["batch"], p["dim"], p["width"], p["dtype"]
    w = _rand(dim, W, scale=1.0 / W, gen=gen)
    b = _rand(dim, gen=gen)
    if c.family == "conv_update":
        L, slen = p["L"], p["state_len"]
        entries = 2 * batch if p.get("indices") else batch
        state = _rand(entries, slen, dim, dtype=dtype, gen=gen).transpose(1, 2)
        x = _rand(batch, dim, L, dtype=dtype, gen=gen)
        cache = torch.randint(0, 1000, (batch,), generator=gen, dtype=torch.int32).to(DEVICE) \
            if p.get("cache_seqlens") else None
        idx = None
        if p.get("indices"):
            perm = torch.randperm(entries, generator=gen)[:batch].to(torch.int32)
            perm[1] = -1  # a padded row
            idx = perm.to(DEVICE)
        _ops.update(x, state, w, b, True, cache, idx)
        return
    L, layout = p["L"], p.get("layout", "cf")
    x = _conv_x(batch, dim, L, dtype, layout, gen)
    seq = _seq_idx(batch, L, gen) if p.get("seq_idx") else None
    init = _rand(batch, W - 1, dim, dtype=dtype, gen=gen).transpose(1, 2) if p.get("init") else None
    silu = bool(p.get("silu", True))
    if c.family == "conv_fwd":
        fs = torch.empty(batch, W - 1, dim, device=DEVICE, dtype=_dt(dtype)).transpose(1, 2) \
            if p.get("final") else None
        _ops.fwd(x, w, b, seq, init, fs, silu)
        return
    dout = _conv_x(batch, dim, L, dtype, layout, gen)
    dfs = _rand(batch, dim, W - 1, dtype=dtype, gen=gen) if p.get("dfinal") else None
    det = bool(p.get("deterministic"))
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(det)
    try:
        _ops.bwd(x, w, b, dout, seq, init, dfs, None, init is not None, silu)
    finally:
        torch.use_deterministic_algorithms(before)


def run_scan(c: Case, gen, _ops=None) -> None:
    torch = _torch()
    if _ops is None:
        from selective_scan import _ops

    p = c.params
    batch, dim, L, N, dtype = p["batch"], p["dim"], p["L"], p["dstate"], p["dtype"]
    cplx, ng = bool(p.get("cplx")), int(p.get("groups", 1))
    lf = 2 * L if cplx else L
    u = _rand(batch, dim, L, dtype=dtype, gen=gen)
    delta = _rand(batch, dim, L, dtype=dtype, scale=0.5, shift=-2.0, gen=gen)
    A = -torch.exp(0.5 * torch.randn(dim, N, generator=gen))
    if cplx:
        A = torch.complex(A, 3.0 * torch.randn(dim, N, generator=gen))
    A = A.to(DEVICE)
    wdt = "complex64" if cplx else F32

    def bc(var):
        if var:
            return _rand(batch, ng, N, lf, dtype=dtype, gen=gen)
        t = torch.randn(dim, N, generator=gen)
        return (torch.complex(t, torch.randn(dim, N, generator=gen)) if cplx else t).to(_dt(wdt)).to(DEVICE)

    B, C = bc(p.get("var_b", True)), bc(p.get("var_c", True))
    D, bias = _rand(dim, gen=gen), _rand(dim, scale=0.3, gen=gen)
    z = _rand(batch, dim, L, dtype=dtype, gen=gen) if p.get("z", True) else None
    steps = int(p.get("state_steps", 64))
    pairs = bool(p.get("state_pairs"))
    count = -1
    if pairs:
        need = _ceil(L, steps)
        count = need + need % 2
    out, out_z, ckpt = _ops.fwd(u, delta, A, B, C, D, z, bias, True, True, steps, count, pairs)
    if c.family == "scan_fwd":
        return
    dout = _rand(batch, dim, L, dtype=dtype, gen=gen)
    dz = torch.empty_like(u) if z is not None else torch.empty(0, device=DEVICE, dtype=u.dtype)
    oz = torch.empty_like(u) if z is not None else torch.empty(0, device=DEVICE, dtype=u.dtype)
    _ops.bwd(u, delta, A, B, C, D, z, bias, dout, ckpt, out, dz, oz, True, steps, pairs)


def run_decode(c: Case, gen, _update_ops=None) -> None:
    torch = _torch()
    if _update_ops is None:
        from selective_scan import _update_ops

    p = c.params
    batch, nheads, dim, N = p["batch"], p.get("nheads"), p["dim"], p["dstate"]
    act, state_dt = p.get("act", F32), p["state"]
    h = [] if nheads is None else [nheads]
    g = [] if nheads is None else [1]
    slots = p.get("slots") or batch
    state = _rand(slots, *h, dim, N, dtype=state_dt, gen=gen)

    def strided(t):
        if not p.get("strided"):
            return t
        big = torch.empty(*t.shape, 2, device=DEVICE, dtype=t.dtype)
        big.copy_(torch.stack([t, t], -1))
        return big[..., 0]

    x = strided(_rand(batch, *h, dim, dtype=act, gen=gen))
    dt = strided(_rand(batch, *h, dim, dtype=p.get("dt", act), scale=0.5, gen=gen))
    z = strided(_rand(batch, *h, dim, dtype=act, gen=gen))
    if p.get("A_bcast"):
        A = (-torch.rand(*h, 1, 1, generator=gen) - 0.1).to(DEVICE).expand(*h, dim, N)
    else:
        A = (-torch.rand(*h, dim, N, generator=gen) - 0.1).to(_dt(p.get("A", F32))).to(DEVICE)
    B = _rand(batch, *g, N, dtype=act, gen=gen)
    C = _rand(batch, *g, N, dtype=act, gen=gen)
    D = _rand(*h, dim, gen=gen)
    dt_bias = _rand(*h, dim, scale=0.5, gen=gen)
    idx = None
    if p.get("slots"):
        perm = torch.randperm(slots, generator=gen)[:batch].to(torch.int32)
        perm[batch // 2] = -1
        idx = perm.to(DEVICE)
    _update_ops.update(state, x, dt, A, B, C, D, z, dt_bias, True, idx)


def run_norm(c: Case, gen, _norm_ops=None) -> None:
    torch = _torch()
    if _norm_ops is None:
        from selective_scan import _norm_ops

    p = c.params
    rows, gs, dtype = p["rows"], p["group_size"], p["dtype"]
    n = gs * p["ngroups"]
    rms, nbg = bool(p.get("rms", True)), bool(p.get("nbg", True))
    wtype = p.get("wtype", F32)

    def act():
        if not p.get("strided"):
            return _rand(rows, n, dtype=dtype, gen=gen)
        return _rand(rows, n + 16, dtype=dtype, gen=gen)[:, 8:8 + n]  # rows 16 elements apart

    x = act()
    z = act() if p.get("z") else None
    w = _rand(n, dtype=wtype, scale=0.3, shift=1.0, gen=gen)
    b = _rand(n, dtype=wtype, scale=0.3, gen=gen) if p.get("bias") else None
    out = torch.empty(rows, n, device=DEVICE, dtype=_dt(dtype))
    stats = rows * p["ngroups"]
    mean = None if rms else torch.empty(stats, device=DEVICE)
    rstd = torch.empty(stats, device=DEVICE)
    _norm_ops.fwd(x, w, b, z, out, mean, rstd, 1e-5, gs, nbg, rms)
    if not p.get("bwd"):
        return
    dy = act()
    dx = torch.empty_like(out)
    dz = torch.empty_like(out) if z is not None else None
    recomputed = torch.empty_like(out) if p.get("recompute") else None
    dw = torch.empty(n, device=DEVICE, dtype=_dt(wtype))
    db = torch.empty(n, device=DEVICE, dtype=_dt(wtype)) if b is not None else None
    _norm_ops.bwd(dy, x, w, b, z, mean, rstd, dx, dz, recomputed, dw, db, 1e-5, gs, nbg, rms)
def run_ssd(c: Case, gen, _ssd_ops=None) -> None:
    torch = _torch()
    if _ssd_ops is None:
        from selective_scan import _ssd_ops

    p = c.params
    batch, L, H, P, G, N = p["batch"], p["L"], p["nheads"], p["headdim"], p["ngroups"], p["dstate"]
    dtype = p["dtype"]
    if p.get("strided"):  # x every other channel of a wider tensor (a non-unit last stride)
        x = _rand(batch, L, H, 2 * P, dtype=dtype, gen=gen)[..., ::2]
    else:
        x = _rand(batch, L, H, P, dtype=dtype, gen=gen)
    dt = _rand(batch, L, H, scale=0.5, shift=-1.0, gen=gen)
    A = -torch.exp(0.5 * torch.randn(H, generator=gen)).to(DEVICE)
    B = _rand(batch, L, G, N, dtype=dtype, gen=gen)
    C = _rand(batch, L, G, N, dtype=dtype, gen=gen)
    D = _rand(H, P, gen=gen) if p.get("D") == "channel" else _rand(H, gen=gen)
    z = _rand(batch, L, H, P, dtype=dtype, gen=gen) if p.get("z") else None
    init = _rand(batch, H, P, N, gen=gen) if p.get("init") else None
    seq, cu = None, None
    if p.get("seq_idx"):  # nondecreasing, two boundaries a row (one inside a chunk)
        row = torch.zeros(L, dtype=torch.int32)
        row[L // 3:] += 1
        row[L - 5:] += 1
        seq = row.expand(batch, L).contiguous().to(DEVICE)
    kw = {}
    if p.get("cu_seqlens"):  # packed sequences (batch 1) and the seq_idx that marks them
        offsets = torch.tensor(p["cu_seqlens"])
        seq = torch.repeat_interleave(torch.arange(len(offsets) - 1), offsets.diff()).to(torch.int32)[None]
        seq = seq.to(DEVICE)
        cu = offsets.to(torch.int64 if p.get("cu_int64") else torch.int32).to(DEVICE)
        kw["cu_seqlens"] = cu
    dt_bias = _rand(H, scale=0.3, gen=gen)
    res = _ssd_ops.ssd_forward_cuda(x, dt, A, B, C, p["chunk"], D=D, z=z, dt_bias=dt_bias,
                                    initial_states=init, seq_idx=seq, dt_softplus=True, dt_limit=(0.0, 2.0),
                                    **kw)
    if c.family == "ssd_bwd":
        dout = _rand(batch, L, H, P, dtype=dtype, gen=gen)
        dfinal = _rand(batch, H, P, N, gen=gen) if p.get("dfinal") else None
        y = res[1] if z is not None else res[0]
        _ssd_ops.ssd_backward_cuda(dout, x, dt, A, B, C, y, p["chunk"], D=D, z=z, dt_bias=dt_bias,
                                   initial_states=init, dfinal_states=dfinal, seq_idx=seq, dt_softplus=True,
                                   dt_limit=(0.0, 2.0))


RUNNERS: Dict[str, Callable] = {
    "conv_fwd": run_conv, "conv_bwd": run_conv, "conv_update": run_conv,
    "scan_fwd": run_scan, "scan_bwd": run_scan, "decode": run_decode, "norm": run_norm,
    "ssd_fwd": run_ssd, "ssd_bwd": run_ssd,
}


def run_cases(cases: Sequence[Case]) -> int:
    torch = _torch()
    os.environ.setdefault("MAMBA_KERNELS_BACKEND", "cuda")
    for c in cases:
        gen = torch.Generator().manual_seed(sum(map(ord, c.name)))
        t0 = time.time()
        RUNNERS[c.family](c, gen)
        torch.cuda.synchronize()
        print(f"case {c.name} ran in {time.time() - t0:.1f} s", flush=True)
    if os.environ.get("SANITIZE_FAST_EXIT") == "1":
        # skip the interpreter's and torch's teardown (a test of the teardown hypothesis in
        # docs/KERNELS.md, "Sanitizer checks"); the CUDA context goes with the process
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def verify_cases(cases: Sequence[Case]) -> int:
    """Run each case under torch.profiler (CUPTI; never under a sanitizer) and check that it
    launched a kernel matching each of its kinds' patterns."""
    torch = _torch()
    os.environ.setdefault("MAMBA_KERNELS_BACKEND", "cuda")
    bad = 0
    for c in cases:
        gen = torch.Generator().manual_seed(sum(map(ord, c.name)))
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            RUNNERS[c.family](c, gen)
            torch.cuda.synchronize()
        launched = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        ours = [n for n in launched if "mamba_kernels" in n]
        missing = []
        for k in c.kinds:
            lo, hi = KINDS[k].launches
            n = sum(bool(re.search(KINDS[k].kernel, name)) for name in ours)
            if not lo <= n <= hi:
                missing.append(f"{k} ({n} launches)")
        ours = sorted(set(ours))
        verdict = "ok" if not missing else "MISSING " + ",".join(missing)
        print(f"verify {c.name}: {verdict}: {'; '.join(ours)}",
              flush=True)
        bad += bool(missing)
    return 1 if bad else 0


# ------------------------------------------------------------------------ under compute-sanitizer


def find_sanitizer() -> Optional[str]:
    for cand in (os.environ.get("COMPUTE_SANITIZER"), shutil.which("compute-sanitizer"),
                 "/usr/local/cuda/bin/compute-sanitizer"):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def sanitizer_output(sanitizer: str, flag: str) -> str:
    """What `compute-sanitizer FLAG` (--help, --version) prints; empty when it cannot run."""
    try:
        return subprocess.run([sanitizer, flag], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=60, errors="replace").stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def sanitizer_args(tool: str, help_text: str = "", print_limit: int = 20) -> List[str]:
    """compute-sanitizer's options for one tool. An option this compute-sanitizer's --help does
    not list is left out (with help_text empty, nothing is left out)."""
    def has(opt: str) -> bool:
        return not help_text or opt in help_text

    args = ["--tool", tool, "--error-exitcode", "99", "--target-processes", "all"]
    if has("--print-limit"):
        args += ["--print-limit", str(print_limit)]
    # Only our kernels: every one is in namespace mamba_kernels, so its mangled name holds that
    # substring ("_ZN13mamba_kernels..."), and torch's (copies, fills) run unchecked. initcheck
    # checks every kernel: a write by an unchecked kernel would not count as initialising memory.
    filt = os.environ.get("SANITIZE_KERNEL_FILTER", "kns=mamba_kernels")
    if tool != "initcheck" and filt and has("--kernel-name"):
        args += ["--kernel-name", filt]
    if tool == "racecheck" and has("--racecheck-report"):
        args += ["--racecheck-report", os.environ.get("SANITIZE_RACECHECK_REPORT", "all")]
    return args


_SUMMARY = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+error")
_RACE = re.compile(
    r"RACECHECK SUMMARY:\s*(\d+)\s+hazards? displayed\s*\((\d+)\s+errors?,\s*(\d+)\s+warnings?"
)
# the first frame of a reported error: "=========     at void ns::kernel<...>(...)+0x1a0 in file.cu:12"
_FRAME = re.compile(r"^=+\s+at\s+(.*?)(?:\+0x[0-9a-f]+)?(?:\s+in\s+\S+)?$")
_HEADER = re.compile(r"^=+\s+(?:Invalid|Uninitialized|Barrier|Race|Error|Warning|Malloc|Address|Misaligned|"
                     r"Program hit|Out-of-range|Cluster|Illegal|Divergent)", re.IGNORECASE)


@dataclass
class Outcome:
    tool: str
    family: str
    cases: List[str]
    rc: int
    errors: int  # reported by the tool, less those printed in torch's own kernels; -1: no summary
    other: int  # errors printed in kernels not ours (initcheck checks torch's too)
    warnings: int
    ran: int  # cases that finished ("case NAME ran")
    seconds: float
    log: str
    status: str = ""

    @property
    def ok(self) -> bool:
        return self.status.startswith("clean") or self.status == NOT_RUN_DEFECT


def parse_counts(text: str) -> Tuple[int, int, int]:
    """(errors ours, errors printed in other kernels, racecheck warnings); errors -1 when the
    tool printed no summary (the process died before the tool could report)."""
    errs = [int(m) for m in _SUMMARY.findall(text)]
    race = _RACE.findall(text)
    warnings = sum(int(r[2]) for r in race)
    if not errs and not race:
        return -1, 0, warnings
    total = max(errs + [int(r[1]) for r in race])
    other = 0
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not _HEADER.match(line):
            continue
        for nxt in lines[i + 1:i + 12]:
            m = _FRAME.match(nxt)
            if m:
                other += "mamba_kernels" not in m.group(1)
                break
    other = min(other, total)
    return total - other, other, warnings


def run_one(sanitizer: str, sargs: List[str], tool: str, family: str, cases: List[str], logdir: str,
            timeout: float, tag: str) -> Outcome:
    cmd = [sanitizer, *sargs, sys.executable, os.path.abspath(__file__), "run", *cases]
    left = _DEADLINE[0] - time.time()
    if left < 5:  # the run's budget is spent: not started, and said so
        return Outcome(tool, family, cases, -1, -1, 0, 0, 0, 0.0, "", "not run (budget spent)")
    timeout = min(timeout, left)
    env = dict(os.environ)
    # every tensor its own cudaMalloc: memcheck then sees the end of each allocation and
    # initcheck memory no kernel wrote (the caching allocator would hand out used blocks)
    env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    env.setdefault("MAMBA_KERNELS_BACKEND", "cuda")
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"
    log = os.path.join(logdir, f"{tool}-{tag}.log")
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout, text=True, errors="replace")
        text, rc = proc.stdout, proc.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout or ""
        text = out.decode(errors="replace") if isinstance(out, bytes) else out
        text += f"\n[timed out after {timeout} s]\n"
        rc = 124
    secs = time.time() - t0
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n" + text)
    errors, other, warnings = parse_counts(text)
    ran = sum(f"case {n} ran" in text for n in cases)
    if rc == 124:
        status = f"timeout ({ran}/{len(cases)} cases ran)"
    elif errors > 0:
        status = "errors"
    elif errors < 0:
        # the process died before the tool reported: during a case, or after all had run
        # (interpreter / CUDA teardown under the tool)
        when = "after its cases ran" if ran == len(cases) else f"in a case ({ran}/{len(cases)} ran)"
        status = f"no summary: died {when}, rc {rc}"
    elif ran != len(cases) or rc != 0:
        status = f"failed (rc {rc}, {ran}/{len(cases)} cases ran)"
    else:
        status = "clean" + (f" ({other} errors in torch's kernels)" if other else "")
    return Outcome(tool, family, cases, rc, errors, other, warnings, ran, secs, log, status)


# when the run's budget ends (time.time()); processes not started by then are reported as not run
_DEADLINE = [float("inf")]


def _pool_run(calls, jobs: int) -> List[Outcome]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futs = [pool.submit(run_one, *c) for c in calls]
        return [f.result() for f in futs]


def verify_step(logdir: str, cases: Sequence[Case], timeout: float) -> Tuple[bool, str]:
    """`verify` in its own process, without a sanitizer (the profiler and the sanitizer must not
    share a process): each case launches the kernels of its kinds on this GPU."""
    cmd = [sys.executable, os.path.abspath(__file__), "verify", *[c.name for c in cases]]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("MAMBA_KERNELS_BACKEND", "cuda")
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout, text=True, errors="replace")
        text, ok = proc.stdout, proc.returncode == 0
    except subprocess.TimeoutExpired:
        text, ok = "[verify timed out]\n", False
    with open(os.path.join(logdir, "verify.log"), "w") as f:
        f.write(text)
    missing = [line for line in text.splitlines() if "MISSING" in line]
    detail = "every case launched its kinds' kernels" if ok else (
        f"{len(missing)} cases missed a kind" if missing else "did not finish: " + text.strip()[-300:])
    return ok, detail


def sanitize(args) -> int:
    sanitizer = find_sanitizer()
    if sanitizer is None:
        print("sanitize: compute-sanitizer not found (PATH, /usr/local/cuda/bin, $COMPUTE_SANITIZER)",
              flush=True)
        return 2
    _DEADLINE[0] = time.time() + args.budget
    help_text = sanitizer_output(sanitizer, "--help")
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    # the logs stay outside `out` (one file a process) and go into it as one archive after each
    # tool, with the summary so far: a run stopped midway still leaves what it found there
    logdir = tempfile.mkdtemp(prefix="sanitize-logs-")
    tools = args.tool or list(TOOLS)
    cases = select(CASES, args.family)
    families = [f for f in FAMILIES if any(c.family == f for c in cases)]
    gpu = _gpu_name()
    version = next((ln.strip() for ln in sanitizer_output(sanitizer, "--version").splitlines()
                    if "ersion" in ln), "")
    print(f"sanitize: {sanitizer} {version}; GPU {gpu}; tools {','.join(tools)}; "
          f"families {','.join(families)}; "
          f"{len(cases)} cases; {args.jobs} processes at a time", flush=True)
    verified = None
    if args.verify:
        t0 = time.time()
        verified = verify_step(logdir, cases, max(30.0, min(args.timeout, _DEADLINE[0] - time.time())))
        print(f"verify: {'ok' if verified[0] else 'FAILED'}: {verified[1]} ({time.time() - t0:.1f} s)",
              flush=True)
    outcomes: List[Outcome] = []
    tool_secs: Dict[str, float] = {}
    for tool in tools:
        sargs = sanitizer_args(tool, help_text)
        print(f"{tool}: compute-sanitizer {' '.join(sargs)}", flush=True)
        calls = []
        skipped = []
        for fam in families:
            names = [c.name for c in cases if c.family == fam and (tool, c.name) not in TOOL_DEFECTS]
            for c in cases:
                if c.family == fam and (tool, c.name) in TOOL_DEFECTS:
                    skipped.append(Outcome(tool, fam, [c.name], 0, 0, 0, 0, 0, 0.0, "",
                                           NOT_RUN_DEFECT))
                    print(f"{tool}: {c.name} not run: {TOOL_DEFECTS[(tool, c.name)]}", flush=True)
            if not names:
                continue
            if tool in ISOLATED_TOOLS or args.isolate:
                calls += [(sanitizer, sargs, tool, fam, [n], logdir, args.timeout, n) for n in names]
            else:
                calls.append((sanitizer, sargs, tool, fam, names, logdir, args.timeout, fam))
        t0 = time.time()
        results = _pool_run(calls, args.jobs)
        # a shared process that died without a summary: its cases again, one a process
        retry = [r for r in results if r.status.startswith("no summary") and len(r.cases) > 1]
        alone = _pool_run([(sanitizer, sargs, tool, r.family, [n], logdir, args.timeout, n)
                           for r in retry for n in r.cases], args.jobs)
        for r in alone:
            r.status += " (rerun alone)"
        for r in retry:
            mine = [a for a in alone if a.cases[0] in r.cases]
            if all(a.ok for a in mine):
                r.status = f"clean one case a process; shared: {r.status}"
        results += alone + skipped
        tool_secs[tool] = time.time() - t0
        for fam in families:
            rs = [r for r in results if r.family == fam]
            errors = sum(max(r.errors, 0) for r in rs)
            bad = [r for r in rs if not r.ok]
            secs = sum(r.seconds for r in rs)
            ncases = sum(c.family == fam for c in cases)
            print(f"{tool:9s} {fam:12s} cases {ncases:3d} errors {errors:4d} seconds {secs:7.1f}"
                  + ("" if not bad else "  " + "; ".join(f"{','.join(r.cases)}: {r.status}" for r in bad)),
                  flush=True)
        print(f"{tool}: {tool_secs[tool]:.1f} s wall", flush=True)
        outcomes += results
        write_summary(out, gpu, version, list(tool_secs), families, cases, outcomes, tool_secs, verified)
        with tarfile.open(os.path.join(out, "sanitize-logs.tar.gz"), "w:gz") as tar:
            tar.add(logdir, arcname="logs")
    print(f"all tools: {sum(tool_secs.values()):.1f} s wall", flush=True)
    shutil.rmtree(logdir, ignore_errors=True)
    failed = any(not o.ok for o in outcomes)
    return 1 if failed or (verified is not None and not verified[0]) else 0


def _gpu_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=30).stdout
        return out.strip().splitlines()[0] if out.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown (no nvidia-smi)"


def write_summary(out, gpu, version, tools, families, cases, outcomes, tool_secs, verified) -> None:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# Sanitizer checks, {now}", "",
             f"GPU: {gpu}; compute-sanitizer: {version or 'version unknown'}; "
             f"{len(cases)} cases; commit {_git_rev()}", ""]
    if verified is not None:
        lines += [f"Kinds reached (verify, torch.profiler, no sanitizer): {'yes' if verified[0] else 'NO'}: "
                  f"{verified[1]}", ""]
    lines += ["| tool | family | cases | errors | processes | status | seconds |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for tool in tools:
        for fam in families:
            rs = [r for r in outcomes if r.tool == tool and r.family == fam]
            errors = sum(max(r.errors, 0) for r in rs)
            statuses = sorted({r.status for r in rs})
            ran = sum(r.status != NOT_RUN_DEFECT for r in rs)
            ncases = sum(c.family == fam for c in cases)
            lines.append(f"| {tool} | {fam} | {ncases} | {errors} | {ran} | "
                         f"{'; '.join(statuses)} | {sum(r.seconds for r in rs):.1f} |")
    lines += ["", "| tool | wall seconds |", "| --- | --- |"]
    lines += [f"| {t} | {s:.1f} |" for t, s in tool_secs.items()]
    lines += [f"| all | {sum(tool_secs.values()):.1f} |", ""]
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(lines))
    with open(os.path.join(out, "summary.tsv"), "w") as f:
        f.write("tool\tfamily\tcases\terrors\tother_errors\twarnings\trc\tstatus\tseconds\n")
        for r in outcomes:
            f.write(f"{r.tool}\t{r.family}\t{','.join(r.cases)}\t{r.errors}\t{r.other}\t{r.warnings}\t{r.rc}\t"
                    f"{r.status}\t{r.seconds:.1f}\n")


def _git_rev() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# --------------------------------------------------------------------------------------- CLI


def list_cases(args) -> int:
    cases = select(CASES, args.family)
    tools = args.tool or list(TOOLS)
    if args.json:
        print(json.dumps([{"name": c.name, "family": c.family, "kinds": list(c.kinds),
                           "predicted": predict(c),
                           "params": c.params, "note": c.note} for c in cases], indent=1))
        return 0
    print(f"tools: {' '.join(tools)} (one process per case: "
          f"{' '.join(t for t in tools if t in ISOLATED_TOOLS) or 'none'}; else one per family)")
    bad = 0
    for c in cases:
        pred = predict(c)
        ok = sorted(pred) == sorted(c.kinds)
        bad += not ok
        shape = " ".join(f"{k}={v}" for k, v in c.params.items())
        mark = "" if ok else "  PREDICTED " + ",".join(pred)
        print(f"{c.family:12s} {c.name:32s} {','.join(c.kinds)}{mark}"
              f"  [{shape}]{'  # ' + c.note if c.note else ''}")
    fams = sorted({c.family for c in cases})
    reached = {k for c in cases for k in c.kinds}
    unreached = [k for k, v in KINDS.items() if v.family in fams and k not in reached]
    print(f"{len(cases)} cases, {len(reached)} kinds reached" + (f"; NOT REACHED: {' '.join(unreached)}"
                                                                 if unreached else ""))
    return 1 if bad or unreached else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p):
        p.add_argument("--tool", action="append", choices=TOOLS, help="repeatable; default: all four")
        p.add_argument("--family", action="append", choices=FAMILIES, help="repeatable; default: all")

    p_list = sub.add_parser("list")
    common(p_list)
    p_list.add_argument("--json", action="store_true")
    for name in ("run", "verify"):
        p = sub.add_parser(name)
        p.add_argument("cases", nargs="*", help="case names (default: all, or those of --family)")
        p.add_argument("--family", action="append", choices=FAMILIES)
    p_san = sub.add_parser("sanitize")
    common(p_san)
    p_san.add_argument("--out", default="sanitize-results")
    p_san.add_argument("--jobs", type=int, default=int(os.environ.get("SANITIZE_JOBS", "4")))
    p_san.add_argument("--timeout", type=float, default=float(os.environ.get("SANITIZE_CASE_TIMEOUT", "300")))
    p_san.add_argument("--isolate", action="store_true", help="one process per case for every tool")
    p_san.add_argument("--budget", type=float, default=float(os.environ.get("SANITIZE_BUDGET", "1e9")),
                       help="seconds for this command; processes not started by then are reported as not run")
    p_san.add_argument("--no-verify", dest="verify", action="store_false",
                       help="skip checking (torch.profiler, no sanitizer) that each case reaches its kinds")
    args = ap.parse_args(argv)
    if args.cmd == "list":
        return list_cases(args)
    if args.cmd == "sanitize":
        return sanitize(args)
    cases = select(CASES, args.family, args.cases or None)
    if REPO not in sys.path:  # this checkout's packages, also without an editable install
        sys.path.insert(0, REPO)
    return run_cases(cases) if args.cmd == "run" else verify_cases(cases)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `list | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
