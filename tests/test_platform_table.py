"""One platform table: every fact of a platform is its record in facts/support.json, so a new
platform is a data change. Shown with a fictitious one (linux_ppc64le) added to a temporary copy
of the package and ci/: the matrix plans its cells, ci/ gives them their runner and cibuildwheel
fields, the wheel
names carry its label and tag, and the resolver picks its wheel, without a line of code changed."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ci import cell_fields
from mamba_kernels.facts import support

ROOT = Path(__file__).resolve().parent.parent
NEW = "linux_ppc64le"


def _copy_with_new_platform(tmp_path: Path) -> Path:
    """A copy of the package and ci/ whose support table has a platform more: a Linux machine
    whose torch builds are cxx11 and ship the CUDA variants of Linux aarch64."""
    dest = tmp_path / "tree"
    for package in ("mamba_kernels", "ci"):
        shutil.copytree(ROOT / package, dest / package, ignore=shutil.ignore_patterns("__pycache__"))
    path = dest / "mamba_kernels" / "facts" / "support.json"
    data = support.read_data(path)
    record = dict(data["platforms"][1])  # linux_aarch64's keys, in their order
    record.update(
        name=NEW, os="linux", machines=["ppc64le"], tag_arch="ppc64le", manylinux=True,
        markers={"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
                 "platform_machine": "ppc64le"},
        cibw_platform="linux", cibw_arch="ppc64le", cibw_identifier="manylinux_ppc64le",
        runner="ubuntu-24.04-ppc64le", redist_arch="linux-ppc64le", default_archs="aarch64",
        cxx11_abi=True, pypi_wheel=False,
    )
    data["platforms"].append(record)
    for rel in data["releases"]:
        rel["cuda"][NEW] = list(rel["cuda"]["linux_aarch64"])
    support.write_data(data, path)  # checked as the real table is
    return dest


def _run(tree: Path, *args: str, module: str = "mamba_kernels") -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAMBA_KERNELS_")}
    env["PYTHONPATH"] = str(tree)
    r = subprocess.run([sys.executable, "-m", module, *args], cwd=tree, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


def test_the_real_table_has_no_such_platform():
    # the copy below is what adds it: the table here does not
    assert NEW not in support.PLATFORMS and NEW not in cell_fields.RUNNERS


def test_a_new_platform_is_planned_labelled_and_resolved_from_data_alone(tmp_path):
    tree = _copy_with_new_platform(tmp_path)

    # planned: its cells, with the runner label and cibuildwheel fields of its record
    planned = json.loads(_run(tree, "--platform", NEW, "--json", module="ci.cell_fields"))
    cells = planned["cells"]
    assert cells and planned["counts"][NEW] == len(cells) and all(c["platform"] == NEW for c in cells)
    assert any(c["stable"] for c in cells) and any(not c["stable"] for c in cells)
    for c in cells:
        assert c["runner"] == "ubuntu-24.04-ppc64le", c["id"]
        assert (c["cibw_platform"], c["cibw_archs"]) == ("linux", "ppc64le"), c["id"]
        assert c["cibw_build"].endswith("-manylinux_ppc64le"), c["id"]
        assert c["cxx11_abi"] is (None if c["stable"] else True), c["id"]
    github = json.loads(_run(tree, "--platform", NEW, "--github", module="ci.cell_fields"))
    assert {e["runner"] for e in github["include"]} == {"ubuntu-24.04-ppc64le"}
    by_arch = json.loads(_run(tree, "matrix", "--arch", "ppc64le", "--json"))["cells"]
    assert [c["id"] for c in by_arch] == [c["id"] for c in cells]

    # labelled: the wheel name carries the label and the manylinux tag of the new architecture
    cell = [c for c in cells if not c["stable"] and c["python"] == "3.12"][-1]
    wheel = cell["wheel"]
    assert f"+{cell['label']}-cp312-cp312-{cell['manylinux']}_ppc64le.whl" in wheel

    # resolvable: against an index of every wheel of the matrix, a ppc64le machine gets it
    wheels = _run(tree, "matrix", "--wheels").split()
    assert wheel in wheels
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"schema": 2, "project": "mamba-kernels", "wheels": [
        {"filename": w, "url": f"https://example.invalid/dl/{w}", "sha256": "0" * 64,
         "label": w.split("-")[1].split("+")[1]} for w in wheels]}))
    got = json.loads(_run(tree, "resolve", "--index", str(manifest), "--torch", f"{cell['torch']}.0",
                          "--cuda", cell["cuda"], "--python", "3.12", "--platform", NEW,
                          "--gpu-arch", "9.0", "--json"))
    assert got["selected"] == wheel, got["reason"]
    # and the platform is known by its machine name, as detection finds it
    code = ("from mamba_kernels.install import environment as e; "
            "print(e.platform_name('linux', 'ppc64le'), e.platform_tags_for('manylinux_2_28_ppc64le')[0])")
    env = dict(os.environ, PYTHONPATH=str(tree))
    r = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True)
    assert r.stdout.split() == [NEW, NEW], r.stderr
