"""CPU checks of moebench.gemm.triton_moe: every kernel against a float32 torch reference, run by
Triton's interpreter on tiny shapes (M in {1, 3, 5}, K 64..256, I 32..128, E = 8, top-k 2..4).

Triton builds its own language helpers (tl.zeros, tl.sum, ...) for the interpreter only if
TRITON_INTERPRET=1 is set before triton is first imported, and flipping it in this process would
break GPU Triton kernels of other tests. So the kernel checks run in one spawned worker process
started with the variable set; each test sends a module-level check function there and asserts on
the numbers it returns. Format, routing and config tests run in-process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import moebench.gemm.triton_moe as tm  # noqa: E402  (in-process: formats, routing, configs only)
from moebench.gemm.triton_moe import routing  # noqa: E402

PKG = "moebench.gemm.triton_moe"
SRC = Path(__file__).resolve().parents[1] / "src"


from conftest import _interpreter_on  # noqa: E402


E = 8
BF16_TOL = 1e-2


def rel_err(out, ref):
    out = out.float()
    assert not torch.isnan(out).any(), "NaN in kernel output"
    return ((out - ref).norm() / ref.norm()).item()


def make_routing(M, topk, seed):
    """Distinct experts per token; token 1 (if any) shares an expert with token 0."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:topk] for _ in range(M)])
    if M > 1 and ids[0, 0] not in ids[1]:
        ids[1, -1] = ids[0, 0]
    weights = torch.softmax(torch.randn(M, topk, generator=g), dim=-1)
    return ids.to(torch.int32), weights.float()


def make_moe(M, K, I, topk, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).bfloat16()
    w1 = (torch.randn(E, 2 * I, K, generator=g) / K ** 0.5).bfloat16()
    w2 = (torch.randn(E, K, I, generator=g) / I ** 0.5).bfloat16()
    ids, tw = make_routing(M, topk, seed + 1)
    return x, w1, w2, tw, ids


def gemv_cfg(bn=8, bk=64, bn2=32, bk2=None, I=32):
    return tm.MoEConfig("gemv", tm.KernelConfig(block_n=bn, block_k=bk),
                        tm.KernelConfig(block_n=bn2, block_k=bk2 or max(I, 64)))


def grouped_cfg(bn=16, bk=64, bm=16):
    kc = tm.KernelConfig(block_n=bn, block_k=bk, block_m=bm)
    return tm.MoEConfig("grouped", kc, kc)


# ---------------------------------------------------------------- kernel checks (run in the worker)


def _fused_err(M, K, I, topk, cfg, seed=0, ids=None):
    x, w1, w2, tw, rand_ids = make_moe(M, K, I, topk, seed)
    ids = rand_ids if ids is None else ids
    out = tm.fused_moe(x, w1, w2, tw, ids, config=cfg)
    assert out.shape == (M, K) and out.dtype == torch.bfloat16
    return rel_err(out, tm.fused_moe_ref(x, w1, w2, tw, ids))


def _grouped_gemm_err(op, path, quant_kind=None, group=0):
    M, topk, K, N = 3, 4, 256, 48
    g = torch.Generator().manual_seed(7)
    w = torch.randn(E, N, K, generator=g) / K ** 0.5
    x = torch.randn(M, K, generator=g) if op == "gemm1" else torch.randn(M, topk, K, generator=g)
    x = x.bfloat16()
    ids, _ = make_routing(M, topk, 8)
    kc = tm.KernelConfig(block_n=16, block_k=128, block_m=16)
    cfg = tm.MoEConfig(path, kc, kc)
    if quant_kind is None:
        w = w.bfloat16()
        out, ref = tm.grouped_gemm(x, w, ids, op=op, config=cfg), tm.grouped_gemm_ref(x, w, ids, op)
    else:
        data, scale, gscale = tm.quantize_weight(w, quant_kind, group)
        quant = tm.Quant(quant_kind, group, (scale,), (gscale,) if gscale is not None else ())
        out = tm.grouped_gemm(x, data, ids, op=op, quant=quant, config=cfg)
        ref = tm.grouped_gemm_ref(x, tm.dequantize_weight(data, quant), ids, op,
                                  act_group=group if quant_kind == "fp8_w8a8" else None)
    assert out.shape == (M, topk, N)
    return rel_err(out, ref)


def _quant_fused_err(kind, group, cfg, I, M=3, K=256, topk=2, seed=11):
    x, w1, w2, tw, ids = make_moe(M, K, I, topk, seed)
    d1, d2, quant = tm.quantize_moe(w1, w2, kind, group)
    r1, r2 = tm.dequantize_weight(d1, quant, 0), tm.dequantize_weight(d2, quant, 1)
    out = tm.fused_moe(x, d1, d2, tw, ids, quant=quant, config=cfg)
    act_group = group if kind == "fp8_w8a8" else None
    return rel_err(out, tm.fused_moe_ref(x, r1, r2, tw, ids, act_group=act_group))


# ---------------------------------------------------------------- bf16


@pytest.mark.parametrize("M,topk", [(1, 2), (3, 4), (5, 2)])
@pytest.mark.parametrize("path", ["gemv", "grouped"])
def test_fused_bf16(interp, M, topk, path):
    cfg = gemv_cfg(bk=64, bk2=32) if path == "gemv" else grouped_cfg(bk=32)
    assert interp(_fused_err, M, 128, 32, topk, cfg) < BF16_TOL


@pytest.mark.parametrize("cfg", [None, gemv_cfg(bk=64, bk2=32), grouped_cfg(bk=64)], ids=["default", "gemv", "grouped"])
def test_fused_bf16_k_tail(interp, cfg):
    """K = 160 is not a multiple of BLOCK_K (masked tail chunk); None: config_for's choice."""
    assert interp(_fused_err, 3, 160, 32, 2, cfg, 3) < BF16_TOL


@pytest.mark.parametrize("cfg", [gemv_cfg(bk=64, bk2=32), grouped_cfg(bk=32, bm=16)], ids=["gemv", "grouped"])
def test_fused_same_expert_many_rows(interp, cfg):
    """Every token routed to experts 2 and 5: rows of one expert share weight tiles / blocks."""
    ids = torch.tensor([[2, 5]] * 5, dtype=torch.int32)
    assert interp(_fused_err, 5, 64, 32, 2, cfg, 4, ids) < BF16_TOL


@pytest.mark.parametrize("op", ["gemm1", "gemm2"])
@pytest.mark.parametrize("path", ["gemv", "grouped"])
def test_grouped_gemm_bf16(interp, op, path):
    assert interp(_grouped_gemm_err, op, path) < BF16_TOL


# ---------------------------------------------------------------- quantized
# Compared with the dequantized-weight float32 reference; fp8_w8a8's reference also rounds the
# activations to fp8 as the kernels do, so what is left is summation order and the odd activation
# that rounds the other way.


@pytest.mark.parametrize("group", [32, 128])
@pytest.mark.parametrize("path", ["gemv", "grouped"])
def test_fused_int4(interp, group, path):
    I = 128 if group == 128 else 64
    cfg = gemv_cfg(bk=128, bk2=I) if path == "gemv" else grouped_cfg(bk=group)
    assert interp(_quant_fused_err, "int4_w4a16", group, cfg, I) < BF16_TOL


@pytest.mark.parametrize("group", [0, 128])
@pytest.mark.parametrize("path", ["gemv", "grouped"])
def test_fused_fp8(interp, group, path):
    cfg = gemv_cfg(bk=128, bk2=128) if path == "gemv" else grouped_cfg(bk=128)
    assert interp(_quant_fused_err, "fp8_w8a8", group, cfg, 128) < 2e-2


@pytest.mark.parametrize("path", ["gemv", "grouped"])
def test_fused_nvfp4(interp, path):
    cfg = gemv_cfg(bk=64, bk2=64) if path == "gemv" else grouped_cfg(bk=32)
    assert interp(_quant_fused_err, "nvfp4_w4a16", 16, cfg, 64) < BF16_TOL


@pytest.mark.parametrize("kind,group", [("int4_w4a16", 32), ("fp8_w8a8", 0), ("fp8_w8a8", 128),
                                        ("nvfp4_w4a16", 16)])
@pytest.mark.parametrize("op", ["gemm1", "gemm2"])
@pytest.mark.parametrize("path", ["gemv", "grouped"])
def test_grouped_gemm_quantized(interp, kind, group, op, path):
    tol = 2e-2 if kind == "fp8_w8a8" else BF16_TOL
    assert interp(_grouped_gemm_err, op, path, kind, group) < tol


# ---------------------------------------------------------------- formats and helpers


def test_pack_roundtrip_and_layout():
    codes = torch.randint(0, 16, (2, 3, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    packed = tm.pack_nibbles(codes)
    assert packed.shape == (2, 3, 4)
    assert (packed[..., 0] & 15).equal(codes[..., 0]) and (packed[..., 0] >> 4).equal(codes[..., 1])
    assert tm.unpack_nibbles(packed).equal(codes)


@pytest.mark.parametrize("kind,group,tol", [("int4_w4a16", 32, 0.1), ("int4_w4a16", 128, 0.12),
                                            ("fp8_w8a8", 0, 0.05), ("fp8_w8a8", 128, 0.05),
                                            ("nvfp4_w4a16", 16, 0.15)])
def test_quantize_roundtrip(kind, group, tol):
    w = torch.randn(2, 130 if kind == "fp8_w8a8" else 32, 256, generator=torch.Generator().manual_seed(1))
    data, scale, gscale = tm.quantize_weight(w, kind, group)
    quant = tm.Quant(kind, group, (scale,), (gscale,) if gscale is not None else ())
    assert rel_err(tm.dequantize_weight(data, quant), w) < tol


def test_int4_values_are_exact():
    """Weights already on the int4 grid survive quantize -> dequantize unchanged."""
    g = torch.Generator().manual_seed(2)
    q = torch.randint(-7, 8, (2, 4, 64), generator=g).float()
    q[..., ::32] = 7.0  # every group's max is 7, so scale = 1 / 4 exactly
    data, scale = tm.quantize_weight(q / 4, "int4_w4a16", 32)[:2]
    assert tm.dequantize_weight(data, tm.Quant("int4_w4a16", 32, (scale,))).equal(q / 4)


def test_quant_validation():
    with pytest.raises(ValueError):
        tm.Quant("int4_w4a16", 64, (None,))
    with pytest.raises(ValueError):
        tm.Quant("int3", 32, (None,))


def test_align_by_expert():
    ids = torch.tensor([[3, 1], [3, 0], [1, 3], [5, 6]], dtype=torch.int32)
    P, bm = ids.numel(), 4
    sorted_pairs, block_expert = routing.align_by_expert(ids, E, bm)
    assert sorted_pairs.numel() == routing.max_blocks(P, E, bm) * bm
    flat = ids.reshape(-1)
    seen = []
    for b, e in enumerate(block_expert.tolist()):
        rows = sorted_pairs[b * bm:(b + 1) * bm]
        real = rows[rows < P]
        if e < 0:
            assert real.numel() == 0
            continue
        assert (flat[real.long()] == e).all()
        seen += real.tolist()
    assert sorted(seen) == list(range(P))
    # expert 3 has 3 pairs in one padded block, in pair order
    b3 = block_expert.tolist().index(3)
    assert sorted_pairs[b3 * bm:(b3 + 1) * bm].tolist() == [0, 2, 5, P]


def test_config_for_real_shapes():
    quants = [None, tm.Quant("int4_w4a16", 32, (None, None)), tm.Quant("fp8_w8a8", 128, (None, None))]
    for quant in quants:
        for M in (1, 2, 4, 8, 16, 64, 512):
            for K, E_ in ((7168, 384), (7168, 256), (6144, 256)):
                cfg = tm.config_for(M, K, 256, E_, 8, quant)
                assert cfg.path == ("gemv" if M <= 16 else "grouped")
                record = json.loads(json.dumps(cfg.as_dict()))
                assert tm.MoEConfig.from_dict(record).up == cfg.up
                group = 128 if quant is not None and quant.kind == "fp8_w8a8" else (quant.group_size if quant else 1)
                for kc in (cfg.up, cfg.down):
                    assert kc.block_k % group == 0
    assert not tm.config_for(1, 7168, 256, 384, 8, None).pdl
    assert tm.config_for(1, 7168, 256, 384, 8, None, pdl=True).pdl


def test_dtype_vocabulary_is_the_gemm_familys():
    """Every quantized gemm dtype has exactly one kernel format, and back: the translation table and
    the family's DTYPES cannot drift apart."""
    from moebench.gemm.cases import DTYPES
    from moebench.gemm.triton_moe.quant import DTYPE_FORMATS

    assert set(DTYPE_FORMATS) == set(DTYPES) - {"bf16"}
    for dtype in DTYPES[1:]:
        assert tm.Quant.for_dtype(dtype, (None,), (None,)).dtype == dtype
    with pytest.raises(ValueError, match="int4_w4a16-g32"):
        tm.Quant.for_dtype("int4_w4a16-g32", (None,))


def test_config_table_keys_use_the_gemm_dtypes_and_known_entries_are_found():
    """configs.json is keyed by the family's dtype names (bf16, int4-g32, ...), and config_for finds the
    measured entries: the int4 Kimi-K2.5 M = 1 winner of the H200 sweeps (keyed int4_w4a16-g32 before)."""
    from moebench.gemm.cases import DTYPES
    from moebench.gemm.triton_moe.config import table_key

    table = json.loads((SRC / PKG.replace(".", "/") / "configs.json").read_text())
    keys = [k for k in table if k.split("|")[0] in ("fused", "gemm1", "gemm2")]  # config_for's (w4.py has its own)
    assert keys and all(k.split("|")[5] in DTYPES for k in keys), keys
    quant = tm.Quant.for_dtype("int4-g32", (None, None))
    key = table_key("fused", 1, 7168, 256, 384, 8, "int4-g32")
    cfg = tm.config_for(1, 7168, 256, 384, 8, quant, pdl=True)
    assert cfg.source == "table" and cfg == tm.MoEConfig.from_dict({**table[key], "source": "table"})
    assert tm.config_for(1, 7168, 256, 384, 8, None).source == "table"


def test_one_nibble_packing_for_every_4bit_layout():
    """The Triton kernels' int4 bytes are vLLM's uint4b8 bytes, packed by the one shared implementation."""
    from moebench.gemm import quant as gq

    assert tm.pack_nibbles is gq.pack_nibbles and tm.unpack_nibbles is gq.unpack_nibbles
    w = torch.randn(2, 4, 64, generator=torch.Generator().manual_seed(3))
    data, scale, _ = tm.quantize_weight(w, "int4_w4a16", 32)
    canonical = gq.quantize(w, "int4-g32")
    assert data.equal(gq.pack_int4_uint4b8(canonical.q)) and scale.equal(canonical.scale)
    assert (data[..., 0] & 15).equal((canonical.q[..., 0] + 8).to(torch.uint8))  # even k: low nibble
    assert gq.unpack_int4_uint4b8(data).equal(canonical.q)


@pytest.mark.parametrize("name", ["gemv_up_bf16", "gemv_down_bf16", "gemv_up_int4g32", "w4_up", "w4_down",
                                  "w4mma_up", "w4mma_down", "w4mma9_up", "w4mma9_up_m1",
                                  "w4mma9_down", "w4experts_up", "w4experts_down", "w4fused",
                                  "w4fused_late_b", "w4fused_dks2", "w4fused_dks4"])
def test_compiles_for_sm90(name):
    """The decode kernels compile for the H200 (sm_90a, Triton's bundled ptxas, no GPU needed)
    without spills, with 16-byte weight or activation loads, and bf16 without any shared-memory
    layout conversion in the K loop (see compile_check.py)."""
    from moebench.gemm.triton_moe import compile_check

    if _interpreter_on():
        pytest.skip("this process builds kernels for the interpreter")
    spec = next(s for s in compile_check.specs() if s.name == name)
    try:
        r = compile_check.compile_spec(spec)
    except FileNotFoundError as exc:
        pytest.skip(f"no ptxas: {exc}")
    assert r["spill"] <= spec.max_spill  # 0 but for the one-launch int4 kernel's measured 32-60 B
    assert r["loads"].get("ld.global.v4.b32", 0) > 0
    if "bf16" in name:  # (w4_down's loop is over row tiles: its one conversion is the per-tile epilogue's)
        assert r["loop_smem"] == 0


def _loop_per_mma(name: str) -> tuple[float, int]:
    """(warp instructions of the K loop's body per mma, instructions in all) of a compile_check kernel's sm_90a
    SASS; the loop is the code between the back edge and its target."""
    import re

    import triton

    from moebench.gemm.triton_moe import compile_check
    from sass_counts import sass

    spec = next(s for s in compile_check.specs() if s.name == name)
    kernel = compile_check.compile_kernel(spec)
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"moebench-{os.getpid()}-{name}.cubin"
    path.write_bytes(kernel.asm["cubin"])
    try:
        text = subprocess.run([triton.knobs.nvidia.cuobjdump.path, "-sass", str(path)], capture_output=True,
                              text=True, check=True).stdout
    finally:
        path.unlink()
    ins = sass(text)
    back = [i for i, (_, t) in enumerate(ins) if re.search(r"\bBRA\b", t)]
    if not back:
        return float("nan"), len(ins)
    start = next(i for i, (a, _) in enumerate(ins) if a == int(ins[back[0]][1].split()[-1], 16))
    body = [t for _, t in ins[start:back[0] + 1]]
    return len(body) / sum("HMMA" in t for t in body), len(ins)


def test_lean_kernels_issue_fewer_instructions_for_the_same_mma():
    """Version 9's reason to exist (docs/triton-moe-notes.md): its K loop spends fewer instructions per mma than
    the default kernel's at the same work (unmasked loads, pointers moved by immediates, no register copies
    between the double buffers), and its down kernel fewer in all. Measured here: up 20.2 -> 15.8 per mma at
    M = 4-16 tiles, 20.4 -> 16.8 at M = 1, down 1,739 -> 1,424 instructions."""
    if _interpreter_on():
        pytest.skip("this process builds kernels for the interpreter")
    try:
        default, _ = _loop_per_mma("w4mma_up")
    except (FileNotFoundError, AttributeError) as exc:
        pytest.skip(f"no ptxas or cuobjdump: {exc}")
    lean, _ = _loop_per_mma("w4mma9_up")
    lean_m1, _ = _loop_per_mma("w4mma9_up_m1")
    assert lean <= 0.85 * default and lean_m1 <= 0.9 * default, (default, lean, lean_m1)
    _, down = _loop_per_mma("w4mma_down")
    _, down_lean = _loop_per_mma("w4mma9_down")
    assert down_lean <= 0.85 * down, (down, down_lean)


def test_sweep_smoke(tmp_path):
    """The H200 sweep runs end to end on CPU (interpreter, tiny shapes) through the gemm family's cases,
    check and timing, and writes its JSON."""
    out = tmp_path / "sweep.json"
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(SRC))
    proc = subprocess.run([sys.executable, "-m", f"{PKG}.sweep", "--smoke", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["cases"] and all(c["results"] for c in data["cases"])
    assert any(r["status"] == "ok" for c in data["cases"] for r in c["results"])
    # The cases are the gemm family's (the tiny preset at tp 32), the floor is their Workload's bytes at
    # the read ceiling measured in the run (not a constant), and the table is keyed in the family's dtypes.
    from moebench.gemm.cases import GemmCase
    from moebench.gemm.workload import Workload

    ceiling = data["read_ceiling_bytes_per_s"]
    assert 1e8 < ceiling < 1e12  # measured on this CPU, not an H200 constant
    for c in data["cases"]:
        shape = GemmCase(c["model"], c["tp"], "fused", c["M"], c["dtype"], "decode", "-")
        assert c["case"] == f"gemm[{shape.shape_id}-triton]"
        assert c["floor_us"] == pytest.approx(Workload(shape, "cpu", 1).bytes_per_call() / ceiling * 1e6)
    assert sorted(data["table"]) == ["fused|1024|32|32|4|bf16|1", "fused|1024|32|32|4|int4-g32|1"]


def test_sweep_bench_is_the_suites_case_backend_and_floor():
    """The sweep's Bench is the gemm family's case on its Workload, built by the `triton` backend (the
    calls the suite times, with the candidate config forced) and held to the floor at the given ceiling."""
    from moebench.gemm.backends.triton_backend import build
    from moebench.gemm.cases import GemmCase
    from moebench.gemm.triton_moe.sweep import SMOKE_RULE, Bench, cases

    case = cases(smoke=True)[0]
    bench = Bench(case, "cpu", 2, ceiling=1e10, rule=SMOKE_RULE)
    assert (bench.wl.K, bench.wl.I, bench.wl.E, bench.wl.topk) == (1024, 32, 32, 4)  # presets.py's tiny, tp 32
    assert bench.floor_us == pytest.approx(bench.wl.bytes_per_call() / 1e10 * 1e6)
    assert bench.default.as_dict() == build(case, bench.wl).info["config"]
    cfg = tm.MoEConfig("gemv", tm.KernelConfig(block_n=32, block_k=1024), tm.KernelConfig(block_n=128, block_k=32))
    built = bench.built(cfg)
    assert len(built.calls) == 2 and built.info["config"] == cfg.as_dict()
    assert case == GemmCase("tiny", 32, "fused", 1, "bf16", "decode", "triton")
    # int4-g32 decode: the suite runs the tensor-core int4 kernel, a forced MoEConfig the gemv / grouped path
    int4 = Bench(cases(smoke=True)[1], "cpu", 1, ceiling=1e10, rule=SMOKE_RULE)
    assert int4.case.dtype == "int4-g32" and int4.built().info["impl"] == "moebench.gemm.triton_moe.w4_mma"
    assert int4.built(cfg).info == {"impl": "moebench.gemm.triton_moe", "op": "fused", "config": cfg.as_dict()}


def test_profile_smoke():
    """The profiling entry point checks and times one case end to end on CPU (interpreter), and
    rejects a configuration that is not a MoEConfig with a one-line error."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(SRC))
    run = lambda *a: subprocess.run([sys.executable, "-m", f"{PKG}.profile", "--smoke", *a], env=env,  # noqa: E731
                                    capture_output=True, text=True, timeout=300)
    ok = run()
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
    assert "checked (rel err" in ok.stdout and "us per call" in ok.stdout and "GB/s read ceiling" in ok.stdout
    assert "gemm[tiny-tp32-fused-m1-bf16-decode-triton]: config" in ok.stdout
    bad = run("--config", '{"path": "gemv"}')
    assert bad.returncode == 2 and "--config is not a MoEConfig" in bad.stderr


def test_apply_sweep_merge_records_only_changes():
    """A sweep's winners overwrite the table's entries; the `_sweeps` history gains a record only when
    something changed (re-applying the same sweep is a no-op)."""
    from moebench.gemm.triton_moe import apply_sweep

    cfg = tm.config_for(1, 7168, 256, 384, 8, None).as_dict()
    sweep = {"device": "NVIDIA H200", "table": {"fused|7168|256|384|8|bf16|1": {**cfg, "source": "table"}}}
    once, changed = apply_sweep.merge({"_sweeps": []}, sweep)
    assert changed == 1 and len(once["_sweeps"]) == 1 and once["_sweeps"][0]["device"] == "NVIDIA H200"
    twice, changed = apply_sweep.merge(once, sweep)
    assert changed == 0 and twice["_sweeps"] == once["_sweeps"]
