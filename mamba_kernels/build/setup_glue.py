"""What setup.py hands setuptools: the keyword arguments of setup() (version, requirements, the
extensions and their flags) and the command classes that show the plan's line, write the source
revision into the sdist and build with torch's extension builder."""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Dict, Mapping, Optional, Sequence

from ..facts import support, variant
from ..facts.variant import STABLE
from . import binding as build_binding
from . import build_info as binfo
from .plan import BuildError, make_plan, show


def _sdist_class() -> type:
    # setuptools is there only while setup.py runs
    from setuptools.command.sdist import sdist

    class SdistWithRevision(sdist):
        """Write the source revision into the sdist, for builds without git."""

        def make_release_tree(self, base_dir: str, files: Sequence[str]) -> None:
            super().make_release_tree(base_dir, files)
            path = os.path.join(base_dir, binfo.REVISION_FILE)
            if os.path.exists(path):
                os.remove(path)  # a hard link to the source tree's copy: do not write through it
            root = os.path.dirname(os.path.abspath(self.distribution.script_name))
            with open(path, "w") as f:
                f.write(binfo.source_revision(root) + "\n")

    return SdistWithRevision


def _build_py_class(notice: str, environ: Mapping[str, str]) -> type:
    # setuptools is there only while setup.py runs
    from setuptools.command.build_py import build_py

    class BuildPyWithNotice(build_py):
        """Says why nothing is compiled, once: setup.py runs for the metadata too, build_py
        only when the wheel is built."""

        def run(self) -> None:
            show(notice, environ)
            super().run()

    return BuildPyWithNotice


def _build_ext_class(progress: str, environ: Mapping[str, str]) -> type:
    # optional: setup.py imports this module before torch may be installed
    from torch.utils.cpp_extension import BuildExtension

    class BuildWithProgress(BuildExtension):
        def run(self) -> None:
            show(progress, environ)
            start = time.monotonic()
            super().run()
            print(f"mamba-kernels: extensions compiled in {time.monotonic() - start:.0f} s", file=sys.stderr)

    return BuildWithProgress


def setup_kwargs(root: str, environ: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """Keyword arguments for setuptools.setup(): version, install_requires, ext_modules, cmdclass."""
    env = os.environ if environ is None else environ
    try:
        plan = make_plan(root, env)
    except ValueError as e:  # a malformed knob
        raise BuildError(str(e)) from None
    cmdclass: Dict[str, type] = {"sdist": _sdist_class()}
    kwargs: Dict[str, Any] = {"version": plan.version, "install_requires": plan.install_requires}
    if not plan.build:
        cmdclass["build_py"] = _build_py_class(plan.notice, env)
        kwargs.update(ext_modules=[], cmdclass=cmdclass)
        return kwargs
    os.environ.update(plan.env)
    binfo.write_if_changed(os.path.join(root, binfo.GENERATED_DIR, binfo.BUILD_INFO_HEADER),
                           binfo.build_info_header(plan.info))
    # optional: setup.py imports this module before torch may be installed
    import torch
    from torch.utils import cpp_extension

    # cpp_extension reads CUDA_HOME once, at import; if something imported it before we set
    # the environment it may hold a wrong guess (/usr/local for a wrapper nvcc).
    cpp_extension.CUDA_HOME = plan.env["CUDA_HOME"]
    if plan.force_cxx11_abi:
        torch._C._GLIBCXX_USE_CXX11_ABI = True  # BuildExtension reads it for -D_GLIBCXX_USE_CXX11_ABI
    stable = plan.binding == STABLE
    if stable and hasattr(cpp_extension, "min_supported_cpython"):
        # torch >= 2.7 defines Py_LIMITED_API=<min_supported_cpython> for a py_limited_api
        # extension after our flags (torch's documented way to pick another floor is to set this
        # name): the same value as ours, so the last definition is still the wheel's cp310 floor.
        cpp_extension.min_supported_cpython = build_binding.LIMITED_API
    ext_modules = [
        cpp_extension.CUDAExtension(
            name=f"{kernel}._cuda",
            sources=files,
            include_dirs=plan.include_dirs,
            extra_compile_args={"cxx": list(plan.flags["cxx"]), "nvcc": list(plan.flags["nvcc"])},
            extra_link_args=plan.flags["link"],
            # Stable: the module object uses Python's limited API only (no libtorch_python), so
            # one binary loads on every CPython >= STABLE_ABI_PYTHON.
            py_limited_api=stable,
        )
        for kernel, files in plan.sources.items()
    ]
    cmdclass["build_ext"] = _build_ext_class(plan.progress, env)
    kwargs.update(ext_modules=ext_modules, cmdclass=cmdclass)
    if stable:  # the wheel's tags: cp310-abi3-<platform>
        kwargs["options"] = {"bdist_wheel": {"py_limited_api": variant.python_tag(support.STABLE_ABI_PYTHON)}}
    return kwargs
