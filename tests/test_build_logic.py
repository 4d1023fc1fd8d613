"""Build logic as pure functions: knobs, architectures, gencode flags, parallelism, flags,
early errors, toolchain detection. No nvcc, torch build or GPU is needed."""

import os
from pathlib import Path

import pytest

from mamba_kernels.build import archs as build_archs
from mamba_kernels.build import binding as build_binding
from mamba_kernels.build import flags as build_flags
from mamba_kernels.build import plan as build
from mamba_kernels.build import setup_glue, torch_env
from mamba_kernels.build import sources as build_sources
from mamba_kernels.build import toolchain as build_toolchain

# ----------------------------------------------------------------------------- knobs


def test_knobs_defaults_and_booleans():
    assert build.read_knobs({}) == build.BuildKnobs()
    k = build.read_knobs(
        {
            "MAMBA_KERNELS_FORCE_BUILD": "Yes",
            "MAMBA_KERNELS_FORCE_CXX11_ABI": "on",
            "MAX_JOBS": "3",
            "NVCC_THREADS": "2",
            "TORCH_CUDA_ARCH_LIST": "9.0",
        }
    )
    assert (k.force, k.force_cxx11_abi, k.max_jobs, k.nvcc_threads, k.arch_list) == (True, True, 3, 2, "9.0")
    assert build.read_knobs({"MAMBA_KERNELS_RELEASE": "TRUE"}).must_build
    assert not build.read_knobs({"MAMBA_KERNELS_SKIP_CUDA_BUILD": "0"}).skip


@pytest.mark.parametrize(
    "env, message",
    [
        ({"MAMBA_KERNELS_FORCE_BUILD": "maybe"}, "MAMBA_KERNELS_FORCE_BUILD='maybe' is not a boolean"),
        ({"MAMBA_KERNELS_RELEASE": "2"}, "MAMBA_KERNELS_RELEASE='2' is not a boolean"),
        ({"MAX_JOBS": "0"}, "MAX_JOBS='0' must be a positive integer"),
        ({"NVCC_THREADS": "two"}, "NVCC_THREADS='two' must be a positive integer"),
        (
            {"MAMBA_KERNELS_SKIP_CUDA_BUILD": "1", "MAMBA_KERNELS_FORCE_BUILD": "1"},
            "MAMBA_KERNELS_SKIP_CUDA_BUILD and MAMBA_KERNELS_FORCE_BUILD are both on",
        ),
        ({"TORCH_CUDA_ARCH_LIST": "sm_90"}, "entry 'sm_90' is not an architecture"),
    ],
)
def test_bad_knobs_are_errors(env, message):
    with pytest.raises(ValueError, match=message):
        build.read_knobs(env)


# ----------------------------------------------------------------------------- architectures


def names(plan):
    return plan.sass_names, plan.ptx_names


def test_parse_arch_list_forms():
    sass, ptx = build_archs.parse_arch_list("9.0a 8.0;8.6+PTX,12.0f")
    assert [str(a) for a in sass] == ["8.0", "8.6", "9.0a", "12.0f"]
    assert [str(a) for a in ptx] == ["8.6"]
    sass, ptx = build_archs.parse_arch_list("Ampere;9.0;9.0")  # named arches, duplicates dropped
    assert [str(a) for a in sass] == ["8.0", "8.6", "9.0"] and [str(a) for a in ptx] == ["8.6"]
    with pytest.raises(ValueError, match="is set but empty"):
        build_archs.parse_arch_list(" ; ")
    with pytest.raises(ValueError, match="entry '9' is not an architecture"):
        build_archs.parse_arch_list("8.0;9")


def test_gencode_flags():
    plan = build_archs.ArchPlan(*build_archs.parse_arch_list("8.0;9.0a;12.0+PTX"), "test")
    assert build_archs.gencode_flags(plan) == [
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90a,code=sm_90a",
        "-gencode=arch=compute_120,code=sm_120",
        "-gencode=arch=compute_120,code=compute_120",
    ]
    # torch skips its own arch guessing when any nvcc flag mentions 'arch'.
    assert all("arch" in f for f in build_archs.gencode_flags(plan))


def test_arch_choice_order():
    common = dict(cuda="13.0", platform="linux_x86_64")
    # The explicit knob wins over GPUs and release defaults.
    plan = build_archs.choose_archs(arch_list="8.9", release=True, gpu_capabilities=[(9, 0)], **common)
    assert names(plan) == (["sm_89"], []) and plan.source == "TORCH_CUDA_ARCH_LIST"
    # Visible GPUs (deduplicated), PTX for the newest.
    gpus = [(9, 0), (8, 6), (9, 0)]
    plan = build_archs.choose_archs(arch_list=None, release=False, gpu_capabilities=gpus, **common)
    assert names(plan) == (["sm_86", "sm_90"], ["compute_90"])
    # Release builds ignore the build machine's GPUs.
    plan = build_archs.choose_archs(arch_list="", release=True, gpu_capabilities=[(9, 0)], **common)
    assert names(plan) == (
        ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"],
        ["compute_120"],
    )
    assert "release build" in plan.source
    plan = build_archs.choose_archs(arch_list=None, release=False, gpu_capabilities=[], cuda="12.6",
                                    platform="linux_aarch64")
    assert names(plan) == (["sm_80", "sm_90"], ["compute_90"]) and "no GPU visible" in plan.source


def test_unsupported_archs_are_named():
    nvcc13 = "compute_75 compute_80 compute_86 compute_87 compute_89 compute_90 compute_100".split()
    ok = build_archs.ArchPlan(*build_archs.parse_arch_list("9.0a;10.0+PTX"), "x")
    assert build_archs.unsupported(ok, nvcc13, "13.0") is None
    bad = build_archs.ArchPlan(*build_archs.parse_arch_list("6.1;9.0"), "TORCH_CUDA_ARCH_LIST")
    msg = build_archs.unsupported(bad, nvcc13, "13.0")
    assert "nvcc 13.0 cannot compile for 6.1 (asked for by TORCH_CUDA_ARCH_LIST)" in msg
    assert "7.5, 8.0" in msg
    assert build_archs.unsupported(bad, [], "13.0") is None  # nvcc gave no list: nvcc itself will say


# ----------------------------------------------------------------------------- jobs and flags


def test_parallelism():
    gib = 1 << 30
    assert build_flags.choose_parallelism(2, 18 * gib, 1, None, None) == (2, 1)
    assert build_flags.choose_parallelism(16, 128 * gib, 7, None, None) == (4, 4)
    assert build_flags.choose_parallelism(16, 9 * gib, 1, None, None) == (4, 1)  # memory bound: 9 GiB / 2 GiB
    assert build_flags.choose_parallelism(64, 1 * gib, 6, None, None) == (1, 4)  # never below one job
    assert build_flags.choose_parallelism(8, None, 2, None, 1) == (8, 1)
    assert build_flags.choose_parallelism(8, 1 * gib, 2, 5, 3) == (5, 3)  # knobs win


def plan90():
    return build_archs.ArchPlan(*build_archs.parse_arch_list("9.0"), "x")


def test_linux_development_flags():
    f = build_flags.compile_flags(platform="linux_x86_64", cxx_std=20, nvcc_version="13.0",
                                  arch_plan=plan90(),
                                  nvcc_threads=1, release=False, cxx11_abi=True)
    assert f["nvcc"][:2] == ["-std=c++20", "-D_GLIBCXX_USE_CXX11_ABI=1"]
    assert "-lineinfo" in f["nvcc"] and "-gencode=arch=compute_90,code=sm_90" in f["nvcc"]
    assert f["cxx"] == ["-O3", "-std=c++20", "-D_GLIBCXX_USE_CXX11_ABI=1"] and f["link"] == []


def test_linux_release_flags_strip_debug_info():
    f = build_flags.compile_flags(platform="linux_aarch64", cxx_std=17, nvcc_version="12.8",
                                  arch_plan=plan90(),
                                  nvcc_threads=2, release=True, cxx11_abi=False)
    assert "-lineinfo" not in f["nvcc"] and not any(x == "-g" for x in f["nvcc"] + f["cxx"])
    assert "-g0" in f["cxx"] and f["link"] == ["-s"]
    assert "--compress-mode=size" in f["nvcc"] and "-D_GLIBCXX_USE_CXX11_ABI=0" in f["cxx"]
    old = build_flags.compile_flags(platform="linux_x86_64", cxx_std=17, nvcc_version="11.8",
                                    arch_plan=plan90(),
                                    nvcc_threads=2, release=True, cxx11_abi=False)
    assert not any("compress-mode" in x for x in old["nvcc"])  # nvcc < 12.8 has no such option


def test_msvc_flags():
    f = build_flags.compile_flags(platform="win_amd64", cxx_std=20, nvcc_version="13.2", arch_plan=plan90(),
                                  nvcc_threads=1, release=True, cxx11_abi=None)
    assert f["cxx"] == ["/O2", "/std:c++20", "/permissive-", "/Zc:__cplusplus"]
    host = [f["nvcc"][i + 1] for i, x in enumerate(f["nvcc"]) if x == "-Xcompiler"]
    assert host == ["/permissive-", "/Zc:__cplusplus", "/Zc:preprocessor"]  # CCCL in CUDA >= 13.2
    assert not any(x.startswith(("-std", "-D_GLIBCXX")) for x in f["nvcc"]) and f["link"] == []
    f = build_flags.compile_flags(platform="win_amd64", cxx_std=17, nvcc_version="13.0", arch_plan=plan90(),
                                  nvcc_threads=1, release=False, cxx11_abi=None)
    assert "/std:c++17" in f["cxx"] and "/Zc:preprocessor" not in f["nvcc"]



def test_msvc_runtime_is_the_dynamic_one():
    # optional tensors cross from torch's DLL into ours as memory torch allocated and our DLL
    # frees (docs/STABLE_ABI.md): sound only when both link the dynamic C runtime (/MD)
    from torch.utils import cpp_extension

    assert "/MD" in cpp_extension.COMMON_MSVC_FLAGS  # what torch adds to every host and nvcc compile
    for release in (False, True):
        f = build_flags.compile_flags(platform="win_amd64", cxx_std=20, nvcc_version="13.2",
                                      arch_plan=plan90(),
                                      nvcc_threads=1, release=release, cxx11_abi=None)
        flags = f["cxx"] + f["nvcc"] + f["link"]
        assert not any(x.upper().lstrip("-/").startswith(("MT", "XCOMPILER=/MT")) for x in flags)


# ----------------------------------------------------------------------------- early errors


def facts(version="2.14.1+cu130", cuda="13.0"):
    return torch_env.TorchFacts(version, cuda, True, "/nowhere")


def test_torch_problems():
    assert torch_env.torch_problem(facts()) is None
    assert "CPU-only build" in torch_env.torch_problem(facts("2.14.1+cpu", None))
    assert "older than 2.1" in torch_env.torch_problem(facts("2.0.1", "11.8"))


def test_cuda_major_mismatch_is_named():
    assert torch_env.cuda_major_problem("13.0", "13.2", "/usr/local/cuda") is None
    msg = torch_env.cuda_major_problem("12.8", "13.0", "/opt/cuda-12.8")
    assert "nvcc in /opt/cuda-12.8 is CUDA 12.8 but torch was built with CUDA 13.0" in msg
    assert "CUDA 13.x toolkit" in msg


def test_required_cxx_std():
    assert torch_env.required_cxx_std("2.14.1+cu130") == 20
    assert torch_env.required_cxx_std("2.12.0") == 17
    assert torch_env.required_cxx_std("2.16.0") == 20  # newer than the table
    assert torch_env.required_cxx_std("2.0.0") == 17


def test_nvcc_probe_messages():
    assert build_toolchain.nvcc_probe_problem(0, "", 20, "13.0") is None
    gcc = "#error -- unsupported GNU version! gcc versions later than 15 are not supported!"
    msg = build_toolchain.nvcc_probe_problem(1, gcc, 20, "13.0")
    assert msg.startswith("nvcc 13.0 refuses the host compiler") and "CC/CXX" in msg
    std = "nvcc fatal   : Value 'c++20' is not defined for option 'std'"
    msg = build_toolchain.nvcc_probe_problem(1, std, 20, "11.8")
    assert "cannot compile C++20, which this torch requires" in msg
    assert "probe compile failed" in build_toolchain.nvcc_probe_problem(1, "segfault", 17, "12.1")


def test_pure_python_notice_or_error():
    plan = build._pure(build.BuildKnobs(), "no CUDA toolkit found")
    assert not plan.build and plan.version == "0.1.0" and plan.install_requires == ["torch>=2.1"]
    assert "installing without the CUDA extensions" in plan.notice and "no CUDA toolkit found" in plan.notice
    with pytest.raises(build.BuildError, match="MAMBA_KERNELS_FORCE_BUILD is on but .*: no CUDA toolkit"):
        build._pure(build.BuildKnobs(force=True), "no CUDA toolkit found")
    with pytest.raises(build.BuildError, match="MAMBA_KERNELS_RELEASE is on"):
        build._pure(build.BuildKnobs(release=True), "x")


def test_install_requires_is_torch_only():
    # Nothing the variant index cannot serve and the environment may lack (packaging was one).
    assert build.install_requires() == ["torch>=2.1"]
    assert build.install_requires(release_torch="2.14.1+cu130") == ["torch==2.14.*"]
    assert build.install_requires(release_torch="2.6.0+cu124") == ["torch==2.6.*"]


def test_make_plan_skip_and_missing_sources(tmp_path):
    plan = build.make_plan(str(tmp_path), {"MAMBA_KERNELS_SKIP_CUDA_BUILD": "1"})
    assert not plan.build and "MAMBA_KERNELS_SKIP_CUDA_BUILD is on" in plan.notice
    plan = build.make_plan(str(tmp_path), {})
    assert not plan.build and "no kernel sources" in plan.notice
    with pytest.raises(build.BuildError, match="no kernel sources"):
        build.make_plan(str(tmp_path), {"MAMBA_KERNELS_FORCE_BUILD": "1"})


# A checkout build (`pip install --no-build-isolation .`) with a CUDA torch and no GPU visible
# builds only when asked, as the sdist path does, and says what it builds or why not in one line.

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA_TORCH_NO_GPU = torch_env.TorchFacts("2.14.1+cu130", "13.0", True, "/nowhere")


def _no_toolkit(environ, search_paths=()):
    return None


@pytest.fixture
def cuda_torch_no_gpu(monkeypatch):
    monkeypatch.setattr(torch_env, "gather_torch_facts", lambda: (CUDA_TORCH_NO_GPU, None))


def test_checkout_build_without_gpu_builds_nothing_unless_asked(cuda_torch_no_gpu, monkeypatch):
    def looked(*a, **kw):
        raise AssertionError("the toolkit was looked for although nothing is to be built")

    monkeypatch.setattr(build_toolchain, "find_cuda_home", looked)
    plan = build.make_plan(ROOT, {})
    assert not plan.build
    assert "no GPU is visible to build for (set TORCH_CUDA_ARCH_LIST, e.g. '9.0', or " \
           "MAMBA_KERNELS_FORCE_BUILD=1 to build without one)." in plan.notice
    assert "to make this an error" not in plan.notice  # FORCE_BUILD builds here, it does not fail


@pytest.mark.parametrize("env", [{"TORCH_CUDA_ARCH_LIST": "9.0"}, {"MAMBA_KERNELS_FORCE_BUILD": "1"},
                                 {"MAMBA_KERNELS_RELEASE": "1"}])
def test_checkout_build_without_gpu_goes_on_when_asked(cuda_torch_no_gpu, monkeypatch, env):
    """Asked for, the plan goes on to the toolkit (none here: that is the reason it gives)."""
    monkeypatch.setattr(build_toolchain, "find_cuda_home", _no_toolkit)
    if build.read_knobs(env).must_build:
        with pytest.raises(build.BuildError, match="no CUDA toolkit found"):
            build.make_plan(ROOT, env)
    else:
        plan = build.make_plan(ROOT, env)
        assert not plan.build and "no CUDA toolkit found" in plan.notice


def test_arch_decision_is_the_sdist_rule_too():
    k = build.read_knobs
    assert build.arch_decision(k({}), ["8.0", "9.0"]) == (True, "for the visible GPUs (sm 8.0, 9.0)")
    assert build.arch_decision(k({"TORCH_CUDA_ARCH_LIST": "9.0"}), []) == (
        True, "for TORCH_CUDA_ARCH_LIST=9.0")
    assert build.arch_decision(k({"MAMBA_KERNELS_FORCE_BUILD": "1"}), [])[0]
    assert build.arch_decision(k({"MAMBA_KERNELS_RELEASE": "1"}), [])[0]
    assert build.arch_decision(k({}), [])[0] is False


def test_the_one_line_of_a_build_that_compiles_nothing(cuda_torch_no_gpu, monkeypatch, tmp_path, capsys):
    """Shown once, when the wheel is built (setup.py runs for the metadata too), on the terminal
    (installers hide a build's output) and in the log; inside the sdist's build, in the log only."""
    from setuptools.dist import Distribution

    from mamba_kernels.runtime import terminal

    shown = []
    monkeypatch.setattr(terminal, "to_terminal", lambda line, environ=None: shown.append(line) or True)
    kwargs = setup_glue.setup_kwargs(ROOT, {})
    assert kwargs["ext_modules"] == [] and shown == [] and capsys.readouterr().err == ""
    monkeypatch.chdir(tmp_path)
    cmd = kwargs["cmdclass"]["build_py"](Distribution({"name": "x", "packages": []}))
    cmd.ensure_finalized()
    cmd.run()
    assert len(shown) == 1 and shown[0].startswith("mamba-kernels: installing without the CUDA extensions")
    assert "no GPU is visible to build for" in shown[0]
    assert capsys.readouterr().err == shown[0] + "\n"  # the build's log keeps it too
    build.show("inside the sdist", {build.FROM_SDIST_VAR: "1"})
    assert len(shown) == 1 and capsys.readouterr().err == "inside the sdist\n"


def test_kernel_sources_glob(tmp_path):
    (tmp_path / "csrc" / "causal_conv1d").mkdir(parents=True)
    (tmp_path / "csrc" / "selective_scan").mkdir(parents=True)
    for name in ("b.cu", "a.cpp", "x.h", "c.cuh"):
        (tmp_path / "csrc" / "causal_conv1d" / name).write_text("")
    assert build_sources.kernel_sources(str(tmp_path)) == {
        "causal_conv1d": ["csrc/causal_conv1d/a.cpp", "csrc/causal_conv1d/b.cu"]
    }


def test_kernel_sources_of_a_family_built_into_another_module(tmp_path):
    """csrc/ssd/ ships inside selective_scan._cuda (KERNEL_FOLDERS): its kernels and its own
    binding's files join the scan's, the other binding's stay out."""
    for f in ("selective_scan/fwd.cu", "selective_scan/stable/binding.cpp", "ssd/chunk.cu", "ssd/host.cpp",
              "ssd/stable/binding.cpp", "ssd/classic/binding.cpp", "common/stable/errors.cpp"):
        (tmp_path / "csrc" / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "csrc" / f).write_text("")
    assert build_sources.kernel_sources(str(tmp_path), "stable") == {"selective_scan": [
        "csrc/common/stable/errors.cpp", "csrc/selective_scan/fwd.cu",
        "csrc/selective_scan/stable/binding.cpp", "csrc/ssd/chunk.cu", "csrc/ssd/host.cpp",
        "csrc/ssd/stable/binding.cpp"]}
    assert str(tmp_path / "csrc" / "ssd" / "classic" / "binding.cpp") in build_sources.binding_only_sources(
        str(tmp_path), "classic")


# ----------------------------------------------------------------------------- toolchain detection


def test_wrapper_script_is_followed(tmp_path):
    real = tmp_path / "cuda-13.0" / "bin"
    real.mkdir(parents=True)
    (real / "nvcc").write_text("\x7fELF")
    (tmp_path / "cuda-13.0" / "include").mkdir()
    (tmp_path / "cuda-13.0" / "include" / "cuda_runtime.h").write_text("")
    wrapper = tmp_path / "bin" / "nvcc"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {real / "nvcc"} "$@"\n')
    home = build_toolchain.find_cuda_home({}, which=lambda _: str(wrapper))
    assert home.path == os.path.realpath(tmp_path / "cuda-13.0")  # not tmp_path (torch's guess)
    assert "->" in home.how


def test_cuda_home_env_wins_and_pip_toolkits(tmp_path):
    assert build_toolchain.find_cuda_home({"CUDA_HOME": "/x"}).path == "/x"
    assert build_toolchain.find_cuda_home({"CUDA_PATH": "/y"}).how == "CUDA_PATH"
    site = tmp_path / "site-packages"
    (site / "nvidia" / "cu13" / "bin").mkdir(parents=True)
    (site / "nvidia" / "cu13" / "bin" / "nvcc").write_text("")
    found = build_toolchain.pip_toolkit_roots([str(site)])
    assert found == [str(site / "nvidia" / "cu13")]


def test_toolkit_problems(tmp_path):
    assert "does not exist" in build_toolchain.toolkit_problem(str(tmp_path), "linux_x86_64")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text("")
    assert "no cuda_runtime.h" in build_toolchain.toolkit_problem(str(tmp_path), "linux_x86_64")
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "cuda_runtime.h").write_text("")
    # A pip-assembled toolkit has lib/, not lib64/libcudart.so, which torch links against.
    assert "has no libcudart.so" in build_toolchain.toolkit_problem(str(tmp_path), "linux_x86_64")
    (tmp_path / "lib64").mkdir()
    (tmp_path / "lib64" / "libcudart.so").write_text("")
    assert build_toolchain.toolkit_problem(str(tmp_path), "linux_x86_64") is None


def test_version_parsers():
    out = "Cuda compilation tools, release 13.0, V13.0.88\nBuild cuda_13.0.r13.0/compiler.36424714_0"
    assert build_toolchain.parse_nvcc_version(out) == "13.0"
    assert build_toolchain.parse_nvcc_version("garbage") is None
    assert build_toolchain.parse_compiler_version("g++ (Debian 12.2.0-14+deb12u1) 12.2.0\nCopyright") == (
        "gcc", "12.2.0")
    assert build_toolchain.parse_compiler_version("Ubuntu clang version 17.0.6 (++2)\nTarget: x") == (
        "clang", "17.0.6")
    assert build_toolchain.parse_compiler_version("c++ (GCC) 11.4.1 20231218 (Red Hat 11.4.1-3)")[0] == "gcc"
    assert build_toolchain.parse_compiler_version("") is None
    wrapper = '#!/bin/sh\nexec "/opt/cuda/bin/nvcc" "$@"\n'
    assert build_toolchain.script_target(wrapper) == "/opt/cuda/bin/nvcc"
    assert build_toolchain.script_target("#!/bin/sh\necho hi\n") is None


# ----------------------------------------------------------------------------- binding


@pytest.mark.parametrize(
    "knob, torch_version, want",
    [
        ("auto", "2.14.1+cu130", "stable"),
        ("auto", "2.10.0+cu128", "stable"),
        ("auto", "2.9.1+cu128", "classic"),
        ("classic", "2.14.1+cu130", "classic"),
        ("stable", "2.11.0", "stable"),
    ],
)
def test_choose_binding(knob, torch_version, want):
    assert build_binding.choose_binding(knob, torch_version) == want


def test_forcing_stable_on_an_old_torch_is_an_error():
    with pytest.raises(ValueError, match=r"BINDING=stable needs torch >= 2.10 .* the build torch is 2.9.1"):
        build_binding.choose_binding("stable", "2.9.1")
    assert build.read_knobs({"MAMBA_KERNELS_BINDING": "stable"}).binding == "stable"
    with pytest.raises(ValueError, match="MAMBA_KERNELS_BINDING='both' is not a binding"):
        build.read_knobs({"MAMBA_KERNELS_BINDING": "both"})


def test_stable_flags_target_torch_2_10_on_cxx_and_nvcc():
    assert build_binding.target_version_macro("2.10") == "0x020a000000000000"
    assert build_binding.target_version_macro("2.9") == "0x0209000000000000"
    for platform in ("linux_x86_64", "win_amd64"):
        f = build_flags.compile_flags(platform=platform, cxx_std=20, nvcc_version="13.0", arch_plan=plan90(),
                                      nvcc_threads=1, release=True, cxx11_abi=True, binding="stable")
        for kind in ("cxx", "nvcc"):
            assert "-DTORCH_TARGET_VERSION=0x020a000000000000" in f[kind] and "-DUSE_CUDA" in f[kind]
    classic = build_flags.compile_flags(platform="linux_x86_64", cxx_std=20, nvcc_version="13.0",
                                        arch_plan=plan90(), nvcc_threads=1, release=True, cxx11_abi=True,
                                        binding="classic")
    assert not any("TORCH_TARGET_VERSION" in x for x in classic["cxx"] + classic["nvcc"])


def test_stable_release_requires_the_target_or_newer():
    assert build.install_requires(release_torch="2.14.1+cu130", binding="stable") == ["torch>=2.10"]
    assert build.install_requires(release_torch="2.14.1+cu130", binding="classic") == ["torch==2.14.*"]


def test_sources_per_binding(tmp_path):
    dirs = ("causal_conv1d", "causal_conv1d/classic", "causal_conv1d/stable", "common/classic",
            "common/stable")
    for d in dirs:
        (tmp_path / "csrc" / d).mkdir(parents=True)
    for f in ("causal_conv1d/fwd.cu", "causal_conv1d/conv_host.cpp", "causal_conv1d/classic/binding.cpp",
              "causal_conv1d/stable/binding.cpp", "common/classic/errors.cpp", "common/stable/errors.cpp"):
        (tmp_path / "csrc" / f).write_text("")
    shared = ["csrc/causal_conv1d/conv_host.cpp", "csrc/causal_conv1d/fwd.cu"]
    assert build_sources.kernel_sources(str(tmp_path), "stable") == {"causal_conv1d": sorted(
        shared + ["csrc/causal_conv1d/stable/binding.cpp", "csrc/common/stable/errors.cpp"])}
    assert build_sources.kernel_sources(str(tmp_path), "classic") == {"causal_conv1d": sorted(
        shared + ["csrc/causal_conv1d/classic/binding.cpp", "csrc/common/classic/errors.cpp"])}
    assert build_sources.binding_only_sources(str(tmp_path), "classic") == [
        str(tmp_path / "csrc" / "causal_conv1d" / "classic" / "binding.cpp"),
        str(tmp_path / "csrc" / "common" / "classic" / "errors.cpp"),
    ]


def test_shared_host_code_and_kernels_include_no_torch():
    """Both bindings compile the same kernels and host code, so those may include no torch,
    c10 or ATen header (the stable build would refuse them; the classic one must not need them)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "csrc"
    shared = [p for p in root.rglob("*") if p.suffix in (".h", ".cuh", ".cu", ".cpp")
              and p.parent.name not in ("classic", "stable")]
    assert shared
    pattern = re.compile(r'#include\s*[<"](torch/|ATen/|c10/)')
    offenders = [str(p.relative_to(root)) for p in shared if pattern.search(p.read_text())]
    assert offenders == []


def test_checkout_root_is_the_tree_holding_csrc():
    # `python -m mamba_kernels.build.plan --compile-binding` compiles the csrc/ of this tree: the
    # module's own location, two packages down, must lead back to it
    root = Path(build.checkout_root())
    assert (root / "csrc" / "selective_scan").is_dir(), root
    assert (root / "mamba_kernels" / "build" / "plan.py").resolve() == Path(build.__file__).resolve()


def test_stable_flags_define_py_limited_api_at_the_abi3_floor_and_classic_flags_do_not():
    # The stable wheel is tagged cp310-abi3: every translation unit of its build (C++ and CUDA)
    # sees Python.h's limited API of 3.10 only; the classic build's Python.h is the full one.
    from mamba_kernels.facts import support, variant

    assert build_binding.limited_api_macro("3.10") == "0x030A0000" == build_binding.LIMITED_API
    assert build_binding.limited_api_macro("3.12") == "0x030C0000"
    assert variant.python_tag(support.STABLE_ABI_PYTHON) == "cp310"
    define = "-DPy_LIMITED_API=0x030A0000"
    for platform in ("linux_x86_64", "linux_aarch64", "win_amd64"):
        for binding in ("stable", "classic"):
            f = build_flags.compile_flags(platform=platform, cxx_std=20, nvcc_version="13.0",
                                          arch_plan=plan90(),
                                          nvcc_threads=1, release=True, cxx11_abi=True, binding=binding)
            for kind in ("cxx", "nvcc"):
                limited = [x for x in f[kind] if "Py_LIMITED_API" in x]
                assert limited == ([define] if binding == "stable" else []), (platform, binding, kind)
