"""scripts/kernel_diff.py's reading of cuobjdump and ptxas output and its verdicts, on text shaped
like theirs (the compile itself needs nvcc and cuobjdump, which the GPU machine and developers have)."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import kernel_diff as kd  # noqa: E402

SASS = """
Fatbin elf code:
================
arch = sm_90
code version = [1,7]

\tcode for sm_90
\t\tFunction : _ZN2ns6kernelIfEEvv
\t.headerflags\t@"EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                 /* 0x00000a00ff017b82 */
        /*0010*/                   IMAD.MOV.U32 R4, RZ, RZ, R2 ;          /* 0x000000ffff047224 */
        /*0020*/              @P0  BRA 0x40 ;                             /* 0x0000000000000947 */
        /*0030*/                   EXIT ;                                 /* 0x000000000000794d */
\t\t..........

Fatbin elf code:
================
arch = sm_80
\t\tFunction : _ZN2ns6kernelIfEEvv
        /*0000*/                   EXIT ;                                 /* 0x000000000000794d */
"""

PTXAS = """ptxas info    : Compiling entry function '_ZN2ns6kernelIfEEvv' for 'sm_90'
ptxas info    : Function properties for _ZN2ns6kernelIfEEvv
    24 bytes stack frame, 24 bytes spill stores, 40 bytes spill loads
ptxas info    : Used 128 registers, used 0 barriers
ptxas info    : Compiling entry function '_ZN2ns6kernelIfEEvv' for 'sm_80'
ptxas info    : Used 40 registers
"""


def test_parse_sass_reads_each_architectures_kernels():
    got = kd.parse_sass(SASS)
    assert set(got) == {"sm_90 _ZN2ns6kernelIfEEvv", "sm_80 _ZN2ns6kernelIfEEvv"}
    assert got["sm_90 _ZN2ns6kernelIfEEvv"] == ["LDC R1, c[0x0][0x28]", "IMAD.MOV.U32 R4, RZ, RZ, R2",
                                               "@P0 BRA 0x40", "EXIT"]
    assert got["sm_80 _ZN2ns6kernelIfEEvv"] == ["EXIT"]


def test_parse_ptxas_reads_registers_and_spills():
    got = kd.parse_ptxas(PTXAS)
    assert got == {"sm_90 _ZN2ns6kernelIfEEvv": (128, "24/40"), "sm_80 _ZN2ns6kernelIfEEvv": (40, "0/0")}


def test_verdicts():
    a = ["IMAD R4, R2, R3, RZ", "@P0 BRA 0x40", "STG.E desc[UR4][R6.64], R4", "EXIT"]
    assert kd.classify(a, list(a)) == "identical"
    renamed = ["IMAD R8, R2, R3, RZ", "@P0 BRA 0x40", "STG.E desc[UR6][R10.64], R8", "EXIT"]
    assert kd.classify(a, renamed) == "renamed"
    moved = ["@P0 BRA 0x80", "IMAD R8, R2, R3, RZ", "STG.E desc[UR6][R10.64], R8", "EXIT"]
    assert kd.classify(a, moved) == "same-set"
    zero_to_reg = ["IMAD R4, R2, R3, R5", "@P0 BRA 0x40", "STG.E desc[UR4][R6.64], R4", "EXIT"]
    assert kd.classify(a, zero_to_reg).startswith("differs")  # RZ is the zero, not a register to rename
    assert kd.classify(a, ["FFMA R4, R2, R3, RZ"] + a[1:]).startswith("differs (4 -> 4")


def test_plain_names_match_kernels_across_anonymous_namespaces():
    # the anonymous namespace's mangled id depends on the file's path: two compiles, two ids
    body = "16fwd_lanes_kernelIfLi4ELb1EEEvv"
    k1 = "sm_90 _ZN13mamba_kernels14selective_scan45_GLOBAL__N__d2c57b0a_12_fwd_lanes_cu_7efa2efd" + body
    k2 = "sm_90 _ZN13mamba_kernels14selective_scan45_GLOBAL__N__a1b2c3d4_12_fwd_lanes_cu_01234567" + body
    names = kd.plain_names([k1, k2])
    assert names[k1] == names[k2] == "sm_90 mamba_kernels::selective_scan::fwd_lanes_kernel<float, 4, true>"
