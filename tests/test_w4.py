"""The rows-4 int4 decode kernel (triton_moe/w4.py) on CPU (its tuner runs both int4 kernels): its layout from both sources it is packed
from, and the kernel (Triton's interpreter, the plain-Triton formula) against the float32 reference."""

from __future__ import annotations


import os
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import moebench.gemm.triton_moe as tm  # noqa: E402
from moebench.gemm.triton_moe import w4  # noqa: E402
from moebench.gemm.triton_moe.config import KernelConfig  # noqa: E402
from int4_problems import int4_problem, rel_error  # noqa: E402

E = 8


def _quantized(E, N, K, seed=0):
    g = torch.Generator().manual_seed(seed)
    data, scale, _ = tm.quantize_weight(torch.randn(E, N, K, generator=g), "int4_w4a16", 32)
    return data, scale


def test_rows4_layout_puts_four_rows_words_of_the_same_k_side_by_side():
    data, scale = _quantized(2, 8, 64)
    p = w4.pack_rows4(data, scale)
    words = data.view(torch.int32)  # [E, N, K/8]: row n's k word kw
    assert p.words.shape == (2, 2, 8, 4) and (p.E, p.N, p.K) == (2, 8, 64)
    for n in range(8):
        assert torch.equal(p.words[:, n // 4, :, n % 4], words[:, n])
        assert torch.equal(p.scales[:, n // 4, :, n % 4], scale[:, n].bfloat16())
    # every stride even: the kernel reads the bf16 scales as int32 pairs (a size-1 group axis too)
    assert all(s % 2 == 0 for s in w4.pack_rows4(*_quantized(1, 4, 32)).scales.stride()[:-1])


def test_compressed_tensors_tensors_pack_to_the_same_layout():
    data, scale = _quantized(2, 8, 64)
    # vLLM's loaded compressed-tensors tensors for Marlin: int32 [E, K/8, N], scales [E, K/32, N]
    ct = w4.from_compressed_tensors(data.view(torch.int32).transpose(1, 2).contiguous(),
                                    scale.transpose(1, 2).contiguous())
    ref = w4.pack_rows4(data, scale)
    assert torch.equal(ct.words, ref.words) and torch.equal(ct.scales, ref.scales)


@pytest.mark.parametrize("bad, needle", [
    (lambda d, s: (d[:, :6], s[:, :6]), "N % 4 == 0"),
    (lambda d, s: (d, s[:, :, :1]), "scales must be [E, N, K/32]"),
    (lambda d, s: (d.to(torch.int32), s), "must be uint8"),
])
def test_bad_weights_are_refused_in_one_line(bad, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        w4.pack_rows4(*bad(*_quantized(2, 8, 64)))


def _fused_err(M, K, I, topk, up, down, seed=0):
    pb = int4_problem(M, K, I, topk, E, seed)
    out = w4.fused_moe_w4(pb.x, w4.pack_rows4(pb.d1, pb.q.scales[0]), w4.pack_rows4(pb.d2, pb.q.scales[1]), pb.tw, pb.ids,
               config=(KernelConfig(*up), KernelConfig(*down)), pdl=False)
    return rel_error(out, pb.reference())


@pytest.mark.parametrize("M, K, I, topk, up, down", [
    (1, 64, 32, 2, (4, 64), (4, 32)),
    (3, 256, 32, 4, (8, 128), (8, 32, 4, 1, 16, 2)),    # K spans two chunks of the up loop; 2 down tiles
    (5, 160, 64, 2, (4, 64), (16, 64)),                 # K not a multiple of the chunk: the tail is masked
    (2, 64, 32, 2, (4, 64), (4, 32, 4, 1, 16, 3)),      # 3 down tiles of 4 rows: the last program runs past N
])
def test_fused_moe_w4_matches_the_float32_reference(interp, M, K, I, topk, up, down):
    assert interp(_fused_err, M, K, I, topk, up, down) < 1e-2


@pytest.mark.parametrize("kernel, prefix, other", [("rows4", "w4|", "mma"), ("mma", "w4mma|", "rows4"),
                                                  ("mma_experts", "w4mmax|", "mma")])
def test_the_tuner_runs_end_to_end_on_cpu(tmp_path, kernel, prefix, other):
    """w4_tune --smoke: the sweep's tiny shapes through the interpreter, each tile checked by the config
    sweep's Bench before it is timed, floors at the read ceiling measured in the run, a table keyed for
    the kernel's config picker, the other kernel timed beside it."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "w4.json"
    src = Path(__file__).resolve().parents[1] / "src"
    proc = subprocess.run([sys.executable, "-m", "moebench.gemm.triton_moe.w4_tune", "--smoke", "--kernel", kernel,
                           "--out", str(out)],
                          env=dict(os.environ, PYTHONPATH=str(src)), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    [r] = data["results"]
    assert r["rows"] and all("us" in row for row in r["rows"]), r["rows"]  # every tile passed its check
    assert data["read_ceiling_bytes_per_s"] > 0 and r["floor_us"] > 0
    assert list(data["table"]) == [r["key"]] and r["key"].startswith(prefix + "1024|32|32|4|")
    assert r["other_us"][other] > 0 and data["what"].startswith(f"w4_tune.py --kernel {kernel}, tree ")
