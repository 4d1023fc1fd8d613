"""Writing a test wheel from its files: the RECORD (every file's sha256 and size, as pip checks
them) added under the wheel's .dist-info, then the zip. Shared by the tests that build wheels."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path
from typing import Dict


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def write_wheel(path: Path, files: Dict[str, bytes], dist_info: str,
                compression: int = zipfile.ZIP_STORED) -> Path:
    """``files`` (archive name -> bytes) plus ``<dist_info>/RECORD``, zipped to ``path``."""
    files = dict(files)
    record = [record_line(n, d) for n, d in files.items()] + [f"{dist_info}/RECORD,,"]
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression) as zf:
        for n, d in files.items():
            zf.writestr(n, d)
    return path
