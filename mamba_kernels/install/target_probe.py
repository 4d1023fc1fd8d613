"""What an interpreter has installed, printed as one JSON object: its Python, platform, torch
build, whether pip is there, and the folders an installer writes to. ``install`` runs this
file's text with the target interpreter (``python -c``), so it uses the standard library only
and imports nothing of this package; for the running interpreter it calls :func:`facts`
directly."""

import importlib.util
import json
import platform
import sys
import sysconfig


def facts():
    out = {
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "sys_platform": sys.platform,
        "machine": platform.machine(),
        "executable": sys.executable,
        "prefix": sys.prefix,
        "pip": importlib.util.find_spec("pip") is not None,
        "torch": None,
    }
    paths = sysconfig.get_paths()  # where an installer writes: what install must be able to undo
    out.update(purelib=paths["purelib"], platlib=paths["platlib"], scripts=paths["scripts"])
    try:
        if importlib.util.find_spec("torch") is not None:
            # optional: the probe reports a target without torch
            import torch

            abi = getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", None)
            out["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda,
                            "cxx11_abi": None if abi is None else bool(abi)}
    except Exception as e:  # a torch that fails to import is reported, not matched against
        out["torch"] = {"error": f"{type(e).__name__}: {e}"}
    return out


if __name__ == "__main__":
    print(json.dumps(facts()))
