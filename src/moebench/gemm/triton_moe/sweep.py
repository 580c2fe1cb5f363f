"""Config sweep for the fused MoE: correctness first, then CUDA-graph timing against the memory floor.

    python -m moebench.gemm.triton_moe.sweep --out results.json          # GPU, a few minutes
    python -m moebench.gemm.triton_moe.sweep --smoke --out smoke.json    # CPU interpreter, tiny shapes

A case is the gemm family's own: GemmCase(model, tp 8, "fused", M, dtype, "decode", "triton") on its
Workload (the presets.py shapes, the suite's seeded weights, R rotated routings and inputs, the float32
reference and the byte count of the floor). Each candidate config is built by the `triton` backend (the
calls the suite times, with the config forced), checked by gemm.runner.check on poisoned outputs (wrong or
failing configs are recorded and skipped) and timed by gemm.runner.measure: the R calls in one CUDA graph
(timing.graph_timer, with its head start), per-call time = graph time / R, against the floor at the read
ceiling measured on this device when the sweep starts (moebench.core.bandwidth). Candidates are searched
coordinate-wise: up-kernel tiles, then down-kernel tiles with the best up, then PDL on/off, plus the
grouped (tl.dot) path for M >= 8. The JSON holds every result and a "table" of winners in configs.json's
format (apply_sweep.py merges it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from dataclasses import replace

from moebench.gemm.cases import ROTATIONS, GemmCase
from moebench.core.timing import StopRule

MODELS = ("kimi-k2.5", "deepseek-v3")
PLAN = {"bf16": (1, 2, 4, 8, 16), "int4-g32": (1, 4, 16)}
# The tiny preset split over 32 ranks (I = 32, the smallest int4-g32 allows): the interpreter runs a
# call in a second or two.
SMOKE = {"model": "tiny", "tp": 32, "plan": {"bf16": (1,), "int4-g32": (1,)}}
# The vLLM 0.21 fused_experts times for Kimi-K2.5 bf16 (us), printed for reference only.
VLLM_KIMI_BF16_US = {1: 43.9, 4: 102.0, 16: 339.0}
# The interpreter's timings mean nothing: one sample is enough to show the plumbing works.
SMOKE_RULE = StopRule(min_samples=1, max_samples=1)


def cases(smoke: bool) -> list[GemmCase]:
    """Model x dtype x M, model outermost (each model's weights are built once)."""
    models, plan, tp = ((SMOKE["model"],), SMOKE["plan"], SMOKE["tp"]) if smoke else (MODELS, PLAN, 8)
    return [GemmCase(model, tp, "fused", m, dtype, "decode", "triton")
            for model in models for dtype, ms in plan.items() for m in ms]


def reexec_interpreted(module: str) -> None:
    """Run this module again with TRITON_INTERPRET=1 (the --smoke runs, on CPU tensors, GPU or not): Triton
    builds its kernels for the interpreter only if the variable is set before it is first imported."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        os.execve(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]], dict(os.environ, TRITON_INTERPRET="1"))


class Bench:
    """One case on its workload, with what the harness needs to check and time a config there."""

    def __init__(self, case: GemmCase, device: str, rotations: int, ceiling: float, rule: StopRule | None):
        import torch

        from moebench.gemm.backends.triton_backend import build, default_config
        from moebench.gemm.workload import Workload

        self.case, self.device, self.ceiling, self.rule = case, device, ceiling, rule
        self.wl = Workload(replace(case, backend="-"), device, rotations)
        self.l2 = torch.cuda.get_device_properties(0).L2_cache_size if device == "cuda" else None
        self._build = build
        # config_for's choice for these inputs (the search's starting point). The suite's int4-g32 decode
        # cases run the rows-4 kernel instead (its own table and tuner, w4_tune.py): this sweep tunes the
        # gemv / grouped path that config_for serves.
        self.default = default_config(case, self.wl)
        self.floor_us = self.wl.bytes_per_call() / ceiling * 1e6

    def built(self, cfg=None):
        """The backend's R calls, with cfg forced (None: config_for's choice)."""
        return self._build(self.case, self.wl, cfg)

    def check(self, built) -> float:
        """The worst relative error over the checked rotations; AssertionError if over the bound."""
        from moebench.gemm import runner

        return runner.check(built, self.wl, key=self.case.key)["rel_error"]

    def time_us(self, built) -> tuple[float, float]:
        """(per-call us, % of floor) of the built calls, timed as the suite times them (no eager time)."""
        from moebench.gemm import runner

        metrics, _ = runner.measure(built, self.wl, ceiling=self.ceiling, l2_bytes=self.l2, rule=self.rule, eager=False)
        t = metrics["wall_us" if self.device == "cpu" else "graph_us"]
        return t.value, metrics["pct_of_floor"].value


def candidates(case: GemmCase, smoke: bool):
    """The tile grids of the search: up (block_n, block_k, warps), down (block_n, warps) and grouped
    (block_m, block_n, block_k, stages)."""
    if smoke:
        return [(32, 1024, 4)], [(128, 4)], [(16, 32, 64, 1)]
    quant = case.dtype != "bf16"
    bks = (1024, 2048) if quant else (512, 1024, 2048)
    warps = (4, 8) if quant else (4, 8, 16)
    # more than ~32 weight values per thread per chunk costs occupancy (150-250 registers)
    ups = [(bn, bk, w) for bn in (2, 4, 8, 16) for bk in bks for w in warps if bn * bk <= 1024 * w]
    downs = [(2, 4), (4, 4), (8, 4), (2, 8), (4, 8), (8, 8), (16, 8)]
    grouped = [(16, bn, bk, st) for bn in (64, 128) for bk in (64, 128) for st in (3, 4)]
    return ups, downs, grouped


def describe(cfg) -> str:
    """One line naming a config's path and tiles."""
    u, d = cfg.up, cfg.down
    if cfg.path == "gemv":
        return f"gemv up n{u.block_n} k{u.block_k} w{u.num_warps} | down n{d.block_n} k{d.block_k} w{d.num_warps} | pdl={int(cfg.pdl)}"
    return f"grouped m{u.block_m} n{u.block_n} k{u.block_k} w{u.num_warps} s{u.num_stages}"


def evaluate(bench: Bench, cfg, log) -> dict:
    """Check, then time, one config; a wrong or failing config is recorded with the reason."""
    rec = {"config": cfg.as_dict(), "desc": describe(cfg)}
    try:
        built = bench.built(cfg)
        try:
            rec["rel_err"] = bench.check(built)
        except AssertionError as exc:
            rec["status"] = f"wrong ({exc})"
            log(f"    SKIP {rec['desc']}: {rec['status']}")
            return rec
        us, pct = bench.time_us(built)
        rec.update(status="ok", us=us, pct_floor=pct)
    except Exception as exc:  # one failing config never stops the sweep
        rec["status"] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        rec["traceback"] = traceback.format_exc(limit=3)
        log(f"    FAIL {rec['desc']}: {rec['status']}")
        if bench.device == "cuda" and _cuda_broken():
            raise RuntimeError("CUDA context is unusable after this error; stopping the sweep") from exc
    return rec


def _cuda_broken() -> bool:
    import torch

    try:
        torch.cuda.synchronize()
        return False
    except Exception:
        return True


def search(bench: Bench, smoke: bool, pdl: bool, log) -> list[dict]:
    """Every config tried for the case, in search order, each with its stage."""
    import moebench.gemm.triton_moe as tm

    case, base = bench.case, bench.default
    ups, downs, grouped = candidates(case, smoke)
    results, best = [], {}

    def run(stage, cfg):
        rec = evaluate(bench, cfg, log)
        rec["stage"] = stage
        results.append(rec)
        if rec["status"] == "ok" and (stage not in best or rec["us"] < best[stage][0]):
            best[stage] = (rec["us"], cfg)

    run("default", replace(base, source="heuristic"))
    for bn, bk, w in ups:
        kc = tm.KernelConfig(block_n=bn, block_k=min(bk, _pow2_at_least(bench.wl.K)), num_warps=w)
        run("up", replace(base, up=kc, source="sweep"))
    up_cfg = best.get("up", best.get("default", (0, base)))[1]
    for bn, w in downs:
        run("down", replace(up_cfg, down=replace(base.down, block_n=bn, num_warps=w)))
    gemv_cfg = best.get("down", (0, up_cfg))[1]
    if pdl:
        run("pdl", replace(gemv_cfg, pdl=not gemv_cfg.pdl))
    if case.m >= 8 or smoke:
        for bm, bn, bk, st in grouped:
            kc = tm.KernelConfig(block_n=bn, block_k=bk, num_warps=4, num_stages=st, block_m=bm)
            run("grouped", tm.MoEConfig("grouped", kc, kc, source="sweep"))
    return results


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def print_table(bench: Bench, results: list[dict], log) -> None:
    """Every config's time and % of floor, fastest first, then the failed ones with why."""
    case, wl = bench.case, bench.wl
    log(f"\n== {case.model} {case.dtype} M={case.m}  floor {bench.floor_us:.1f} us "
        f"({wl.bytes_per_call() / 1e6:.1f} MB at the {bench.ceiling / 1e9:.0f} GB/s read ceiling)")
    if case.model == "kimi-k2.5" and case.dtype == "bf16" and case.m in VLLM_KIMI_BF16_US:
        log(f"   (issue's vLLM 0.21 number for this case: {VLLM_KIMI_BF16_US[case.m]} us)")
    for r in sorted((r for r in results if r["status"] == "ok"), key=lambda r: r["us"]):
        log(f"   {r['us']:9.1f} us  {r['pct_floor']:5.1f}% floor  [{r['stage']:7s}] {r['desc']}")
    for r in (r for r in results if r["status"] != "ok"):
        log(f"   {'-':>9s}           [{r['stage']:7s}] {r['desc']}: {r['status']}")


def setup(smoke: bool, replays: int | None) -> tuple[str, float, StopRule | None]:
    """(device, read ceiling in bytes/s, timing rule): the read ceiling is measured here, as the suite
    measures it (moebench.core.bandwidth); replays fixes the number of timed samples (default: the suite's
    stopping rule; one sample in the interpreter)."""
    import torch

    from moebench.core import bandwidth

    device = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    rule = SMOKE_RULE if device == "cpu" else StopRule(min_samples=replays, max_samples=replays) if replays else None
    return device, bandwidth.measure_ceiling(device, "read"), rule


def _select(ap, args, selected: list[GemmCase]) -> list[GemmCase]:
    for flag, attr, conv in (("models", "model", str), ("dtypes", "dtype", str), ("ms", "m", int)):
        value = getattr(args, flag)
        if value:
            try:
                keep = {conv(v) for v in value.split(",")}
            except ValueError:
                ap.error(f"--{flag}: {value!r} is not a comma-separated list of {conv.__name__}")
            selected = [c for c in selected if getattr(c, attr) in keep]
    if not selected:
        ap.error("the --models / --dtypes / --ms filters leave no case")
    return selected


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="results JSON path")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU through the Triton interpreter")
    ap.add_argument("--rotations", type=int, default=None, help=f"calls per graph (default {ROTATIONS}; smoke 1)")
    ap.add_argument("--replays", type=int, default=None, help="timed graph replays (default: the suite's rule)")
    ap.add_argument("--models", default=None, help="comma-separated subset of " + ",".join(MODELS))
    ap.add_argument("--dtypes", default=None, help="comma-separated subset of " + ",".join(PLAN))
    ap.add_argument("--ms", default=None, help="comma-separated subset of the M values (1,2,4,8,16)")
    args = ap.parse_args(argv)
    selected = _select(ap, args, cases(args.smoke))

    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("no CUDA GPU: run with --smoke for the CPU interpreter check", file=sys.stderr)
        return 2
    if args.smoke:
        reexec_interpreted(__spec__.name)
    import moebench.gemm.triton_moe as tm
    from moebench.gemm.triton_moe.config import table_key

    t_start = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - t_start:7.1f}s] {msg}" if not msg.startswith("\n") else msg, flush=True)

    device, ceiling, rule = setup(args.smoke, args.replays)
    rotations = args.rotations or (1 if device == "cpu" else ROTATIONS)
    pdl = device == "cuda" and tm.pdl_capable(torch.device("cuda"))
    report = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter)",
              "torch": torch.__version__, "triton": __import__("triton").__version__,
              "read_ceiling_bytes_per_s": ceiling, "rotations": rotations, "cases": [], "table": {}}
    try:
        for case in selected:
            log(f"case {case.model} {case.dtype} M={case.m}")
            entry = {"model": case.model, "tp": case.tp, "dtype": case.dtype, "M": case.m, "case": case.key}
            try:
                bench = Bench(case, device, rotations, ceiling, rule)
                entry.update(K=bench.wl.K, I=bench.wl.I, E=bench.wl.E, topk=bench.wl.topk)
                results = search(bench, args.smoke, pdl, log)
            except RuntimeError as exc:
                if "CUDA context" in str(exc):
                    report["aborted"] = str(exc)
                    raise
                log(f"  case setup failed: {exc}")
                report["cases"].append({**entry, "error": str(exc), "results": []})
                continue
            print_table(bench, results, log)
            entry.update(floor_us=bench.floor_us, results=results)
            ok = [r for r in results if r["status"] == "ok"]
            if ok:
                entry["best"] = best = min(ok, key=lambda r: r["us"])
                key = table_key("fused", case.m, bench.wl.K, bench.wl.I, bench.wl.E, bench.wl.topk, case.dtype)
                report["table"][key] = {**best["config"], "source": "table"}
            report["cases"].append(entry)
            del bench
    except RuntimeError:
        pass
    finally:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        log(f"wrote {args.out}")
    return 1 if "aborted" in report else 0


if __name__ == "__main__":
    sys.exit(main())
