"""One wheel file's metadata as the installer and the index writer read it: METADATA, its
dist-info folder, its sha256, and the torch pin that applies to every install of it.

The torch pin is read with environment markers evaluated for the wheel's own Python and
platform (:func:`target_environment`), so a pin written only for another platform is no pin.
packaging is imported where used: ``info`` and the runtime work without it.
"""

from __future__ import annotations

import hashlib
import re
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from ..facts import support

if TYPE_CHECKING:  # packaging is optional here (see above)
    from packaging.requirements import Requirement


# Marker variables a wheel's tags do not determine: a pin under one of them may or may not hold.
_UNDECIDABLE_MARKER_VARS = ("python_full_version", "platform_release", "platform_version",
                            "implementation_version")


def wheel_metadata(path: Path) -> Dict[str, Any]:
    """METADATA of a wheel: Name, Version, Requires-Python and the Requires-Dist list."""
    with zipfile.ZipFile(path) as zf:
        names = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        if len(names) != 1:
            raise ValueError(
                f"wheel {path.name!r} must hold exactly one *.dist-info/METADATA, found {len(names)}"
            )
        msg = Parser().parsestr(zf.read(names[0]).decode("utf-8"))
    return {
        "name": msg.get("Name", ""),
        "version": msg.get("Version", ""),
        "requires_python": msg.get("Requires-Python"),
        "requires_dist": msg.get_all("Requires-Dist") or [],
    }


def dist_info_name(filename: str) -> str:
    """The ``.dist-info`` folder a wheel of this file name holds: ``<dist>-<version>.dist-info``."""
    dist, version = filename.split("-")[:2]
    return f"{dist}-{version}.dist-info"


def sha256_of(path: Path) -> str:
    """The file's sha256 as hex, read in 1 MiB blocks (the one hashing routine of the package)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def target_environment(python: str, platform: str) -> Dict[str, str]:
    """The marker environment of any install of a wheel for CPython ``python`` ("3.11") on one
    of our ``platform`` names (``linux_x86_64``, ``linux_aarch64``, ``win_amd64``)."""
    env = {"implementation_name": "cpython", "platform_python_implementation": "CPython",
           "python_version": python, "extra": ""}
    env.update(support.PLATFORM_BY_NAME[platform].markers)  # sys_platform, platform_system, ...
    return env


def torch_requirements(requires_dist: List[str]) -> List[Requirement]:
    # optional: packaging is read only where a requirement or version is
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    out = []
    for text in requires_dist:
        try:
            req = Requirement(text)
        except InvalidRequirement as e:
            raise ValueError(f"Requires-Dist {text!r} is not a valid requirement ({e})") from None
        if canonicalize_name(req.name) == "torch":
            out.append(req)
    return out


def applies(req: Requirement, environment: Optional[Dict[str, str]]) -> bool:
    """Whether ``req`` applies to every install in ``environment`` (no extra requested).

    Without an environment only an unconditional requirement applies. A marker on a variable the
    environment does not fix (``python_full_version``, ``platform_release``, ...) is an error:
    such a pin holds on some installs of the wheel and not on others.
    """
    if req.marker is None:
        return True
    if environment is None:
        return False
    text = str(req.marker)
    for var in _UNDECIDABLE_MARKER_VARS:
        if re.search(rf"\b{var}\b", text):
            raise ValueError(
                f"the torch requirement {str(req)!r} depends on {var}, which the wheel's tags do "
                "not fix: the pin must hold on every install of the wheel"
            )
    return bool(req.marker.evaluate(dict(environment)))


def torch_pin(requires_dist: List[str], environment: Optional[Dict[str, str]] = None) -> Optional[str]:
    """The torch requirement of a wheel (``torch==2.14.*``, no marker, no spaces) that applies to
    every install in ``environment`` (see :func:`target_environment`); None when there is none.

    Markers are evaluated, not dropped: ``torch==2.14.*; sys_platform == "win32"`` is no pin
    for a Linux wheel. Without ``environment`` only unconditional requirements count. When
    several apply, all of them are returned joined by ``" and "`` so that a comparison with the
    one expected pin fails.
    """
    found = []
    for req in torch_requirements(requires_dist):
        if applies(req, environment):
            spec = "torch" + ("[" + ",".join(sorted(req.extras)) + "]" if req.extras else "")
            spec += f" @ {req.url}" if req.url else str(req.specifier)
            found.append(spec)
    return " and ".join(found) if found else None
