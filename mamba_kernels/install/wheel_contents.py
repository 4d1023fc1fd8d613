"""What a wheel of ours may hold: the layout our build produces, checked before a wheel is
indexed (``index``), installed (``install``) or written to a wheelhouse (``download``).

The build (setup.py through mamba_kernels/build/plan.py, then auditwheel or delvewheel) writes only

- the packages and top-level modules of ``[tool.setuptools]`` in pyproject.toml
  (:data:`PACKAGES`, :data:`MODULES`; tests/test_wheel_contents.py keeps the two in step);
- the libraries the repair tool grafts in, under ``mamba_kernels.libs/``;
- one ``mamba_kernels-<version>.dist-info/`` folder.

A member anywhere else, an absolute or ``..`` path, a backslash, a symlink, a ``.pth`` file
(Python runs its import lines at every start-up) or a ``.data/`` folder (``scripts`` there
become programs in the environment's ``bin``, and may overwrite ``pip``) is refused, and so is
an archive that would unpack to more than :data:`MAX_UNPACKED_BYTES`, holds more than
:data:`MAX_MEMBERS` members, or has a member more than :data:`MAX_RATIO` times its compressed
size (a zip bomb). Standard library only; the member sizes are zipfile's reading of the central
directory, and zipfile stops reading a member at that size.
"""

from __future__ import annotations

import stat
import zipfile
from typing import List, Sequence

PACKAGES = ("mamba_kernels", "causal_conv1d", "selective_scan")
MODULES = ("selective_scan_cuda", "causal_conv1d_cuda")
LIBS = "mamba_kernels.libs"  # auditwheel's and delvewheel's folder for grafted libraries
MAX_UNPACKED_BYTES = 2 << 30  # 2 GiB: a full-architecture wheel of ours unpacks to about 120 MB
MAX_MEMBERS = 20_000
MAX_RATIO = 200  # compiled code and Python compress 2-10 times; only padding compresses more
_RATIO_FLOOR = 1 << 20  # members below 1 MiB are not held to the ratio


class WheelContentError(ValueError):
    """The wheel holds something our build never writes; the message is one line."""


def top_level_names(dist_info: str) -> List[str]:
    """The names a wheel of ours may have at its root (folders without their slash)."""
    return [*PACKAGES, *(f"{m}.py" for m in MODULES), LIBS, dist_info]


def vet(zf: zipfile.ZipFile, dist_info: str) -> List[str]:
    """Check every member of an open wheel against our layout; the member names, or a
    :class:`WheelContentError` naming the first offending member and the rule."""
    infos = zf.infolist()
    if len(infos) > MAX_MEMBERS:
        raise WheelContentError(f"holds {len(infos)} members, more than the {MAX_MEMBERS} a wheel of "
                                "ours may")
    allowed_dirs = {*PACKAGES, LIBS, dist_info}
    allowed_files = {f"{m}.py" for m in MODULES}
    total = 0
    names = []
    for info in infos:
        name = info.filename
        problem = _problem(name, info, allowed_dirs, allowed_files)
        if problem:
            raise WheelContentError(f"member {name!r}: {problem}")
        total += info.file_size
        if total > MAX_UNPACKED_BYTES:
            raise WheelContentError(f"unpacks to more than {MAX_UNPACKED_BYTES} bytes (the limit for a wheel "
                                    "of ours)")
        if info.file_size > _RATIO_FLOOR and info.file_size > MAX_RATIO * max(info.compress_size, 1):
            raise WheelContentError(f"member {name!r} unpacks to {info.file_size} bytes from "
                                    f"{info.compress_size}: more than {MAX_RATIO} times (a zip bomb?)")
        names.append(name)
    return names


def _problem(name: str, info: zipfile.ZipInfo, allowed_dirs: Sequence[str], allowed_files: Sequence[str]
             ) -> str:
    if not name or "\\" in name or "\x00" in name:
        return "has an empty name, a backslash or a NUL character"
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        return "is an absolute path"
    parts = name.rstrip("/").split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "has an empty, '.' or '..' path component"
    if stat.S_ISLNK(info.external_attr >> 16):
        return "is a symlink"
    head = parts[0]
    if head.endswith(".data"):
        return "lies in a .data folder (scripts, headers or data installed outside the packages)"
    if name.endswith(".pth"):
        return "is a .pth file, which Python would run at every start-up"
    if len(parts) == 1 and not info.is_dir():
        if head not in allowed_files:
            return f"is not one of this project's top-level modules ({', '.join(sorted(allowed_files))})"
        return ""
    if head not in allowed_dirs:
        return (f"lies outside this project's packages and dist-info ({', '.join(sorted(allowed_dirs))})")
    return ""
