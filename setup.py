"""Thin setup: the version, and (later) the CUDA extensions. The logic lives in mamba_kernels/."""

import os
import sys

from setuptools import setup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mamba_kernels.version import __version__  # noqa: E402  (importable without torch)

setup(version=__version__)
