"""ci/planted's narrow-loads plant (issue 34, "Counters beside time"): MOEBENCH_PLANT_NARROW_LOADS makes the int4
Triton MoE kernel (triton_moe/w4_mma_kernel.py) read each lane's two weight words with two 32-bit loads
instead of one 64-bit load, through ci/planted/sitecustomize.py, so that it reaches every process, the ncu
child (`python -m moebench.gemm.counter_child`) included. Checked on CPU:

- the planted kernel computes exactly what the original does (Triton's interpreter, the plain-Triton path);
- compiled for sm_90a as the H200 runs it (Triton's own compiler and ptxas, no GPU), it issues more load
  instructions for the same loaded bytes, and a count of its SASS predicts the ncu instruction counters: the
  same count of the unplanted kernel gives the H200's measured 3,197,184 (#1, up) and 1,556,128 (#2, down)
  instructions a call exactly, and the planted one gives the numbers in docs/counters.md;
- unset, nothing changes and nothing heavy is imported; set, the plant reaches a fresh Python process and a
  child launched the way moebench launches ncu's; an image's own sitecustomize still runs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from sass_counts import counts as _counts, sass as _sass  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PLANTED = REPO / "ci" / "planted"
SRC = REPO / "src"
ENV = "MOEBENCH_PLANT_NARROW_LOADS"
KERNEL = "moebench.gemm.triton_moe.w4_mma_kernel"
PLANT_LINE = "moebench planted regression: moebench.gemm.triton_moe.w4_mma_kernel._load_ws"

# The H200's counts (docs/counters.md, "The first H200 run", session 16: ncu 2025.3.1, Triton 3.6.0) of
# gemm[kimi-k2.5-tp8-fused-m1-int4-g32-decode-triton], sm__inst_executed.sum a call, and their launches.
H200_INST = {"up": 3_197_184, "down": 1_556_128}
H200_LAUNCH = {"up": ((8, 16), 512), "down": ((1, 224), 128)}
# What the planted kernel will count there (docs/counters.md, "What remains for the device", step 3).
PREDICTED_INST = {"up": 3_283_200, "down": 1_629_600}


def _env(plant: str | None, *paths: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (ENV, "TRITON_INTERPRET")}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (PLANTED, *paths, SRC))
    if plant is not None:
        env[ENV] = plant
    env.update(extra)
    return env


def _python(code: str, env: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


# ---- the plant, the sitecustomize, fresh processes -------------------------------------------------------

PROBE = textwrap.dedent("""
    import json, sys
    heavy = sorted(m for m in ("triton", "torch", "numpy", "moebench", "moebench_planted_narrow") if m in sys.modules)
    finders = [type(f).__name__ for f in sys.meta_path]
    import moebench.gemm.triton_moe.w4_mma as w4_mma  # imports the kernel module, as a gemm case does
    k = sys.modules["moebench.gemm.triton_moe.w4_mma_kernel"]
    print(json.dumps(dict(heavy_at_startup=heavy, finders=finders, sitecustomize=sys.modules["sitecustomize"].__file__,
                          load_ws=k._load_ws.fn.__module__ + "." + k._load_ws.fn.__name__,
                          kernel_module=w4_mma.moebench_w4_mma.fn.__module__)))
""")


@pytest.mark.parametrize("value", [None, "", "0"], ids=["unset", "empty", "zero"])
def test_unset_nothing_changes_and_nothing_heavy_is_imported(value):
    proc = _python(PROBE, _env(value))
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    assert Path(got["sitecustomize"]).resolve() == PLANTED / "sitecustomize.py"  # ours ran, and did nothing:
    assert got["load_ws"] == f"{KERNEL}._load_ws"
    assert "_PlantOnImport" not in got["finders"] and "planted" not in proc.stderr
    # at startup it imported nothing a process without ci/planted would not have (.pth files may import some)
    without = subprocess.run([sys.executable, "-c", PROBE.split("finders =")[0] + "print(json.dumps(heavy))"],
                             env={**_env(value), "PYTHONPATH": str(SRC)}, capture_output=True, text=True, timeout=120)
    assert got["heavy_at_startup"] == json.loads(without.stdout), without.stderr[-2000:]


def test_the_plant_reaches_a_fresh_python_process_before_the_kernel_compiles():
    proc = _python(PROBE, _env("1"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    # at startup: a finder waiting for the kernel module, and neither triton nor the plant imported
    assert not {"triton", "moebench_planted_narrow"} & set(got["heavy_at_startup"])
    assert got["finders"][0] == "_PlantOnImport"
    # once moebench imported the kernel module, its _load_ws is the narrow one, and the kernel (which finds
    # its callees in its module's globals when it first compiles) is still moebench's own
    assert got["load_ws"] == "moebench_planted_narrow._load_ws_narrow"
    assert got["kernel_module"] == KERNEL
    assert [ln for ln in proc.stderr.splitlines() if "planted" in ln] == [
        f"{PLANT_LINE} reads each lane's two weight words with two 32-bit loads (MOEBENCH_PLANT_NARROW_LOADS)"]


def test_the_plant_reaches_the_child_moebench_starts_under_ncu(compiled, tmp_path, monkeypatch):
    """moebench's own launch (ncu_launch.run_under_ncu, as gemm/counters.py calls it: the child inherits the
    environment) with a stand-in ncu that runs its command: the child, here compile_check compiling the down
    kernel's tiles for sm_90a, prints the plant's line and compiles the narrow loads (no 64-bit weight load).
    (`compiled`: skipped where Triton cannot compile for sm_90.)"""
    from moebench.core.ncu import NcuFormatError
    from moebench.core.ncu_launch import run_under_ncu

    fake = tmp_path / "ncu"
    fake.write_text('#!/bin/sh\nwhile [ "$1" != "--target-processes" ]; do shift; done\nshift 2\nexec "$@"\n')
    fake.chmod(0o755)
    for k, v in _env("1", TRITON_CACHE_DIR=str(tmp_path / "cache")).items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    keep = tmp_path / "kept" / "case.csv"
    with pytest.raises(NcuFormatError):  # the child's stdout is no ncu table
        run_under_ncu(str(fake), ["sm__inst_executed.sum"], "moebench.gemm.triton_moe.compile_check",
                      ["--filter", "w4mma_down"], keep=str(keep), timeout_s=300)
    out, err = keep.read_text(), keep.with_suffix(".err").read_text()
    assert PLANT_LINE in err
    assert re.search(r"w4mma_down .* loads b32x\d+ v4\.b32x\d+$", out.strip()), out  # no ld.global.v2.b32
    assert "planted" not in out  # the child's stdout, where ncu writes its table, gets nothing from the plant


def test_an_images_own_sitecustomize_still_runs(tmp_path):
    """Python imports only the first sitecustomize on sys.path: ours runs the one it shadows."""
    image = tmp_path / "image-site"
    image.mkdir()
    (image / "sitecustomize.py").write_text("import os\nopen(os.environ['MARK'], 'w').write(__name__)\n")
    for value in (None, "1"):
        mark = tmp_path / f"mark-{value}"
        proc = _python("import sys; print(sys.modules['sitecustomize'].__file__)", _env(value, image, MARK=str(mark)))
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert Path(proc.stdout.strip()).resolve() == PLANTED / "sitecustomize.py"
        assert mark.read_text() == "sitecustomize"


# ---- the same result (Triton's interpreter) ------------------------------------------------------------

@triton.jit
def _load_ws_first_word_twice(w_ptr, s_ptr, wrow, srow, grp, mask, G: tl.constexpr, lane):
    """A wrong narrow variant (the first word in both halves): shows the swap reaches the kernel here."""
    m = mask & (grp < G)
    g3 = grp.to(tl.int64)
    word = w_ptr + wrow + g3 * 64 + lane * 2
    w = tl.join(tl.load(word, mask=m, other=0), tl.load(word, mask=m, other=0))
    s = tl.load(s_ptr + srow + g3 * 8 + lane // 4, mask=m, other=0)
    return w, s


def _outputs(M, K, I, topk, up, down, seed=0):
    """fused_moe_w4_mma with the module's _load_ws, the narrow one and the wrong one, and the float32
    reference (in the interpreter worker)."""
    if str(PLANTED) not in sys.path:
        sys.path.insert(0, str(PLANTED))
    import moebench_planted_narrow as narrow

    import moebench.gemm.triton_moe as tm
    from moebench.gemm.triton_moe import w4_mma, w4_mma_kernel
    from moebench.gemm.triton_moe.config import KernelConfig

    g = torch.Generator().manual_seed(seed)
    E = 8
    x = (torch.randn(M, K, generator=g) * 3).bfloat16()
    w1, w2 = torch.randn(E, 2 * I, K, generator=g) / K ** 0.5, torch.randn(E, K, I, generator=g) / I ** 0.5
    ids = torch.stack([torch.randperm(E, generator=g)[:topk] for _ in range(M)]).int()
    tw = torch.softmax(torch.randn(M, topk, generator=g), -1)
    d1, d2, q = tm.quantize_moe(w1, w2, "int4_w4a16", 32)
    t1, t2 = w4_mma.pack_tiles16(d1, q.scales[0]), w4_mma.pack_tiles16(d2, q.scales[1])
    config = (KernelConfig(*up), KernelConfig(*down))
    run = lambda: w4_mma.fused_moe_w4_mma(x, t1, t2, tw, ids, config=config, pdl=False)  # noqa: E731
    original = w4_mma_kernel._load_ws
    outs = {"original": run()}
    try:
        assert narrow.plant(w4_mma_kernel) and not narrow.plant(w4_mma_kernel)  # once
        outs["planted"] = w4_mma_kernel._load_ws is narrow._load_ws_narrow
        outs["narrow"] = run()
        w4_mma_kernel._load_ws = _load_ws_first_word_twice
        outs["wrong"] = run()
    finally:
        w4_mma_kernel._load_ws = original
    outs["reference"] = tm.fused_moe_ref(x, tm.dequantize_weight(d1, q, 0), tm.dequantize_weight(d2, q, 1), tw, ids)
    return outs


@pytest.mark.parametrize("M, K, I, topk, up, down", [
    (1, 256, 32, 4, (16, 64, 2), (32, 32, 2)),   # up: 8 groups, 2 steps (the loop) of 2 lane sets x 2 groups
    (2, 96, 64, 2, (32, 64, 4), (64, 64, 4)),    # 3 groups: the last step's second group is masked
])
def test_the_narrow_loads_compute_exactly_what_the_original_does(interp, M, K, I, topk, up, down):
    outs = interp(_outputs, M, K, I, topk, up, down)
    assert outs["planted"] is True
    assert torch.equal(outs["narrow"], outs["original"])  # bit for bit: the same words reach the same math
    ref = outs["reference"]
    assert ((outs["narrow"].float() - ref).norm() / ref.norm()).item() < 1e-2
    assert not torch.equal(outs["wrong"], outs["original"])  # control: the swapped helper is what ran


# ---- compiled for the H200 (sm_90a, no GPU): loads, bytes, and the instruction count --------------------

COMPILE = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from moebench.gemm.triton_moe import compile_check as cc, w4_mma, w4_mma_kernel as wk

    out = Path(sys.argv[1])
    M, K, I, E, TOPK = 1, 7168, 256, 384, 8  # Kimi-K2.5 TP8 decode, M = 1: the tuned tiles of configs.json
    up, down = w4_mma.mma_config(M, K, I, E, TOPK)
    ptrs = dict(a_ptr="*i32", w_ptr="*i32", s_ptr="*i32", ids_ptr="*i32", tw_ptr="*fp32", out_ptr="*bf16")
    meta = {"load_ws": wk._load_ws.fn.__module__ + "." + wk._load_ws.fn.__name__}
    # as w4_mma.fused_moe_w4_mma launches them on an H200 (PDL on, the inline-PTX path)
    for name, kc, rows, N, Kk, const, opts in (
            ("up", up, M * TOPK, I, K, dict(UP_ROWS=I, SLOTS=1, SLOTS_P=1, A_DIV=TOPK, WEIGHTED=False,
                                             PDL_WAIT=False, PDL_TRIGGER=True), {}),
            ("down", down, M, K, I, dict(UP_ROWS=0, SLOTS=TOPK, SLOTS_P=TOPK, A_DIV=1, WEIGHTED=True,
                                          PDL_WAIT=True, PDL_TRIGGER=False), dict(launch_pdl=True))):
        rt, gpi = kc.block_n // 16, kc.block_k // 32
        c = dict(K=Kk, RT=rt, KS=kc.num_warps // rt, GPI=gpi, USE_ASM=True, **const)
        try:
            k = cc.compile_kernel(cc.Spec(name, wk.moebench_w4_mma, ptrs, c, num_warps=kc.num_warps, num_stages=1,
                                          opts=opts))
        except Exception as e:
            last = str(e).strip().splitlines()[-1][:300] if str(e).strip() else ""
            print(f"{type(e).__name__}: {last}", file=sys.stderr)
            sys.exit(3)
        (out / f"{name}.ptx").write_text(k.asm["ptx"])
        (out / f"{name}.cubin").write_bytes(k.asm["cubin"])
        step = c["KS"] * gpi
        meta[name] = dict(grid=[rows, -(-(N // 16) // rt)], block=32 * kc.num_warps, warps=kc.num_warps,
                          trips=len(range(step, Kk // 32, step)))
    (out / "meta.json").write_text(json.dumps(meta))
""")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The Kimi M = 1 up and down kernels compiled for sm_90a in fresh processes, unplanted and planted (ci/planted
    on PYTHONPATH both times, never TRITON_INTERPRET; a Triton cache of their own): {variant: {meta, ptx, sass}}.
    Skipped when Triton cannot compile the unplanted kernel here; a planted kernel that does not compile fails."""
    try:
        cuobjdump = triton.knobs.nvidia.cuobjdump.path  # Triton's own, beside its ptxas
    except Exception as e:
        pytest.skip(f"no cuobjdump to read sm_90a SASS with: {e}")
    out = {}
    for variant, value in (("original", None), ("planted", "1")):
        d = tmp_path_factory.mktemp(variant)
        proc = _python(COMPILE, _env(value, TRITON_CACHE_DIR=str(d / "cache")), str(d))
        if proc.returncode == 3 and variant == "original":
            pytest.skip(f"Triton cannot compile for sm_90 here: {proc.stderr.strip().splitlines()[-1]}")
        assert proc.returncode == 0, f"{variant}: {proc.stderr[-3000:]}"
        meta = json.loads((d / "meta.json").read_text())
        sass = {}
        for name in ("up", "down"):
            try:
                sass[name] = subprocess.run([cuobjdump, "-sass", str(d / f"{name}.cubin")], capture_output=True,
                                            text=True, check=True).stdout
            except (OSError, subprocess.CalledProcessError) as e:
                pytest.skip(f"no cuobjdump to read the sm_90a SASS ({cuobjdump}): {e}")
        out[variant] = dict(meta=meta, ptx={n: (d / f"{n}.ptx").read_text() for n in ("up", "down")}, sass=sass)
    return out


def _per_call(c: dict, name: str) -> dict:
    meta = c["meta"][name]
    per_warp = _counts(_sass(c["sass"][name]), meta["trips"], meta["warps"])
    warps = meta["grid"][0] * meta["grid"][1] * meta["warps"]
    return {k: v * warps for k, v in per_warp.items()}


def test_the_model_of_the_sass_reproduces_the_h200s_instruction_counts(compiled):
    """The unplanted kernels as the H200 ran them: the launches ncu recorded, and their SASS counted with the
    loop's trip count and one storing warp a program gives sm__inst_executed exactly. (The counts are Triton
    3.6.0's compiler's, the H200 image's and the pin in pyproject.toml.)"""
    c = compiled["original"]
    assert c["meta"]["load_ws"] == f"{KERNEL}._load_ws"
    for name in ("up", "down"):
        assert (tuple(c["meta"][name]["grid"]), c["meta"][name]["block"]) == H200_LAUNCH[name], name
    if triton.__version__ != "3.6.0":
        pytest.skip(f"the H200's counts are Triton 3.6.0's code; this is Triton {triton.__version__}")
    assert {n: _per_call(c, n)["inst"] for n in ("up", "down")} == H200_INST


def test_compiled_for_sm90_the_plant_issues_more_loads_of_the_same_bytes(compiled):
    """PTX: each lane's 64-bit weight load (ld.global.v2.b32) becomes two 32-bit ones; SASS: LDG.E.64 becomes
    two LDG.E, 32 more load instructions a warp in both kernels (up: 2 weight stacks x 4 groups, before the
    loop and in each of its 3 trips; down: 8 slots x 4 groups), the same global bytes a thread."""
    o, p = compiled["original"], compiled["planted"]
    assert p["meta"]["load_ws"] == "moebench_planted_narrow._load_ws_narrow"
    for name in ("up", "down"):
        v2 = len(re.findall(r"ld\.global\.v2\.b32", o["ptx"][name]))
        assert v2 > 0 and not re.search(r"ld\.global\.v2\.b32", p["ptx"][name]), name
        assert "LDG.E.64" in o["sass"][name] and "LDG.E.64" not in p["sass"][name], name
        a, b = _counts(_sass(o["sass"][name]), o["meta"][name]["trips"], 1), \
            _counts(_sass(p["sass"][name]), p["meta"][name]["trips"], 1)
        assert b["loads"] - a["loads"] == 32, name
        assert b["load_bytes"] == a["load_bytes"], name
        assert b["inst"] > a["inst"], name


def test_the_predicted_counter_change_is_past_the_1pct_gate(compiled):
    """What `--counters` will read on the H200 for the planted kernel: docs/counters.md's step 3."""
    if triton.__version__ != "3.6.0":
        pytest.skip(f"the prediction is for Triton 3.6.0's code; this is Triton {triton.__version__}")
    before = {n: _per_call(compiled["original"], n) for n in ("up", "down")}
    after = {n: _per_call(compiled["planted"], n) for n in ("up", "down")}
    assert {n: after[n]["inst"] for n in after} == PREDICTED_INST
    for name in ("up", "down"):
        assert after[name]["inst"] / before[name]["inst"] - 1 > 0.01, name
        assert after[name]["load_bytes"] == before[name]["load_bytes"], name
    total = sum(after[n]["inst"] for n in after) / sum(before[n]["inst"] for n in before) - 1
    assert 0.03 < total < 0.04  # +3.36%: 4,753,312 -> 4,912,800
