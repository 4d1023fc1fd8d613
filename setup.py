"""Thin setup: the version, the torch requirement and the CUDA extensions come from
mamba_kernels/build/setup_glue.py, which follows mamba_kernels/build/plan.py (importable without
torch, it explains every decision)."""

import os
import sys

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ROOT)
from mamba_kernels.build.plan import BuildError  # noqa: E402
from mamba_kernels.build.setup_glue import setup_kwargs  # noqa: E402

try:
    kwargs = setup_kwargs(ROOT)
except BuildError as e:  # one plain line, not a traceback
    sys.exit(f"mamba-kernels: error: {e}")
setup(**kwargs)
