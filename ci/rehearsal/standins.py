"""What the rehearsal's stand-in actions do (ci/rehearsal/actions/<owner>/<repo>/action.yml).

Each stand-in is a composite action whose one step runs ``python standins.py <action>`` with the
action's inputs in ``INPUT_<NAME>`` variables (upper case, ``-`` as ``_``), the way a runner hands
inputs to an action. It does to the job what the real action does, on this machine and with
nothing fetched from GitHub:

  checkout                 a clean clone of $REHEARSAL_ORIGIN at the input ref (else the run's
                           commit) in the workspace, detached, depth 1, no credentials kept
  setup-python             a fresh virtual environment of the requested CPython with pip only,
                           first on PATH (what the runner's interpreter holds)
  upload-artifact          the matched files into $REHEARSAL_ARTIFACTS/<name>/, relative to the
                           least common ancestor of the search paths; a name already uploaded
                           in the run is refused unless ``overwrite``
  download-artifact        by name: that artifact's files into ``path``; by pattern (or none):
                           each match into path/<name>/, or all into ``path`` with merge-multiple
                           or when only one matches
  cache-restore/save       $REHEARSAL_CACHE/<key>.tar: exact key, else the newest whose key
                           starts with a restore key; a key is written once (a second save warns)
  attest-build-provenance  an in-toto statement of every subject's sha256 under $RUNNER_TEMP
  upload-pages-artifact    the site folder as artifact.tar in the artifact <name>
  deploy-pages             that tar unpacked into the local GitHub stand-in's Pages site
  create-github-app-token  a token, refused without a client id and a private key
  pypi-publish             twine check, then twine upload to the local index standing in for
                           the input repository-url ($REHEARSAL_PYPI maps one to the other)

Only the standard library here: the stand-ins run with the rehearsal's own interpreter
($REHEARSAL_PYTHON), never the job's.
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional, Sequence

HERE = Path(__file__).resolve().parent


class StandInError(RuntimeError):
    """The action fails; the message becomes one ::error line."""


def inp(name: str, default: str = "") -> str:
    return os.environ.get("INPUT_" + name.upper().replace("-", "_"), default).strip() or default


def flag(name: str, default: bool = False) -> bool:
    value = inp(name, "true" if default else "false").lower()
    if value not in ("true", "false"):
        raise StandInError(f"input {name} must be true or false, got {value!r}")
    return value == "true"


def lines(value: str) -> List[str]:
    return [s.strip() for s in value.replace(",", "\n").splitlines() if s.strip()]


def out(**values: str) -> None:
    path = os.environ.get("GITHUB_OUTPUT")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            for k, v in values.items():
                f.write(f"{k}={v}\n")


def add_path(folder: Path) -> None:
    with open(os.environ["GITHUB_PATH"], "a", encoding="utf-8") as f:
        f.write(f"{folder}\n")


def add_env(**values: str) -> None:
    with open(os.environ["GITHUB_ENV"], "a", encoding="utf-8") as f:
        for k, v in values.items():
            f.write(f"{k}={v}\n")


def need_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise StandInError(f"{name} is not set: this stand-in runs only under python -m ci.rehearse")
    return value


def workspace() -> Path:
    return Path(need_env("GITHUB_WORKSPACE"))


def git(*args: str, cwd: Optional[Path] = None) -> str:
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise StandInError(f"git {' '.join(args)}: {r.stderr.strip()[-300:]}")
    return r.stdout.strip()


# ----------------------------------------------------------------------------- checkout


def checkout() -> None:
    origin = need_env("REHEARSAL_ORIGIN")
    dest = workspace() / inp("path", ".")
    ref = inp("ref") or need_env("GITHUB_SHA")
    dest.mkdir(parents=True, exist_ok=True)
    for child in dest.iterdir():  # the real action cleans the folder it checks out into
        shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    git("init", "-q", str(dest))
    url = Path(origin).resolve().as_uri()
    candidates = [ref] if len(ref) == 40 else [f"refs/tags/{ref}", f"refs/heads/{ref}", ref]
    if ref.startswith("refs/"):
        candidates = [ref]
    for cand in candidates:
        r = subprocess.run(["git", "fetch", "-q", "--depth=1", "--no-tags", url, cand], cwd=dest,
                           capture_output=True, text=True)
        if r.returncode == 0:
            break
    else:
        raise StandInError(f"checkout: {ref!r} is not a commit, tag or branch of the repository")
    git("checkout", "-q", "--detach", "FETCH_HEAD", cwd=dest)
    print(f"checked out {ref} ({git('rev-parse', 'HEAD', cwd=dest)}) into {dest}")


# ----------------------------------------------------------------------------- setup-python


def find_python(version: str) -> Path:
    """An interpreter of CPython ``version`` (X.Y) on this machine: $REHEARSAL_PYTHON_X_Y, pyenv's,
    the PATH's, or uv's."""
    env = os.environ.get("REHEARSAL_PYTHON_" + version.replace(".", "_"))
    found: List[str] = [env] if env else []
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found += sorted(glob.glob(str(root / f"{version}.*" / "bin" / f"python{version}")), reverse=True)
    on_path = shutil.which(f"python{version}")
    found += [on_path] if on_path else []
    uv = os.environ.get("REHEARSAL_UV")
    if uv:
        r = subprocess.run([uv, "python", "find", "--no-project", version], capture_output=True, text=True)
        found += [r.stdout.strip()] if r.returncode == 0 and r.stdout.strip() else []
    for cand in found:
        r = subprocess.run([cand, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                           capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.strip() == version:
            return Path(cand)
    raise StandInError(f"setup-python: no CPython {version} on this machine (pyenv, PATH, uv); install it "
                       f"or set REHEARSAL_PYTHON_{version.replace('.', '_')}")


def setup_python() -> None:
    version = inp("python-version")
    if not version:
        raise StandInError("setup-python: python-version is empty (the workflow must name one)")
    if version.count(".") != 1:
        raise StandInError(f"setup-python: the stand-in takes X.Y versions, got {version!r}")
    base = find_python(version)
    venv = Path(need_env("RUNNER_TEMP")) / "setup-python" / version
    shutil.rmtree(venv, ignore_errors=True)
    r = subprocess.run([str(base), "-m", "venv", str(venv)], capture_output=True, text=True)
    if r.returncode != 0:
        raise StandInError(f"setup-python: venv of {base} failed: {r.stderr.strip()[-300:]}")
    py = venv / "bin" / "python"
    full = subprocess.run([str(py), "-c", "import platform; print(platform.python_version())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    have = subprocess.run([str(py), "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check"],
                          capture_output=True, text=True).stdout.split()
    add_path(venv / "bin")
    add_env(pythonLocation=str(venv), Python_ROOT_DIR=str(venv), Python3_ROOT_DIR=str(venv))
    out(**{"python-version": full, "python-path": str(py), "cache-hit": "false"})
    print(f"CPython {full} from {base} in a fresh environment holding only {', '.join(have) or 'nothing'}")


# ----------------------------------------------------------------------------- artifacts


def artifacts_dir() -> Path:
    path = Path(need_env("REHEARSAL_ARTIFACTS"))
    path.mkdir(parents=True, exist_ok=True)
    return path


GLOB_CHARS = set("*?[")


def _search_root(pattern: str) -> Path:
    parts = Path(pattern).parts
    fixed = []
    for p in parts:
        if GLOB_CHARS & set(p):
            break
        fixed.append(p)
    root = Path(*fixed) if fixed else Path(".")
    return root.parent if root.is_file() or len(fixed) == len(parts) and not root.is_dir() else root


def match_files(patterns: Sequence[str], hidden: bool) -> Dict[Path, Path]:
    """{file: path relative to the least common ancestor of the search paths}, the way
    upload-artifact lays an artifact out; ``!pattern`` excludes."""
    include = [p for p in patterns if not p.startswith("!")]
    exclude = [p[1:] for p in patterns if p.startswith("!")]
    files: List[Path] = []
    roots: List[Path] = []
    for pat in include:
        pat = os.path.expanduser(pat)
        roots.append(_search_root(pat).resolve())
        for hit in sorted(glob.glob(pat, recursive=True)):
            h = Path(hit)
            files += sorted(x for x in h.rglob("*") if x.is_file()) if h.is_dir() else [h]
    files = [f.resolve() for f in files if not any(fnmatch.fnmatch(str(f), e) for e in exclude)]
    if not hidden:
        files = [f for f in files if not any(part.startswith(".") for part in f.parts[-3:])]
    if not files:
        return {}
    common = Path(os.path.commonpath([str(r) for r in roots])) if roots else Path.cwd()
    return {f: f.relative_to(common) if str(f).startswith(str(common) + os.sep) else Path(f.name)
            for f in dict.fromkeys(files)}


def store_artifact(name: str, files: Dict[Path, Path], overwrite: bool) -> Path:
    dest = artifacts_dir() / name
    if dest.exists() and not overwrite:
        raise StandInError(f"upload-artifact: an artifact named {name!r} already exists in this run "
                           "(names are unique per run unless overwrite: true)")
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=artifacts_dir()))
    for src, rel in files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, tmp / rel)
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    return dest


def upload_artifact() -> None:
    name = inp("name", "artifact")
    files = match_files(lines(inp("path")), flag("include-hidden-files"))
    if not files:
        mode = inp("if-no-files-found", "warn")
        msg = f"upload-artifact: no files were found with the provided path: {inp('path')}"
        if mode == "error":
            raise StandInError(msg)
        print(f"::warning::{msg}" if mode == "warn" else msg)
        return
    dest = store_artifact(name, files, flag("overwrite"))
    size = sum(f.stat().st_size for f in files)
    out(**{"artifact-id": str(abs(hash(name)) % 10**9), "artifact-url": dest.as_uri()})
    print(f"artifact {name}: {len(files)} files, {size} bytes")


def download_artifact() -> None:
    name, pattern = inp("name"), inp("pattern")
    dest = Path(inp("path", str(workspace())))
    dest = dest if dest.is_absolute() else workspace() / dest
    store = artifacts_dir()
    if name:
        if not (store / name).is_dir():
            raise StandInError(f"download-artifact: Artifact not found for name: {name}")
        picked, merge = [name], True
    else:
        picked = sorted(p.name for p in store.iterdir() if p.is_dir() and not p.name.startswith(".")
                        and (not pattern or fnmatch.fnmatch(p.name, pattern)))
        # one artifact found goes straight into path, as when downloading by name (v5 and later)
        merge = flag("merge-multiple") or len(picked) == 1
    for art in picked:
        target = dest if merge else dest / art
        for f in sorted((store / art).rglob("*")):
            if f.is_file():
                (target / f.relative_to(store / art)).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, target / f.relative_to(store / art))
    out(**{"download-path": str(dest)})
    print(f"downloaded {len(picked)} artifact(s) into {dest}: {', '.join(picked) or 'none'}")


# ----------------------------------------------------------------------------- cache


def cache_dir() -> Path:
    path = Path(need_env("REHEARSAL_CACHE"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _cache_file(key: str) -> Path:
    return cache_dir() / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".tar")


def cache_restore() -> None:
    key = inp("key")
    if not key:
        raise StandInError("cache: Input required and not supplied: key")
    index = {}
    for meta in cache_dir().glob("*.json"):
        entry = json.loads(meta.read_text())
        index[entry["key"]] = entry
    hit = index.get(key)
    if hit is None:
        for prefix in lines(inp("restore-keys").replace(",", "\n")):
            matches = sorted((e for k, e in index.items() if k.startswith(prefix)), key=lambda e: -e["time"])
            if matches:
                hit = matches[0]
                break
    out(**{"cache-primary-key": key})
    if hit is None:
        out(**{"cache-hit": "false"})
        if flag("fail-on-cache-miss"):
            raise StandInError(f"cache: failed to restore cache entry; exiting as fail-on-cache-miss is set. "
                               f"Input key: {key}")
        print(f"Cache not found for input keys: {key}")
        return
    with tarfile.open(_cache_file(hit["key"])) as tar:
        tar.extractall(workspace(), filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(
            workspace())
    out(**{"cache-hit": str(hit["key"] == key).lower(), "cache-matched-key": hit["key"]})
    print(f"Cache restored from key: {hit['key']}")


def cache_save() -> None:
    key = inp("key")
    if not key:
        raise StandInError("cache: Input required and not supplied: key")
    if _cache_file(key).exists():
        print(f"::warning::Failed to save: Unable to reserve cache with key {key}, another job may be "
              "creating this cache.")
        return
    paths = [workspace() / p for p in lines(inp("path").replace(",", "\n"))]
    present = [p for p in paths if p.exists()]
    if not present:
        print("::warning::Path Validation Error: Path(s) specified in the action for caching do(es) not "
              "exist, hence no cache is being saved.")
        return
    tmp = _cache_file(key).with_suffix(".part")
    with tarfile.open(tmp, "w") as tar:
        for p in present:
            tar.add(p, arcname=str(p.relative_to(workspace())))
    tmp.rename(_cache_file(key))
    _cache_file(key).with_suffix(".json").write_text(json.dumps({"key": key, "time": time.time()}))
    print(f"Cache saved with key: {key}")


# ----------------------------------------------------------------------------- attestations, Pages


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def attest_build_provenance() -> None:
    patterns = lines(inp("subject-path"))
    subjects = [Path(p) for pat in patterns for p in sorted(glob.glob(pat, recursive=True))
                if Path(p).is_file()]
    if not subjects:
        raise StandInError(f"attest-build-provenance: could not find subject at path {inp('subject-path')}")
    statement = {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": s.name, "digest": {"sha256": sha256_file(s)}} for s in subjects],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {"buildDefinition": {"externalParameters": {
            "workflow": os.environ.get("GITHUB_WORKFLOW_REF", ""), "ref": os.environ.get("GITHUB_REF", "")}}},
    }
    bundle = Path(need_env("RUNNER_TEMP")) / "attestation.json"
    bundle.write_text(json.dumps(statement, indent=1))
    out(**{"bundle-path": str(bundle), "attestation-id": "0", "attestation-url": bundle.as_uri()})
    print(f"attested {len(subjects)} subjects")


def upload_pages_artifact() -> None:
    site = Path(inp("path", "_site/"))
    site = site if site.is_absolute() else workspace() / site
    if not site.is_dir():
        raise StandInError(f"upload-pages-artifact: {site} is not a folder")
    tar_path = Path(need_env("RUNNER_TEMP")) / "artifact.tar"
    with tarfile.open(tar_path, "w", dereference=True) as tar:
        for f in sorted(site.rglob("*")):
            rel = f.relative_to(site)
            if rel.parts[0] in (".git", ".github") or (
                    not flag("include-hidden-files") and any(p.startswith(".") for p in rel.parts)):
                continue
            tar.add(f, arcname=str(rel), recursive=False)
    dest = store_artifact(inp("name", "github-pages"), {tar_path: Path("artifact.tar")}, False)
    out(**{"artifact_id": dest.name})
    print(f"pages artifact {inp('name', 'github-pages')}: {tar_path.stat().st_size} bytes")


def deploy_pages() -> None:
    name = inp("artifact_name", "github-pages")
    tar_path = artifacts_dir() / name / "artifact.tar"
    if not tar_path.is_file():
        raise StandInError(f"deploy-pages: Fetching artifact metadata failed: no artifact named {name!r}")
    repo = need_env("GITHUB_REPOSITORY")
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(tar_path) as tar:
            for m in tar.getmembers():
                if m.name.startswith("/") or ".." in Path(m.name).parts or m.issym() or m.islnk():
                    raise StandInError(f"deploy-pages: unsafe member {m.name!r} in the artifact")
            tar.extractall(tmp)
        # the local GitHub's own deploy (the tool's tree, not the rehearsed one)
        r = subprocess.run([sys.executable, "-m", "ci.rehearsal.github_api", "deploy", "--state",
                            need_env("REHEARSAL_GITHUB_STATE"), "--repo", repo, tmp],
                           cwd=HERE.parent.parent, capture_output=True, text=True)
        if r.returncode != 0:
            raise StandInError(f"deploy-pages: {(r.stderr or r.stdout).strip()[-300:]}")
    url = f"{need_env('GITHUB_API_URL').rstrip('/')}/pages/{repo}/"
    out(page_url=url)
    print(f"deployed {name} to {url}")


def create_github_app_token() -> None:
    if not (inp("client-id") or inp("app-id")) or not inp("private-key"):
        raise StandInError("create-github-app-token: [@octokit/auth-app] appId (client-id) and privateKey "
                           "are required")
    token = "ghs_rehearsal_" + hashlib.sha256(os.urandom(16)).hexdigest()[:20]
    print(f"::add-mask::{token}")
    out(token=token, **{"installation-id": "1", "app-slug": "rehearsal-app"})


def pypi_publish() -> None:
    url = inp("repository-url", "https://upload.pypi.org/legacy/")
    targets = json.loads(need_env("REHEARSAL_PYPI"))
    local = targets.get(url)
    if local is None:
        raise StandInError(f"pypi-publish: the rehearsal has no local index for {url} "
                           f"(it has {sorted(targets)})")
    dists = sorted(str(p) for p in (workspace() / inp("packages-dir", "dist")).glob("*")
                   if p.suffix in (".whl", ".gz"))
    if not dists:
        raise StandInError(f"pypi-publish: no distributions in {inp('packages-dir', 'dist')}")
    py = need_env("REHEARSAL_PYTHON")
    subprocess.run([py, "-m", "twine", "check", "--strict", *dists], check=True)
    if flag("skip-existing"):  # twine's own --skip-existing knows only PyPI's answers
        kept = []
        for d in dists:
            try:
                with urllib.request.urlopen(f"{local.rstrip('/')}/packages/{Path(d).name}", timeout=30):
                    print(f"skipping {Path(d).name}: already on {local}")
            except urllib.error.HTTPError as e:
                if e.code != 404:
                    raise StandInError(f"pypi-publish: {local} answered HTTP {e.code}") from None
                kept.append(d)
        dists = kept
        if not dists:
            return
    cmd = [py, "-m", "twine", "upload", "--non-interactive", "--repository-url", local, "-u", "rehearsal",
           "-p", "rehearsal", *dists]
    r = subprocess.run(cmd)
    if r.returncode != 0:
        raise StandInError(f"pypi-publish: twine upload to {local} (standing in for {url}) failed")


ACTIONS = {
    "checkout": checkout,
    "setup-python": setup_python,
    "upload-artifact": upload_artifact,
    "download-artifact": download_artifact,
    "cache-restore": cache_restore,
    "cache-save": cache_save,
    "attest-build-provenance": attest_build_provenance,
    "upload-pages-artifact": upload_pages_artifact,
    "deploy-pages": deploy_pages,
    "create-github-app-token": create_github_app_token,
    "pypi-publish": pypi_publish,
}


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in ACTIONS:
        print(f"usage: standins.py {{{','.join(ACTIONS)}}}", file=sys.stderr)
        return 2
    try:
        ACTIONS[args[0]]()
    except (StandInError, subprocess.CalledProcessError) as e:
        print(f"::error title={args[0]} (rehearsal stand-in)::{e}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
