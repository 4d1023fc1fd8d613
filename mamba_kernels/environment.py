"""A snapshot of the environment the kernels run in: Python, torch, CUDA, GPUs."""

from __future__ import annotations

import platform
import sys
from typing import Any, Dict, List

from .version import __version__


def _torch_facts() -> Dict[str, Any]:
    try:
        import torch
    except ImportError as e:
        return {"installed": False, "error": str(e)}
    facts: Dict[str, Any] = {
        "installed": True,
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "cuda_available": torch.cuda.is_available(),
    }
    gpus: List[Dict[str, Any]] = []
    if facts["cuda_available"]:
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            gpus.append({"index": i, "name": torch.cuda.get_device_name(i), "capability": f"{major}.{minor}"})
    facts["gpus"] = gpus
    return facts


def snapshot() -> Dict[str, Any]:
    from . import knobs
    from .dispatch import backends

    torch_facts = _torch_facts()
    info: Dict[str, Any] = {
        "mamba_kernels": __version__,
        "python": sys.version.split()[0],
        "platform": f"{platform.system()} {platform.machine()}",
        "torch": torch_facts,
        "backend_mode": knobs.backend_mode(),
    }
    if torch_facts.get("installed"):
        info["backends"] = backends()
    return info
