"""Load stable-ABI extensions under the running torch and check that every op registers.

    python scripts/stable_load_check.py DIR_OR_WHEEL

DIR_OR_WHEEL holds ``causal_conv1d/_cuda*.so`` and ``selective_scan/_cuda*.so`` (an unpacked
tree or a wheel). Each library is loaded with ``torch.ops.load_library``, which runs its
registrations against this torch's runtime, and every op the bindings define (the schema
tables in csrc/<kernel>/*_ops.h) must then have a schema under
``torch.ops.mamba_kernels``. No op is called: that needs a GPU. This is how a binary built
against new headers is shown to load on an older torch (docs/STABLE_ABI.md). Exit 1 on a
failed load or a missing op.
"""

from __future__ import annotations

import re
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def defined_ops() -> list:
    """The op names of the schema tables both bindings register (csrc/<kernel>/*_ops.h): the first
    string of each entry starts with the name and its parenthesis."""
    names = []
    for src in sorted(ROOT.glob("csrc/*/*_ops.h")):
        for table in re.findall(r"k\w+Schemas\[\] = \{(.*?)\};", src.read_text(), re.S):
            names += re.findall(r'(?:^|,)\s*"(\w+)\(', table.strip())
    return names


def libraries(where: Path) -> list:
    if where.is_file():
        tmp = Path(tempfile.mkdtemp(prefix="stable-load-"))
        with zipfile.ZipFile(where) as z:
            z.extractall(tmp)
        where = tmp
    return sorted(where.glob("causal_conv1d/_cuda*.so")) + sorted(where.glob("selective_scan/_cuda*.so"))


def main(argv) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    import torch

    libs = libraries(Path(argv[0]))
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}); {len(libs)} libraries")
    ops = defined_ops()
    bad = (0 if len(libs) == 2 else 1) + (0 if ops else 1)  # nothing to look for is a failure too
    for lib in libs:
        try:
            torch.ops.load_library(str(lib))
            print(f"loaded {lib}")
        except Exception as e:  # the point of the check: report it and go on
            print(f"FAILED to load {lib}: {type(e).__name__}: {e}")
            bad += 1
    if not ops:
        print("no op schemas found in csrc/*/*_ops.h")
    for name in ops:
        try:
            print(f"  {getattr(torch.ops.mamba_kernels, name).default._schema}")
        except (AttributeError, RuntimeError) as e:
            print(f"  MISSING {name}: {e}")
            bad += 1
    print("OK" if not bad else f"{bad} problem(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
