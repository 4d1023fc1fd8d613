"""The CUDA targets inside a compiled binary, read without cuobjdump: the fat-binary reader.

An extension built by nvcc (ELF on Linux, PE on Windows) carries one or more fat-binary
containers (magic 0xBA55ED50); each entry is PTX (kind 1) or SASS (kind 2) for one
architecture, the number at offset 28 of its header. The index writer records them per wheel
and ci/build_cell.py checks them against the cell's architectures.
"""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path
from typing import Dict, List, Tuple

_FATBIN_MAGIC = struct.pack("<I", 0xBA55ED50)
_BINARY_SUFFIXES = (".so", ".pyd", ".dll")


def fatbin_archs(data: bytes) -> Tuple[List[str], List[str]]:
    """The CUDA targets embedded in a compiled binary (ELF or PE): (SASS, PTX), e.g.
    (["sm_80", "sm_90"], ["compute_90"]), each sorted by architecture.

    Walks every fat-binary container (magic 0xBA55ED50; entries of kind 1 = PTX, 2 = SASS with
    the architecture number at offset 28 of each entry header), which is what cuobjdump lists.
    """
    sass, ptx = set(), set()
    i = data.find(_FATBIN_MAGIC)
    while i >= 0:
        if i + 16 > len(data):
            break
        _magic, version, header_size, fat_size = struct.unpack_from("<IHHQ", data, i)
        end = i + header_size + fat_size
        if version != 1 or header_size != 16 or end > len(data):
            i = data.find(_FATBIN_MAGIC, i + 4)  # four bytes that merely look like the magic
            continue
        p = i + header_size
        while p + 32 <= end:
            kind, _ver, entry_header, payload = struct.unpack_from("<HHIQ", data, p)
            arch = struct.unpack_from("<I", data, p + 28)[0]
            if kind not in (1, 2) or entry_header < 32:
                break
            (ptx if kind == 1 else sass).add(arch)
            p += entry_header + payload
        i = data.find(_FATBIN_MAGIC, end)
    return [f"sm_{a}" for a in sorted(sass)], [f"compute_{a}" for a in sorted(ptx)]


def wheel_archs(path: Path) -> Dict[str, Dict[str, List[str]]]:
    """CUDA targets of every compiled module in a wheel: {member: {"sass": [...], "ptx": [...]}}."""
    out: Dict[str, Dict[str, List[str]]] = {}
    with zipfile.ZipFile(path) as zf:
        for name in sorted(zf.namelist()):
            if name.endswith(_BINARY_SUFFIXES) or ".so." in name.rsplit("/", 1)[-1]:
                sass, ptx = fatbin_archs(zf.read(name))
                if sass or ptx:
                    out[name] = {"sass": sass, "ptx": ptx}
    return out
