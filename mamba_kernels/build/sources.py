"""Which sources each extension is built from: its csrc/ folders, the host code both bindings
share and each binding's own files."""

from __future__ import annotations

import glob
import os
from typing import Dict, List, Tuple

from ..facts.variant import CLASSIC

KERNELS: Tuple[str, ...] = ("causal_conv1d", "selective_scan")  # the extensions: <kernel>._cuda
# The csrc/ folders each extension is built from: a kernel family (its kernels, host code and
# bindings/) that ships inside another family's module, as the Mamba-2 ops do inside the
# selective scan's, is listed after that family's own folder.
KERNEL_FOLDERS: Dict[str, Tuple[str, ...]] = {
    "causal_conv1d": ("causal_conv1d",),
    "selective_scan": ("selective_scan", "ssd", "layernorm_gated"),
}


def kernel_sources(root: str, binding: str = CLASSIC) -> Dict[str, List[str]]:
    """kernel -> its sources relative to ``root`` (kernels without sources omitted): for each of
    its folders (``KERNEL_FOLDERS``) the kernels and the host code both bindings share
    (csrc/<folder>/*.cu, *.cpp) and the binding's own files (csrc/<folder>/<binding>/*.cpp), then
    the binding's error hook (csrc/common/<binding>/*.cpp)."""
    found: Dict[str, List[str]] = {}
    common = glob.glob(os.path.join(root, "csrc", "common", binding, "*.cpp"))
    for kernel in KERNELS:
        files = []
        for folder in KERNEL_FOLDERS[kernel]:
            shared = []
            for ext in ("*.cpp", "*.cu"):
                shared += glob.glob(os.path.join(root, "csrc", folder, ext))
            if shared:
                files += shared + glob.glob(os.path.join(root, "csrc", folder, binding, "*.cpp"))
        if files:
            found[kernel] = sorted(os.path.relpath(f, root).replace(os.sep, "/") for f in files + common)
    return found


def binding_only_sources(root: str, binding: str) -> List[str]:
    """The translation units that belong to ``binding`` alone (the kernels and the shared host
    code are the same for both bindings)."""
    files = glob.glob(os.path.join(root, "csrc", "common", binding, "*.cpp"))
    for kernel in KERNELS:
        for folder in KERNEL_FOLDERS[kernel]:
            files += glob.glob(os.path.join(root, "csrc", folder, binding, "*.cpp"))
    return sorted(files)
