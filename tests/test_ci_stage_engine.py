"""ci/stage_engine.py on two tiny wheels made here: build, split, receive out of order, install, import;
a missing part, a corrupt part, a part of another bundle and a bad engine list each fail with one line.
A second build into a folder being built is refused; a failed build leaves the previous stage whole.

Each pip call takes a second or two on a loaded 2-core box: the bundle is built once per module."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "ci" / "stage_engine.py"
_spec = importlib.util.spec_from_file_location("stage_engine", TOOL)
stage = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stage)


def make_wheel(folder: Path, name: str, version: str, files: dict[str, bytes], requires: list[str] = ()) -> Path:
    """A minimal pure-Python wheel (METADATA, WHEEL, RECORD) that pip installs."""
    dist = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    entries = dict(files) | {f"{dist}/METADATA": meta.encode(),
                             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}

    def row(path: str, data: bytes) -> str:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        return f"{path},sha256={digest},{len(data)}\n"

    record = "".join(row(p, d) for p, d in entries.items()) + f"{dist}/RECORD,,\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, d in entries.items():
            z.writestr(p, d)
        z.writestr(f"{dist}/RECORD", record)
    return path


# Random bytes do not compress: the bundle spans several parts of 4 KiB.
PAD = hashlib.sha256(b"0").digest() * 400


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("stage")
    wheels = root / "index"
    wheels.mkdir()
    make_wheel(wheels, "tinya", "1.0", {"tinya/__init__.py": b"__version__ = 'a1'\n", "tinya/pad.bin": PAD},
               requires=["tiny.b", "requests>=2", "pywin32; sys_platform == 'win32'", "skipme"])
    # tiny_b's module lives in a folder that only its .pth file puts on the path (as CuTe DSL's does)
    make_wheel(wheels, "tiny_b", "2.0", {"tiny_b.pth": b"tiny_b_pkgs\n", "tiny_b_pkgs/tiny_b/__init__.py": b"X = 2\n",
                                         "tiny_b_pkgs/tiny_b/big/blob.bin": PAD})
    listing = root / "tiny-1.txt"
    listing.write_text("# two tiny wheels\nimport: tinya\nimport: tiny_b\ntinya==1.0\ntiny-b==2.0 drop=tiny_b_pkgs/tiny_b/big/*\n"
                       "skip: skipme  not imported on the decode path\n")
    out = root / "out"
    assert stage.main(["build", str(listing), "--out", str(out), "--part-size", "4K", "--find-links", str(wheels)]) == 0
    return root, out, json.loads((out / "manifest.json").read_text())


def send(folder: Path, out: Path, names: list[str]) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for n in names + ["manifest.json"]:
        shutil.copy2(out / n, folder)
    return folder


def test_build_splits_into_parts_no_larger_than_asked_with_hashes(built):
    _, out, m = built
    assert m["engine"] == "tiny-1" and len(m["parts"]) >= 3 and m["imports"] == ["tinya", "tiny_b"]
    assert all(p["bytes"] <= 4096 for p in m["parts"]) and sum(p["bytes"] for p in m["parts"]) == m["bundle_bytes"]
    for p in m["parts"]:
        assert hashlib.sha256((out / p["file"]).read_bytes()).hexdigest() == p["sha256"]
    assert sorted(w["file"] for w in m["wheels"]) == ["tiny_b-2.0-py3-none-any.whl", "tinya-1.0-py3-none-any.whl"]
    assert [w["dropped_members"] for w in m["wheels"]] == [0, 1]


def test_keep_only_installs_nothing_until_install_is_asked(built, tmp_path, capsys):
    """Parts that arrive while another engine is being measured are kept; the install waits."""
    _, out, m = built
    names = [p["file"] for p in m["parts"]]
    keep, target = tmp_path / "keep", tmp_path / "site"
    common = ["--keep", str(keep), "--target", str(target)]
    assert stage.main(["receive", str(send(tmp_path / "p", out, names)), "--keep-only"] + common) == 0
    assert "complete; install later with" in capsys.readouterr().out and not target.exists()
    assert stage.main(["install"] + common) == 0 and (target / "tinya" / "pad.bin").exists()


def test_parts_received_out_of_order_install_and_import(built, tmp_path, capsys):
    _, out, m = built
    names = [p["file"] for p in m["parts"]]
    keep, target = tmp_path / "keep", tmp_path / "site"
    common = ["--keep", str(keep), "--target", str(target)]
    assert stage.main(["receive", str(send(tmp_path / "p", out, [names[-1]]))] + common) == 0
    assert f"1 of {len(names)} parts" in capsys.readouterr().out
    assert stage.main(["receive", str(send(tmp_path / "p", out, names[:-1][::-1]))] + common) == 0
    said = capsys.readouterr().out
    assert "2 wheels installed" in said and "import tinya: ok a1" in said and "import tiny_b: ok" in said
    assert (target / "tinya" / "pad.bin").exists()
    assert not (target / "tiny_b_pkgs" / "tiny_b" / "big").exists()  # the dropped member never travelled
    record = next(target.glob("tiny_b-2.0.dist-info")).joinpath("RECORD").read_text()
    assert "big/blob.bin" not in record
    assert f"ready: export PYTHONPATH={target}:{target / 'tiny_b_pkgs'}" in said
    code = "import tinya, tiny_b; print(tinya.__version__, tiny_b.X)"
    run = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": f"{target}:{target / 'tiny_b_pkgs'}"},
                         capture_output=True, text=True)
    assert run.stdout.split() == ["a1", "2"]


def test_a_missing_part_is_named(built, tmp_path, capsys):
    _, out, m = built
    names = [p["file"] for p in m["parts"]]
    keep = tmp_path / "keep"
    assert stage.main(["receive", str(send(tmp_path / "p", out, names[:1] + names[2:])), "--keep", str(keep),
                       "--target", str(tmp_path / "site")]) == 0
    assert f"still to come: {names[1]}" in capsys.readouterr().out and not (tmp_path / "site").exists()
    assert stage.main(["install", "--keep", str(keep), "--target", str(tmp_path / "site")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"stage_engine.py install: error: {keep}: the bundle is incomplete: missing {names[1]} "
                   f"(1 of {len(names)} parts)")


def test_a_corrupt_part_is_named_and_not_kept(built, tmp_path, capsys):
    _, out, m = built
    bad = m["parts"][1]["file"]
    p = send(tmp_path / "p", out, [bad])
    data = bytearray((p / bad).read_bytes())
    data[100] ^= 1
    (p / bad).write_bytes(bytes(data))
    assert stage.main(["receive", str(p), "--keep", str(tmp_path / "keep")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"stage_engine.py receive: error: {p / bad}: sha256 ") and "corrupt" in err
    assert "\n" not in err and not (tmp_path / "keep" / bad).exists()


def test_a_part_kept_then_corrupted_fails_the_install_naming_it(built, tmp_path, capsys):
    _, out, m = built
    keep = tmp_path / "keep"
    names = [p["file"] for p in m["parts"]]
    assert stage.main(["receive", str(send(tmp_path / "p", out, names[:-1])), "--keep", str(keep)]) == 0
    (keep / names[0]).write_bytes(b"x" + (keep / names[0]).read_bytes()[1:])
    assert stage.main(["receive", str(send(tmp_path / "p", out, names[-1:])), "--keep", str(keep),
                       "--target", str(tmp_path / "site")]) == 1
    assert f"{keep / names[0]}: sha256" in capsys.readouterr().err


def test_a_part_of_another_bundle_is_refused(built, tmp_path, capsys):
    _, out, m = built
    keep = tmp_path / "keep"
    assert stage.main(["receive", str(send(tmp_path / "p", out, [m["parts"][0]["file"]])), "--keep", str(keep)]) == 0
    other = send(tmp_path / "q", out, [m["parts"][1]["file"]])
    doc = json.loads((other / "manifest.json").read_text())
    doc["bundle_sha256"] = "f" * 64
    (other / "manifest.json").write_text(json.dumps(doc))
    assert stage.main(["receive", str(other), "--keep", str(keep)]) == 2
    assert "a part of another bundle" in capsys.readouterr().err


def test_next_hands_out_one_part_at_a_time(built, tmp_path, capsys):
    _, out, m = built
    stage_dir = tmp_path / "stage"
    shutil.copytree(out, stage_dir)
    sendto = tmp_path / "p"
    for i in range(2):
        assert stage.main(["next", str(stage_dir), "--send", str(sendto)] + (["--from-start"] if i == 0 else [])) == 0
        assert sorted(x.name for x in sendto.iterdir()) == sorted([m["parts"][i]["file"], "manifest.json"])
    assert f"part 2 of {len(m['parts'])}" in capsys.readouterr().out


@pytest.mark.parametrize("line, needle", [
    ("sglang>=0.5\n", ":1: expected 'name==version"),
    ("sglang==0.5.15 exclude=x\n", ":1: expected 'name==version"),
    ("# nothing\n", "names no wheel"),
])
def test_a_bad_engine_list_is_one_line_naming_file_and_line(tmp_path, capsys, line, needle):
    lst = tmp_path / "e.txt"
    lst.write_text(line)
    assert stage.main(["build", str(lst), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and str(lst) in err and "\n" not in err


def test_bad_part_size_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        stage.main(["build", "x.txt", "--part-size", "lots"])
    assert e.value.code == 2 and "is not a size such as 60M" in capsys.readouterr().err
    assert stage.parse_size("60M") == 60 << 20 and stage.parse_size("4K") == 4096


def test_check_names_a_dependency_neither_carried_in_the_image_nor_skipped(built, tmp_path, capsys):
    root, _, _ = built
    image = tmp_path / "image.txt"
    image.write_text("requests\n")
    lst = root / "tiny-1.txt"
    args = ["check", str(lst), "--image", str(image), "--find-links", str(root / "index")]
    assert stage.main(args) == 0  # tiny.b is carried (as tiny-b), requests is there, skipme skipped, pywin32 not linux
    noskip = tmp_path / "tiny-2.txt"
    noskip.write_text(lst.read_text().replace("skip: skipme", "# skip: skipme"))
    assert stage.main(["check", str(noskip), "--image", str(image), "--find-links", str(root / "index")]) == 1
    out = capsys.readouterr().out
    assert "missing: skipme (tinya needs skipme)" in out and "pywin32" not in out and "requests" not in out.split("missing")[-1]


def test_parts_joined_in_the_wrong_order_fail_the_whole_bundle_hash(built, tmp_path, capsys):
    _, out, m = built
    p = send(tmp_path / "p", out, [x["file"] for x in m["parts"]])
    doc = json.loads((p / "manifest.json").read_text())
    doc["parts"][0], doc["parts"][1] = doc["parts"][1], doc["parts"][0]  # each part still matches its own hash
    (p / "manifest.json").write_text(json.dumps(doc))
    assert stage.main(["receive", str(p), "--keep", str(tmp_path / "keep"), "--target", str(tmp_path / "site")]) == 1
    assert "the joined parts hash to" in capsys.readouterr().err and not (tmp_path / "site").exists()


def test_check_finds_a_carried_requirement_the_image_version_breaks(built, tmp_path, capsys):
    """The conflict SGLang's first H200 start showed (transformers 5.12.1 refused the image's tokenizers
    0.23.2) is found here: an image line `name==version` outside a carried wheel's requirement fails."""
    root, _, _ = built
    lst = root / "tiny-1.txt"  # tinya needs requests>=2
    image = tmp_path / "image.txt"
    image.write_text("# comment\nrequests==1.9\n")
    args = ["check", str(lst), "--image", str(image), "--find-links", str(root / "index")]
    assert stage.main(args) == 1
    out = capsys.readouterr().out
    assert "conflict: requests 1.9 in the image, but tinya 1.0 needs requests>=2: carry one that fits" in out
    accepted = tmp_path / "tiny-4.txt"  # a conflict a reviewer accepted, with the reason: printed, not failed
    accepted.write_text(lst.read_text() + "accept: requests  only its tests import it\n")
    assert stage.main(["check", str(accepted), "--image", str(image), "--find-links", str(root / "index")]) == 0
    assert "accepted: requests 1.9 in the image, tinya 1.0 needs requests>=2 (only its tests import it)" in (
        capsys.readouterr().out)
    image.write_text("requests==2.31.0\n")
    assert stage.main(args) == 0
    image.write_text("requests\n")  # no version known: present, not checked (and said so)
    assert stage.main(args) == 0 and "1 image packages without a version: not checked" in capsys.readouterr().out


def test_check_finds_a_carried_pin_another_carried_wheel_refuses(built, tmp_path, capsys):
    root, _, _ = built
    wheels = tmp_path / "index"
    shutil.copytree(root / "index", wheels)
    make_wheel(wheels, "tinyc", "1.0", {"tinyc/__init__.py": b""}, requires=["tiny-b<2"])
    lst = tmp_path / "tiny-3.txt"
    lst.write_text("tinyc==1.0\ntiny-b==2.0\n")
    image = tmp_path / "image.txt"
    image.write_text("")
    assert stage.main(["check", str(lst), "--image", str(image), "--find-links", str(wheels)]) == 1
    assert "conflict: tiny-b 2.0 carried, but tinyc 1.0 needs tiny-b<2: pin one that fits" in capsys.readouterr().out


def test_a_malformed_image_line_names_the_file_and_line(built, tmp_path, capsys):
    root, _, _ = built
    image = tmp_path / "image.txt"
    image.write_text("requests\nnumpy==\n")
    assert stage.main(["check", str(root / "tiny-1.txt"), "--image", str(image)]) == 2
    assert f"{image}:2: expected 'name' or 'name==version', got 'numpy=='" in capsys.readouterr().err


def _listing(root: Path) -> Path:
    return root / "tiny-1.txt"


def test_a_second_build_into_the_same_folder_is_refused_naming_the_lock_and_the_stage_is_kept(built, tmp_path,
                                                                                               capsys):
    """Two builds into one folder deleted each other's wheels halfway; the second now fails in one line."""
    import fcntl

    root, out, m = built
    kept = tmp_path / "stage"
    shutil.copytree(out, kept)
    with open(tmp_path / ".stage.lock", "w") as held:
        held.write("4242\n")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX)
        code = stage.main(["build", str(_listing(root)), "--out", str(kept), "--part-size", "4K",
                           "--find-links", str(root / "index")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert f"another build into {kept} is running (pid 4242, lock {tmp_path / '.stage.lock'})" in err
    assert json.loads((kept / "manifest.json").read_text()) == m and all((kept / p["file"]).exists() for p in m["parts"])


def test_a_build_that_fails_leaves_the_previous_stage_whole(built, tmp_path, capsys):
    root, out, m = built
    kept = tmp_path / "stage"
    shutil.copytree(out, kept)
    (tmp_path / "empty").mkdir()
    code = stage.main(["build", str(_listing(root)), "--out", str(kept), "--part-size", "4K",
                       "--find-links", str(tmp_path / "empty")])
    assert code == 1 and "pip download failed" in capsys.readouterr().err
    assert json.loads((kept / "manifest.json").read_text()) == m and all((kept / p["file"]).exists() for p in m["parts"])
    assert sorted(q.name for q in tmp_path.iterdir()) == [".stage.lock", "empty", "stage"]  # no half-built folder


def test_a_rebuild_replaces_the_stage_and_leaves_no_old_copy(built, tmp_path):
    root, out, m = built
    kept = tmp_path / "stage"
    shutil.copytree(out, kept)
    (kept / "stray.part999").write_bytes(b"from an earlier list")
    assert stage.main(["build", str(_listing(root)), "--out", str(kept), "--part-size", "8K",
                       "--find-links", str(root / "index")]) == 0
    fresh = json.loads((kept / "manifest.json").read_text())
    assert fresh["wheels"] == m["wheels"] and len(fresh["parts"]) < len(m["parts"])  # 8K parts: fewer of them
    assert not (kept / "stray.part999").exists() and not any(q.name.startswith(".stage.") and q.name != ".stage.lock"
                                                             for q in tmp_path.iterdir())
