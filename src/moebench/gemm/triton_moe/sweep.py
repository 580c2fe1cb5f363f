"""Config sweep for the fused MoE on an H200: correctness first, then CUDA-graph timing against the
HBM floor.

    python -m moebench.gemm.triton_moe.sweep --out results.json          # GPU, ~2-3 minutes
    python -m moebench.gemm.triton_moe.sweep --smoke --out smoke.json    # CPU interpreter, tiny shapes

Per case (model x dtype x M) it builds R random routings and inputs, checks every candidate config
against the float32 reference on routing 0 (wrong or failing configs are recorded and skipped), then
times the R calls captured in one CUDA graph (weights are not L2-resident from one call to the next
because each call routes to different experts): per-call time = graph time / R, median over replays.
Candidates are searched coordinate-wise: up-kernel tiles, then down-kernel tiles with the best up,
then PDL on/off, plus the grouped (tl.dot) path for M >= 8. The JSON holds every result and a
"table" of winners in configs.json's format.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, replace

HBM_BYTES_PER_S = 4.3e12  # H200, measured by a device copy
MODELS = {
    "kimi-k2.5": dict(K=7168, I=256, E=384, topk=8),
    "deepseek-v3": dict(K=7168, I=256, E=256, topk=8),
}
SMOKE_MODEL = {"tiny": dict(K=128, I=32, E=8, topk=2)}
# The vLLM 0.21 fused_experts times for Kimi-K2.5 bf16 (us), printed for reference only.
VLLM_KIMI_BF16_US = {1: 43.9, 4: 102.0, 16: 339.0}


@dataclass
class Case:
    model: str
    dtype: str  # "bf16" or "int4_w4a16-g32"
    M: int
    K: int
    I: int
    E: int
    topk: int


def cases(smoke: bool) -> list[Case]:
    models = SMOKE_MODEL if smoke else MODELS
    plan = {"bf16": (3,) if smoke else (1, 2, 4, 8, 16), "int4_w4a16-g32": (1,) if smoke else (1, 4, 16)}
    return [Case(name, dtype, M, **shape) for name, shape in models.items() for dtype, ms in plan.items() for M in ms]


def candidates(case: Case, tm, quant, smoke: bool, pdl: bool):
    """The heuristic default and the tile grids of the search: up (block_n, block_k, warps), down
    (block_n, warps) and grouped (block_m, block_n, block_k, stages)."""
    base = tm.config_for(case.M, case.K, case.I, case.E, case.topk, quant, pdl=pdl)
    if smoke:
        ups = [(8, 128, 4)]
        downs = [(16, 4)]
        grouped = [(16, 32, 64, 1)]
    else:
        bks = (512, 1024, 2048) if quant is None else (1024, 2048)
        warps = (4, 8, 16) if quant is None else (4, 8)
        # more than ~32 weight values per thread per chunk costs occupancy (150-250 registers)
        ups = [(bn, bk, w) for bn in (2, 4, 8, 16) for bk in bks for w in warps if bn * bk <= 1024 * w]
        downs = [(2, 4), (4, 4), (8, 4), (2, 8), (4, 8), (8, 8), (16, 8)]
        grouped = [(16, bn, bk, st) for bn in (64, 128) for bk in (64, 128) for st in (3, 4)]
    return base, ups, downs, grouped


class Weights:
    """One model's expert weights in one dtype, built on the device once and shared by its M cases."""

    def __init__(self, case: Case, tm, torch, device):
        g = torch.Generator(device=device).manual_seed(1234)
        K, I, E = case.K, case.I, case.E
        w1 = (torch.randn(E, 2 * I, K, generator=g, device=device) / K ** 0.5).to(torch.bfloat16)
        w2 = (torch.randn(E, K, I, generator=g, device=device) / I ** 0.5).to(torch.bfloat16)
        if case.dtype == "bf16":
            self.w1, self.w2, self.quant = w1, w2, None
            self.ref_w1, self.ref_w2 = w1, w2
        else:
            kind, group = case.dtype.split("-g")
            d1, d2, q = tm.quantize_moe(w1, w2, kind, int(group))
            del w1, w2
            # Kimi-K2.5's checkpoints carry bf16 scales: time (and check) with those bytes
            self.quant = tm.Quant(q.kind, q.group_size, tuple(s.bfloat16() for s in q.scales))
            self.w1, self.w2 = d1, d2
            self.ref_w1, self.ref_w2 = tm.dequantize_weight(d1, self.quant, 0), tm.dequantize_weight(d2, self.quant, 1)


class Runner:
    """Inputs, reference and timing for one case."""

    def __init__(self, case: Case, weights: Weights, tm, torch, device, rotations: int, replays: int):
        self.case, self.tm, self.torch, self.device = case, tm, torch, device
        self.replays = replays
        self.w1, self.w2, self.quant = weights.w1, weights.w2, weights.quant
        g = torch.Generator(device=device).manual_seed(1000 + case.M)
        self.inputs = []
        for _ in range(rotations):
            ids = torch.rand(case.M, case.E, generator=g, device=device).topk(case.topk, dim=1).indices.to(torch.int32)
            tw = torch.softmax(torch.randn(case.M, case.topk, generator=g, device=device), dim=1)
            x = torch.randn(case.M, case.K, generator=g, device=device).to(torch.bfloat16)
            self.inputs.append((x, tw, ids))
        x, tw, ids = self.inputs[0]
        self.ref = tm.fused_moe_ref(x, weights.ref_w1, weights.ref_w2, tw, ids)
        self.floor_us = statistics.mean(self.floor_bytes(ids) for _, _, ids in self.inputs) / HBM_BYTES_PER_S * 1e6

    def weight_bytes_per_expert(self) -> int:
        total = 0
        for w, s in ((self.w1, 0), (self.w2, 1)):
            total += w[0].numel() * w.element_size()
            if self.quant is not None:
                scale = self.quant.scales[s]
                total += scale[0].numel() * scale.element_size()
        return total

    def floor_bytes(self, ids) -> float:
        """Weights of the distinct experts routed to, plus x read and out written once."""
        distinct = len(set(ids.reshape(-1).tolist()))
        return distinct * self.weight_bytes_per_expert() + 2 * self.case.M * self.case.K * 2

    def call(self, r: int, cfg):
        x, tw, ids = self.inputs[r]
        return self.tm.fused_moe(x, self.w1, self.w2, tw, ids, quant=self.quant, config=cfg)

    def check(self, cfg) -> float:
        out = self.call(0, cfg).float()
        if self.torch.isnan(out).any():
            return float("nan")
        return ((out - self.ref).norm() / self.ref.norm()).item()

    def time_us(self, cfg) -> float:
        torch = self.torch
        R = len(self.inputs)
        if self.device.type != "cuda":  # interpreter smoke run: wall clock of one pass, no graphs
            t0 = time.perf_counter()
            for r in range(R):
                self.call(r, cfg)
            return (time.perf_counter() - t0) / R * 1e6
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for r in range(R):
                self.call(r, cfg)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for r in range(R):
                self.call(r, cfg)
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        samples = []
        for _ in range(self.replays):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3 / R)
        del graph
        return statistics.median(samples)


def describe(cfg) -> str:
    u, d = cfg.up, cfg.down
    if cfg.path == "gemv":
        return f"gemv up n{u.block_n} k{u.block_k} w{u.num_warps} | down n{d.block_n} k{d.block_k} w{d.num_warps} | pdl={int(cfg.pdl)}"
    return f"grouped m{u.block_m} n{u.block_n} k{u.block_k} w{u.num_warps} s{u.num_stages}"


def evaluate(runner: Runner, cfg, tol: float, log) -> dict:
    rec = {"config": cfg.as_dict(), "desc": describe(cfg)}
    try:
        err = runner.check(cfg)
        rec["rel_err"] = err
        if not err < tol:
            rec["status"] = f"wrong (rel_err {err:.3g} >= {tol})"
            log(f"    SKIP {rec['desc']}: {rec['status']}")
            return rec
        us = runner.time_us(cfg)
        rec.update(status="ok", us=us, pct_floor=100.0 * runner.floor_us / us)
    except Exception as exc:  # one failing config never stops the sweep
        rec["status"] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        rec["traceback"] = traceback.format_exc(limit=3)
        log(f"    FAIL {rec['desc']}: {rec['status']}")
        if runner.device.type == "cuda" and _cuda_broken(runner.torch):
            raise RuntimeError("CUDA context is unusable after this error; stopping the sweep") from exc
    return rec


def _cuda_broken(torch) -> bool:
    try:
        torch.cuda.synchronize()
        return False
    except Exception:
        return True


def search(case: Case, runner: Runner, tm, smoke: bool, pdl: bool, log) -> list[dict]:
    tol = 1e-2
    base, ups, downs, grouped = candidates(case, tm, runner.quant, smoke, pdl)
    results, best = [], {}

    def run(stage, cfg):
        rec = evaluate(runner, cfg, tol, log)
        rec["stage"] = stage
        results.append(rec)
        if rec["status"] == "ok" and (stage not in best or rec["us"] < best[stage][0]):
            best[stage] = (rec["us"], cfg)
        return rec

    run("default", replace(base, source="heuristic"))
    for bn, bk, w in ups:
        run("up", replace(base, up=tm.KernelConfig(block_n=bn, block_k=min(bk, _pow2_at_least(case.K)), num_warps=w),
                          source="sweep"))
    up_cfg = best.get("up", best.get("default", (0, base)))[1]
    for bn, w in downs:
        run("down", replace(up_cfg, down=replace(base.down, block_n=bn, num_warps=w)))
    gemv_cfg = best.get("down", (0, up_cfg))[1]
    if pdl:
        run("pdl", replace(gemv_cfg, pdl=not gemv_cfg.pdl))
    if case.M >= 8 or smoke:
        for bm, bn, bk, st in grouped:
            kc = tm.KernelConfig(block_n=bn, block_k=bk, num_warps=4, num_stages=st, block_m=bm)
            run("grouped", tm.MoEConfig("grouped", kc, kc, source="sweep"))
    return results


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def print_table(case: Case, runner: Runner, results: list[dict], log):
    log(f"\n== {case.model} {case.dtype} M={case.M}  floor {runner.floor_us:.1f} us "
        f"({runner.floor_us * HBM_BYTES_PER_S / 1e12:.1f} MB at {HBM_BYTES_PER_S / 1e12:.1f} TB/s)")
    if case.model == "kimi-k2.5" and case.dtype == "bf16" and case.M in VLLM_KIMI_BF16_US:
        log(f"   (issue's vLLM 0.21 number for this case: {VLLM_KIMI_BF16_US[case.M]} us)")
    ok = sorted((r for r in results if r["status"] == "ok"), key=lambda r: r["us"])
    for r in ok:
        log(f"   {r['us']:9.1f} us  {r['pct_floor']:5.1f}% floor  [{r['stage']:7s}] {r['desc']}")
    bad = [r for r in results if r["status"] != "ok"]
    for r in bad:
        log(f"   {'-':>9s}           [{r['stage']:7s}] {r['desc']}: {r['status']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="results JSON path")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU through the Triton interpreter")
    ap.add_argument("--rotations", type=int, default=None, help="calls per graph (default 16; smoke 1)")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--models", default=None, help="comma-separated subset of " + ",".join(MODELS))
    ap.add_argument("--dtypes", default=None, help="comma-separated subset of bf16,int4_w4a16-g32")
    ap.add_argument("--ms", default=None, help="comma-separated subset of the M values (1,2,4,8,16)")
    args = ap.parse_args(argv)

    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("no CUDA GPU: run with --smoke for the CPU interpreter check", file=sys.stderr)
        return 2
    if args.smoke and not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        # kernels are built for the interpreter only if the variable is set before the first import
        os.execve(sys.executable, [sys.executable, "-m", __spec__.name, *sys.argv[1:]],
                  dict(os.environ, TRITON_INTERPRET="1"))
    import moebench.gemm.triton_moe as tm
    from moebench.gemm.triton_moe.config import table_key

    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    rotations = args.rotations or (1 if args.smoke else 16)
    replays = 1 if args.smoke else args.replays
    pdl = device.type == "cuda" and torch.cuda.get_device_capability() >= (9, 0)
    t_start = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - t_start:7.1f}s] {msg}" if not msg.startswith("\n") else msg, flush=True)

    selected = cases(args.smoke)
    for flag, attr, conv in (("models", "model", str), ("dtypes", "dtype", str), ("ms", "M", int)):
        value = getattr(args, flag)
        if value:
            try:
                keep = {conv(v) for v in value.split(",")}
            except ValueError:
                ap.error(f"--{flag}: {value!r} is not a comma-separated list of {conv.__name__}")
            selected = [c for c in selected if getattr(c, attr) in keep]
    if not selected:
        ap.error("the --models / --dtypes / --ms filters leave no case")
    report = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (Triton interpreter)",
              "torch": torch.__version__, "triton": __import__("triton").__version__,
              "hbm_bytes_per_s": HBM_BYTES_PER_S, "rotations": rotations, "replays": replays,
              "cases": [], "table": {}}
    weights, weights_key = None, None
    try:
        for case in selected:
            log(f"case {case.model} {case.dtype} M={case.M}")
            try:
                if weights_key != (case.model, case.dtype):
                    weights = None  # free the previous set first
                    weights, weights_key = Weights(case, tm, torch, device), (case.model, case.dtype)
                runner = Runner(case, weights, tm, torch, device, rotations, replays)
                results = search(case, runner, tm, args.smoke, pdl, log)
            except RuntimeError as exc:
                if "CUDA context" in str(exc):
                    report["aborted"] = str(exc)
                    raise
                log(f"  case setup failed: {exc}")
                report["cases"].append({**case.__dict__, "error": str(exc), "results": []})
                continue
            print_table(case, runner, results, log)
            entry = {**case.__dict__, "floor_us": runner.floor_us, "results": results}
            ok = [r for r in results if r["status"] == "ok"]
            if ok:
                best = min(ok, key=lambda r: r["us"])
                entry["best"] = best
                key = table_key("fused", case.M, case.K, case.I, case.E, case.topk, case.dtype)
                report["table"][key] = {**best["config"], "source": "table"}
            report["cases"].append(entry)
            del runner
    except RuntimeError:
        pass
    finally:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        log(f"wrote {args.out}")
    return 1 if "aborted" in report else 0


if __name__ == "__main__":
    sys.exit(main())
