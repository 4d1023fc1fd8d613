"""One release wheel as the index writer checks it: its name, its METADATA, its torch pin,
and the manifest fields its label gives; every problem is an :class:`IndexInputError` naming
the file and the reason (the rules: docs/INDEX.md)."""

from __future__ import annotations

import struct
import zipfile
import zlib
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..facts import variant
from ..facts.variant import PROJECT
from ..install import wheel_contents, wheel_metadata
from . import fatbin

_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, zlib.error, struct.error,
               NotImplementedError, RuntimeError, UnicodeDecodeError)


class IndexInputError(ValueError):
    """A problem with the input of the index writer; its message is one line naming the file."""


def fail(what: str, path: Any, reason: str) -> IndexInputError:
    text = f"{what} {str(path)!r}: {reason}" if what else f"{str(path)!r}: {reason}"
    return IndexInputError(" ".join(text.split("\n")))


def check_torch_pin(
    where: str, requires_dist: List[str], info: variant.WheelInfo
) -> Tuple[str, Optional[str]]:
    """The wheel's pin and the marker(s) it was written under; raises when it does not pin
    exactly its label's torch release (stable: at least its target) for every install."""
    assert info.variant is not None and info.platform is not None
    if info.variant.stable:
        want = variant.stable_torch_requirement(info.variant.torch)
    else:
        want = variant.torch_requirement(info.variant.torch)
    env = wheel_metadata.target_environment(info.python, info.platform)
    try:
        reqs = wheel_metadata.torch_requirements(requires_dist)
        pin = wheel_metadata.torch_pin(requires_dist, env)
    except ValueError as e:
        raise fail("wheel", where, str(e)) from None
    if pin is None and reqs:
        shown = "; ".join(str(r) for r in reqs)
        raise fail("wheel", where, f"Requires-Dist must pin {want!r} on every install, but its torch "
                    f"requirement ({shown}) never applies to a cp{info.python.replace('.', '')} "
                    f"{info.platform} install without extras")
    if pin != want:
        raise fail("wheel", where, f"Requires-Dist must pin {want!r}, got {pin!r}")
    markers = [str(r.marker) for r in reqs if r.marker is not None and wheel_metadata.applies(r, env)]
    return pin, (" and ".join(markers) or None)


def check_filename(filename: str, where: Optional[str] = None) -> variant.WheelInfo:
    """The file name of a release wheel of this project, or an error naming the file.

    The distribution must be ours by packaging's own parser (canonical name ``mamba-kernels``)
    and written exactly ``mamba_kernels``: two names differing only in case or punctuation
    would be the same project to an installer and may be the same file on the host.
    """
    # optional: packaging is read only where a requirement or version is
    from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

    where = where or filename
    try:
        dist, _version, build, _tags = parse_wheel_filename(filename)
    except InvalidWheelFilename as e:
        raise fail("wheel", where, f"not a valid wheel file name ({e})") from None
    if canonicalize_name(dist) != PROJECT:
        raise fail("wheel", where, f"another project's wheel (distribution {str(dist)!r}); only "
                    f"{PROJECT} is indexed")
    written = filename.split("-", 1)[0]
    if written != variant.DIST_NAME:
        raise fail("wheel", where, f"the file name must spell the distribution {variant.DIST_NAME!r}, "
                    f"got {written!r} (names that differ only in case or punctuation clash)")
    if build:
        raise fail("wheel", where, "release wheels carry no build tag")
    try:
        info = variant.parse_wheel_name(filename)
    except ValueError as e:
        raise fail("wheel", where, str(e)) from None
    if info.variant is None:
        raise fail("wheel", where, "has no variant label: only release wheels are indexed")
    if info.platform is None:
        raise fail("wheel", where, f"platform tag {info.platform_tag!r} is not one this project builds")
    return info


def describe_wheel(path: Path) -> Dict[str, Any]:
    """One manifest entry (without URL), after checking the file, its name, METADATA and pin."""
    # optional: packaging is read only where a requirement or version is
    from packaging.utils import canonicalize_name

    path = Path(path)
    where = str(path)
    if path.is_symlink():
        raise fail("wheel", where, "is a symlink: the index reads only regular files (copy the wheel)")
    if not path.is_file():
        raise fail("wheel", where, "is not a regular file")
    info = check_filename(path.name, where)
    if path.stat().st_size == 0:
        raise fail("wheel", where, "is empty (0 bytes): an interrupted download or copy?")
    try:
        with zipfile.ZipFile(path) as zf:
            wheel_contents.vet(zf, wheel_metadata.dist_info_name(path.name))  # before reading any member
            bad = zf.testzip()
        if bad is not None:
            raise zipfile.BadZipFile(f"member {bad!r} fails its CRC check")
        meta = wheel_metadata.wheel_metadata(path)
        archs = fatbin.wheel_archs(path)
    except _ZIP_ERRORS as e:
        raise fail("wheel", where, f"not a readable wheel (zip archive): {e}") from None
    except OSError as e:
        raise fail("wheel", where, f"cannot be read: {e.strerror or e}") from None
    except wheel_contents.WheelContentError as e:
        raise fail("wheel", where, f"{e}: not the layout our build writes (docs/INDEX.md)") from None
    except ValueError as e:  # no or several METADATA
        raise fail("wheel", where, str(e).replace(f"wheel {path.name!r} ", "")) from None
    if canonicalize_name(meta["name"] or "-") != PROJECT:
        raise fail("wheel", where, f"METADATA Name {meta['name']!r} is another project; only {PROJECT} "
                    "is indexed")
    local = path.name.split("-")[1]
    if meta["version"] != local:
        raise fail("wheel", where, f"METADATA Version {meta['version']!r} must equal the file name's "
                    f"version {local!r} (label in both places)")
    pin, marker = check_torch_pin(where, meta["requires_dist"], info)
    assert info.variant is not None
    return {
        "filename": path.name,
        "version": meta["version"],
        "label": local.split("+", 1)[1],
        **label_fields(info),
        "cxx11_abi": info.variant.cxx11_abi,
        "python": info.python,
        "platform": info.platform,
        "platform_tag": info.platform_tag,
        "requires_python": meta["requires_python"],
        "requires_torch": pin,
        "requires_torch_marker": marker,
        "sha256": wheel_metadata.sha256_of(path),
        "size": path.stat().st_size,
        "archs": archs,
    }


def label_fields(info: variant.WheelInfo) -> Dict[str, Any]:
    """What a wheel's label and tags say, as manifest fields (one writer for new and carried
    entries): binding, torch (a stable wheel's target), cuda, cuda_major, abi3, describe."""
    assert info.variant is not None
    return {
        "binding": variant.BINDINGS[info.variant.stable],
        "torch": info.variant.torch,
        "cuda": info.variant.cuda,
        "cuda_major": int(info.variant.cuda.split(".")[0]),
        "abi3": info.abi3,
        "describe": info.variant.describe(),
    }
