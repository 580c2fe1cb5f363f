#!/usr/bin/env python3
"""stage_engine: carry an inference engine's wheels to a GPU runner that reaches no package index.

On a connected machine, `build` downloads the wheels an engine list names (for the runner's Python and
platform: cp312, manylinux x86_64 by default), packs them into one bundle and splits it into parts small
enough for whatever carries files to the runner (--part-size, default 60 MiB). A manifest records the
sha256 of every wheel, every part and the whole bundle. On the runner, `receive` keeps the parts that
arrive (in any order, over several transfers), checks each against the manifest, and once all are there
checks the whole bundle, then installs it into a target folder (pip --no-index --no-deps --target)
and imports the engine's module as a check. The runner needs python3, pip and packaging only.

    ci/stage_engine.py build ci/engines/sglang-0.5.15.txt           # here: .stage/sglang-0.5.15/
    ci/stage_engine.py next .stage/sglang-0.5.15                    # the next part into .stage/p/
    python3 ci/stage_engine.py receive .stage/p --target /tmp/site  # there, once per transfer
    ci/stage_engine.py check ci/engines/sglang-0.5.15.txt --image ci/engines/gpu-image-packages.txt

Engine list lines: `name==version [drop=GLOB,...]` (members left out of that wheel), `import: module`
(checked after installing), `skip: name  reason` (a dependency deliberately not carried), `accept: name
reason` (a version conflict with the image known to be harmless: a pin on a package the path never
imports), `# comment`.
A build holds a lock beside its folder (a second build into it is refused) and swaps the new stage in only
once it is complete: a failed build leaves the previous one as it was.
Exit codes: 0 done or a part kept, 1 a failed check, 2 bad input; errors are one line naming the file.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement  # pip's own; the GPU image has it too

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # this checkout's moebench (stdlib only here)
from moebench.core.sites import site_paths  # noqa: E402

MANIFEST = "manifest.json"
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (35, 34, 31, 28, 27, 26, 24, 17, 5)] + [
    "manylinux2014_x86_64", "manylinux1_x86_64"]
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")


class StageError(Exception):
    """A problem reported as one line; `code` is the exit code (1: a failed check, 2: bad input)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def norm(name: str) -> str:
    """A distribution name as package indexes compare them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def parse_size(text: str) -> int:
    """'60M', '512K', '1048576' -> bytes (K and M are binary: KiB, MiB)."""
    m = re.fullmatch(r"(\d+)([KMG]?)i?B?", text.strip(), re.I)
    if m and int(m[1]):
        return int(m[1]) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m[2].upper()]
    raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 60M, 512K or 1048576")


def read_list(path: Path) -> dict:
    """An engine list -> {'name', 'pins': [(name, version, drops)], 'imports': [...], 'skips': {norm: reason},
    'accepts': {norm: reason}} (`accept: name reason`: a version conflict with the image that is known harmless)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise StageError(f"{path}: cannot read: {e.strerror or e}") from None
    out: dict = {"name": path.stem, "pins": [], "imports": [], "skips": {}, "accepts": {}}
    for n, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, _, rest = line.partition(":")
        if key in ("import", "skip", "accept") and rest.strip():
            if key == "import":
                out["imports"].append(rest.strip())
            else:
                name, _, reason = rest.strip().partition(" ")
                out[key + "s"][norm(name)] = reason.strip() or "not needed"
            continue
        pin, *opts = line.split()
        m = _PIN.match(pin)
        if not m or any(not o.startswith("drop=") for o in opts):
            raise StageError(f"{path}:{n}: expected 'name==version [drop=GLOB,...]', 'import: module' or "
                             f"'skip: name reason', got {raw.strip()!r}")
        drops = [g for o in opts for g in o[len("drop="):].split(",") if g]
        out["pins"].append((m[1], m[2], drops))
    if not out["pins"]:
        raise StageError(f"{path}: names no wheel (lines like 'sglang==0.5.15')")
    return out


def download(pins: list, dest: Path, python_version: str, find_links: str | None) -> None:
    """pip download every pin (no dependencies: the list names them all) for the runner's platform."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           python_version, "--implementation", "cp", "-d", str(dest)]
    cmd += [a for p in PLATFORMS for a in ("--platform", p)]  # pip matches manylinux_2_N exactly
    if find_links:
        cmd += ["--no-index", "--find-links", find_links]
    proc = subprocess.run(cmd + [f"{n}=={v}" for n, v, _ in pins], capture_output=True, text=True)
    if proc.returncode != 0:
        tail = [ln for ln in proc.stderr.splitlines() if ln.strip() and "is ignored" not in ln][-3:]
        raise StageError("pip download failed: " + " | ".join(tail), code=1)


def wheel_of(folder: Path, name: str, version: str) -> Path:
    """The downloaded wheel of one pin (wheel file names normalize '-' and '.' to '_')."""
    stem = re.sub(r"[-_.]+", "_", name).lower()
    found = [p for p in folder.glob("*.whl") if p.name.lower().startswith(f"{stem}-{version}-")]
    if len(found) != 1:
        raise StageError(f"{name}=={version}: expected one downloaded wheel, found {[p.name for p in found]}", code=1)
    return found[0]


def drop_members(wheel: Path, globs: list[str]) -> int:
    """Rewrite a wheel without the members matching any glob (and without their RECORD lines);
    returns how many were left out. A glob that matches nothing is an error: the list went stale."""
    with zipfile.ZipFile(wheel) as zin:
        names = zin.namelist()
        gone = {n for n in names if any(fnmatch.fnmatchcase(n, g) for g in globs)}
        unused = [g for g in globs if not any(fnmatch.fnmatchcase(n, g) for n in names)]
        if unused:
            raise StageError(f"{wheel.name}: drop={','.join(unused)} matches no member of the wheel")
        tmp = wheel.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
            for info in zin.infolist():
                if info.filename in gone:
                    continue
                if info.filename.endswith(".dist-info/RECORD"):
                    zout.writestr(info, b"".join(ln for ln in zin.read(info).splitlines(keepends=True)
                                                 if ln.split(b",", 1)[0].decode() not in gone))
                    continue
                with zin.open(info) as src, zout.open(info, "w", force_zip64=True) as dst:  # streamed: GB members
                    shutil.copyfileobj(src, dst, 1 << 20)
    os.replace(tmp, wheel)
    return len(gone)


@contextlib.contextmanager
def build_lock(out: Path):
    """Hold OUT's build lock (a file beside it, with the holder's pid) for one build; StageError naming the lock
    and its holder when another build into OUT holds it: two builds into one folder would delete each other's
    wheels halfway."""
    lock = out.with_name(f".{out.name}.lock")
    with open(lock, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "?"
            raise StageError(f"another build into {out} is running (pid {holder}, lock {lock}): wait for it, or "
                             f"build elsewhere with --out") from None
        f.truncate(0)
        f.write(f"{os.getpid()}\n")
        f.flush()
        yield


def replace_folder(new: Path, out: Path) -> None:
    """Put the finished stage NEW where OUT is: the previous stage stays whole until the new one is complete."""
    old = out.with_name(f".{out.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        os.rename(out, old)
    os.rename(new, out)
    shutil.rmtree(old, ignore_errors=True)


def build(args: argparse.Namespace) -> int:
    """Download, pack, split, and write the manifest into OUT (default .stage/<list name>), built beside it and
    swapped in once complete (a failed build leaves the previous stage as it was), under OUT's build lock."""
    spec = read_list(Path(args.list))
    out = Path(args.out or Path(".stage") / spec["name"])
    out.parent.mkdir(parents=True, exist_ok=True)
    with build_lock(out):
        building = out.with_name(f".{out.name}.building")
        try:
            summary = build_into(spec, building, args)
        except BaseException:
            shutil.rmtree(building, ignore_errors=True)
            raise
        replace_folder(building, out)
    print(f"{spec['name']}: {summary} in {out}; now: {Path(sys.argv[0]).name} next {out}")
    return 0


def build_into(spec: dict, out: Path, args: argparse.Namespace) -> str:
    """Download, pack and split the list's wheels into a fresh OUT and write its manifest; what it holds, in
    words."""
    work = out / "wheels"
    shutil.rmtree(out, ignore_errors=True)
    work.mkdir(parents=True)
    download(spec["pins"], work, args.python_version, args.find_links)
    wheels = []
    for name, version, drops in spec["pins"]:
        w = wheel_of(work, name, version)
        left_out = drop_members(w, drops) if drops else 0
        wheels.append({"file": w.name, "sha256": sha256(w), "bytes": w.stat().st_size, "dropped_members": left_out})
    bundle = out / "bundle.tar"
    with tarfile.open(bundle, "w") as tar:  # wheels are compressed already: a plain tar
        for w in wheels:
            tar.add(work / w["file"], arcname=f"wheels/{w['file']}")
    parts = []
    with open(bundle, "rb") as f:
        for i, block in enumerate(iter(lambda: f.read(args.part_size), b"")):
            part = out / f"{spec['name']}.part{i:03d}"
            part.write_bytes(block)
            parts.append({"file": part.name, "sha256": hashlib.sha256(block).hexdigest(), "bytes": len(block)})
    manifest = {"engine": spec["name"], "bundle_sha256": sha256(bundle), "bundle_bytes": bundle.stat().st_size,
                "parts": parts, "wheels": wheels, "imports": spec["imports"], "python_version": args.python_version}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    bundle.unlink()
    shutil.rmtree(work)
    (out / "next").write_text("0\n")
    return (f"{len(wheels)} wheels, {manifest['bundle_bytes'] / (1 << 20):.0f} MiB in {len(parts)} parts of at most "
            f"{args.part_size / (1 << 20):.0f} MiB")


def next_part(args: argparse.Namespace) -> int:
    """Copy the next part and the manifest into SEND (emptied first): what one transfer carries."""
    stage, send, counter = Path(args.stage), Path(args.send), Path(args.stage) / "next"
    manifest = load_manifest(stage)
    i = 0 if args.from_start or not counter.exists() else int(counter.read_text())
    total = len(manifest["parts"])
    if i >= total:
        print(f"all {total} parts sent; --from-start sends them again (a fresh runner)")
        return 0
    shutil.rmtree(send, ignore_errors=True)
    send.mkdir(parents=True)
    shutil.copy2(stage / manifest["parts"][i]["file"], send)
    shutil.copy2(stage / MANIFEST, send)
    counter.write_text(f"{i + 1}\n")
    print(f"part {i + 1} of {total} is in {send}: carry it over and run there: "
          f"python3 ci/stage_engine.py receive {send} --target /tmp/site")
    return 0


def load_manifest(folder: Path) -> dict:
    """The manifest of a stage or send folder; StageError naming the file when it is missing or broken."""
    path = folder / MANIFEST
    try:
        doc = json.loads(path.read_text())
        assert isinstance(doc["parts"], list) and doc["bundle_sha256"] and doc["engine"]
        return doc
    except (OSError, ValueError, KeyError, TypeError, AssertionError) as e:
        raise StageError(f"{path}: not a stage_engine manifest ({type(e).__name__}: {e})") from None


def receive(args: argparse.Namespace) -> int:
    """Keep the parts found in SEND (each checked), and install once the bundle is complete."""
    send, keep = Path(args.send), Path(args.keep)
    manifest = load_manifest(send)
    keep.mkdir(parents=True, exist_ok=True)
    kept_path = keep / MANIFEST
    kept = load_manifest(keep) if kept_path.exists() else manifest
    if kept["bundle_sha256"] != manifest["bundle_sha256"]:
        raise StageError(f"{send}/{MANIFEST}: a part of another bundle ({manifest['engine']} "
                         f"{manifest['bundle_sha256'][:12]}) than the one kept in {keep} ({kept['engine']} "
                         f"{kept['bundle_sha256'][:12]}); empty {keep} to start over")
    expected = {p["file"]: p for p in manifest["parts"]}
    for name in sorted(p.name for p in send.iterdir() if p.name != MANIFEST):
        if name not in expected:
            raise StageError(f"{send / name}: not a part of {manifest['engine']} (its parts: "
                             f"{manifest['parts'][0]['file']} ... {manifest['parts'][-1]['file']})")
        check_part(send / name, expected[name])
        shutil.copy2(send / name, keep / name)
    shutil.copy2(send / MANIFEST, kept_path)
    missing = missing_parts(keep, manifest)
    print(f"{manifest['engine']}: {len(manifest['parts']) - len(missing)} of {len(manifest['parts'])} parts in {keep}"
          + (f"; still to come: {', '.join(missing)}" if missing else ""))
    if missing:
        return 0
    if args.keep_only:
        print(f"{manifest['engine']}: complete; install later with: {Path(sys.argv[0]).name} install --keep {keep} "
              f"--target {args.target}")
        return 0
    return install(keep, Path(args.target))


def missing_parts(keep: Path, manifest: dict) -> list[str]:
    """The manifest's parts not (yet) in keep."""
    return [p["file"] for p in manifest["parts"] if not (keep / p["file"]).exists()]


def check_part(path: Path, entry: dict) -> None:
    """A part's size and sha256 against its manifest entry; StageError (exit 1) naming the part."""
    got = sha256(path)
    if got != entry["sha256"]:
        raise StageError(f"{path}: sha256 {got[:16]}... but the manifest says {entry['sha256'][:16]}... "
                         f"({path.stat().st_size} of {entry['bytes']} bytes): this part is corrupt, send it again",
                         code=1)


def install(keep: Path, target: Path) -> int:
    """Check every kept part and the joined bundle, unpack the wheels and pip-install them into target."""
    manifest = load_manifest(keep)
    missing = missing_parts(keep, manifest)
    if missing:
        raise StageError(f"{keep}: the bundle is incomplete: missing {', '.join(missing)} "
                         f"({len(missing)} of {len(manifest['parts'])} parts)", code=1)
    with tempfile.TemporaryDirectory(dir=keep) as tmp:
        bundle = Path(tmp) / "bundle.tar"
        with open(bundle, "wb") as out:
            for p in manifest["parts"]:
                check_part(keep / p["file"], p)
                with open(keep / p["file"], "rb") as f:
                    shutil.copyfileobj(f, out)
        if (got := sha256(bundle)) != manifest["bundle_sha256"]:
            raise StageError(f"{keep}: the joined parts hash to {got[:16]}..., the manifest says "
                             f"{manifest['bundle_sha256'][:16]}...", code=1)
        with tarfile.open(bundle) as tar:
            tar.extractall(tmp, filter="data")
        wheels = []
        for w in manifest["wheels"]:
            path = Path(tmp) / "wheels" / w["file"]
            if sha256(path) != w["sha256"]:
                raise StageError(f"{path.name}: its sha256 differs from the manifest's", code=1)
            wheels.append(str(path))
        target.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                               "--no-cache-dir", "--upgrade", "--target", str(target), *wheels],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise StageError("pip install failed: " + " | ".join(proc.stderr.strip().splitlines()[-3:]), code=1)
    print(f"{manifest['engine']}: {len(wheels)} wheels installed into {target}")
    path = os.pathsep.join(site_paths(target))
    for module in manifest.get("imports", []):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([path, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        code = f"import {module} as m; print(getattr(m, '__version__', ''))"
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
            raise StageError(f"import {module} from {target} failed: {last}", code=1)
        print(f"import {module}: ok {proc.stdout.strip()}")
    print(f"ready: export PYTHONPATH={path}")
    return 0



def requirements_of(wheel: Path) -> list[str]:
    """The Requires-Dist lines of a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        text = z.read(meta).decode("utf-8", "replace")
    return [ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Requires-Dist:")]


def read_image(path: Path) -> dict[str, str | None]:
    """The runner's installed packages: one `name` or `name==version` (pip freeze) a line -> {norm name: version or None}."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise StageError(f"{path}: cannot read: {e.strerror or e}") from None
    image: dict[str, str | None] = {}
    for n, raw in enumerate(lines, 1):
        line = raw.split("#")[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not _NAME.fullmatch(name.strip()) or (sep and not version.strip()):
            raise StageError(f"{path}:{n}: expected 'name' or 'name==version', got {raw.strip()!r}")
        image[norm(name.strip())] = version.strip() or None
    return image


def check(args: argparse.Namespace) -> int:
    """Every dependency of the listed wheels (markers evaluated for the runner: Linux x86_64, CPython of
    --python-version, no extras) must be in the list, in the image's package list, or a `skip:` line; and
    where its version is known (carried, or `name==version` in the image list) it must satisfy the
    requirement: the processes that put the carried folder first still import the image's copy of
    every package the folder lacks (transformers 5.12.1 refused the image's tokenizers 0.23.2 at import)."""
    spec = read_list(Path(args.list))
    image = read_image(Path(args.image))
    carried = {norm(n): v for n, v, _ in spec["pins"]}
    env = {"sys_platform": "linux", "platform_machine": "x86_64", "platform_system": "Linux", "os_name": "posix",
           "python_version": args.python_version, "python_full_version": args.python_version + ".0", "extra": "",
           "implementation_name": "cpython", "platform_python_implementation": "CPython"}
    missing: dict[str, list[str]] = {}
    conflicts: list[str] = []
    accepted: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        download(spec["pins"], Path(tmp), args.python_version, args.find_links)
        for name, version, _ in spec["pins"]:
            for line in requirements_of(wheel_of(Path(tmp), name, version)):
                try:
                    req = Requirement(line)
                except InvalidRequirement:
                    continue
                if req.marker is not None and not req.marker.evaluate(env):
                    continue
                dep = norm(req.name)
                if dep in carried:
                    have, where = carried[dep], "carried"
                elif dep in image:
                    have, where = image[dep], "in the image"
                elif dep in spec["skips"]:
                    continue
                else:
                    missing.setdefault(dep, []).append(f"{name} needs {line}")
                    continue
                if have is not None and req.specifier and not req.specifier.contains(have, prereleases=True):
                    if dep in spec["accepts"]:
                        accepted.append(f"accepted: {dep} {have} {where}, {name} {version} needs {line} "
                                        f"({spec['accepts'][dep]})")
                        continue
                    fix = "carry one that fits" if where == "in the image" else "pin one that fits"
                    conflicts.append(f"conflict: {dep} {have} {where}, but {name} {version} needs {line}: {fix}")
    for dep, why in sorted(missing.items()):
        print(f"missing: {dep} ({'; '.join(why)})")
    for line in accepted + conflicts:
        print(line)
    unversioned = sum(1 for v in image.values() if v is None)
    print(f"{spec['name']}: {len(carried)} wheels, {len(spec['skips'])} dependencies skipped on purpose, "
          f"{len(missing)} missing, {len(conflicts)} version conflicts"
          + (f" ({unversioned} image packages without a version: not checked)" if unversioned else ""))
    return 1 if missing or conflicts else 0


def build_parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(prog="stage_engine.py", description=__doc__.split("\n\n")[0],
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="{build,next,receive,install,check}")
    b = sub.add_parser("build", help="download, pack and split an engine list's wheels (connected machine)")
    b.add_argument("list", metavar="ENGINE_LIST", help="e.g. ci/engines/sglang-0.5.15.txt")
    b.add_argument("--out", metavar="DIR", help="stage folder (default .stage/<list name>)")
    b.add_argument("--part-size", type=parse_size, default=60 << 20, metavar="SIZE",
                   help="largest part (default 60M: the GPU machine takes 64 MiB per call)")
    for q in (b, sub.add_parser("check", help="list dependencies neither carried, in the image nor skipped")):
        q.add_argument("--python-version", default="3.12", metavar="X.Y", help="the runner's Python (default 3.12)")
        q.add_argument("--find-links", metavar="DIR", help="take wheels from DIR only (no index), e.g. for tests")
    c = sub.choices["check"]
    c.add_argument("list", metavar="ENGINE_LIST")
    c.add_argument("--image", required=True, metavar="FILE",
                   help="the runner's installed packages, one `name` or `name==version` a line (pip freeze)")
    n = sub.add_parser("next", help="put the next part and the manifest into SEND (one transfer's worth)")
    n.add_argument("stage", metavar="STAGE_DIR", help="what build wrote, e.g. .stage/sglang-0.5.15")
    n.add_argument("--send", default=".stage/p", metavar="DIR", help="the folder that travels (default .stage/p)")
    n.add_argument("--from-start", action="store_true", help="start again at part 1 (a fresh runner)")
    r = sub.add_parser("receive", help="keep the parts in SEND; install once all have arrived (runner)")
    r.add_argument("send", metavar="SEND_DIR", help="the folder that arrived (a manifest and parts)")
    r.add_argument("--keep-only", action="store_true",
                   help="keep the parts, install nothing (a later `install`: not while another engine is measured)")
    i = sub.add_parser("install", help="check the kept parts and install them (receive does this by itself)")
    for q in (r, i):
        q.add_argument("--keep", default="/root/stage-engine", metavar="DIR",
                       help="where parts accumulate between transfers (default /root/stage-engine)")
        q.add_argument("--target", default="/tmp/site", metavar="DIR", help="install folder (default /tmp/site)")
    for q, func in ((b, build), (c, check), (n, next_part), (r, receive)):
        q.set_defaults(func=func)
    i.set_defaults(func=lambda a: install(Path(a.keep), Path(a.target)))
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command; a StageError is one line on stderr and its exit code."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except StageError as e:
        print(f"stage_engine.py {args.command}: error: {e}", file=sys.stderr)
        return e.code


if __name__ == "__main__":
    sys.exit(main())
