"""Hardware identity without a GPU: name normalization, the hardware key for fake GPU and CPU
fingerprints, the same-hardware rule, CUDA_VISIBLE_DEVICES mapping (with a fake NVML for UUIDs), the
throttle rule, and the real fingerprint of this CPU box (in a subprocess, to see that torch stays out).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from moebench.core import hardware
from moebench.core.hardware import ClockReport, hardware_key, normalize_name, same_hardware

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.mark.parametrize("raw, norm", [
    ("NVIDIA H200", "nvidia-h200"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "nvidia-rtx-pro-6000-blackwell-server-edition"),
    ("  AMD EPYC 7B13 64-Core Processor  ", "amd-epyc-7b13-64-core-processor"),
    ("Intel(R) Xeon(R) Platinum 8480+", "intel-r-xeon-r-platinum-8480"),
    ("NVIDIA H100 80GB HBM3", "nvidia-h100-80gb-hbm3"),
    ("", ""),
])
def test_normalize_name(raw, norm):
    assert normalize_name(raw) == norm


def gpu_fp(*names: str | None) -> dict:
    return {"cpu": {"model": "AMD EPYC 9654", "cores": 192}, "gpus": [{"index": i, "name": n} for i, n in enumerate(names)]}


def cpu_fp(model: str = "AMD EPYC 7B13 64-Core Processor", cores: int = 2) -> dict:
    return {"cpu": {"model": model, "cores": cores}, "gpus": []}


@pytest.mark.parametrize("fp, key", [
    (gpu_fp("NVIDIA H200"), "nvidia-h200-x1"),
    (gpu_fp("NVIDIA H200", "NVIDIA H200"), "nvidia-h200-x2"),
    (gpu_fp(*["NVIDIA RTX PRO 6000 Blackwell Server Edition"] * 8),
     "nvidia-rtx-pro-6000-blackwell-server-edition-x8"),
    (gpu_fp("NVIDIA H200", "NVIDIA H100 80GB HBM3"), "mixed-nvidia-h100-80gb-hbm3-nvidia-h200-x2"),
    (gpu_fp(None), "unknown-x1"),
    (cpu_fp(), "cpu-amd-epyc-7b13-64-core-processor-2c"),
    (cpu_fp("", 4), "cpu-unknown-4c"),
])
def test_hardware_key(fp, key):
    assert hardware_key(fp) == key


@pytest.mark.parametrize("recorded, current, same", [
    (None, gpu_fp("NVIDIA H200"), True),                                   # no header: nothing to refuse
    (gpu_fp("NVIDIA H200"), gpu_fp("NVIDIA H200"), True),
    ({**gpu_fp("NVIDIA H200"), "versions": {"torch": "2.4"}},
     {**gpu_fp("NVIDIA H200"), "versions": {"torch": "2.11"}}, True),     # versions are what we catch
    (gpu_fp("NVIDIA H200", "NVIDIA H200"), gpu_fp("NVIDIA H200"), False),  # count differs
    (gpu_fp("NVIDIA H200"), gpu_fp("NVIDIA H100 80GB HBM3"), False),       # model differs
    (gpu_fp("NVIDIA H200"), cpu_fp(), False),
    (cpu_fp("AMD EPYC"), cpu_fp("AMD EPYC"), True),
    (cpu_fp("AMD EPYC"), cpu_fp("Intel Xeon"), False),
])
def test_same_hardware(recorded, current, same):
    ok, why = same_hardware(recorded, current)
    assert ok is same
    assert bool(why) is (not same), "a mismatch says why; a match says nothing"


@pytest.mark.parametrize("env, count, visible", [
    (None, 4, [0, 1, 2, 3]),
    ("", 4, []),
    ("1,0", 4, [1, 0]),
    (" 2 , 3 ", 4, [2, 3]),
    ("0,7,1", 4, [0]),          # CUDA stops enumerating at the first invalid entry
    ("3", 2, []),
])
def test_visible_indices_with_integer_lists(monkeypatch, env, count, visible):
    if env is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
    assert hardware._visible_indices(count) == visible


class FakeNvml:
    """The two NVML calls _visible_indices makes to map UUIDs."""

    UUIDS = ["GPU-aaaa-1111", "GPU-bbbb-2222", "GPU-cccc-3333"]

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUUID(self, handle):
        return self.UUIDS[handle]


@pytest.mark.parametrize("env, visible", [
    ("GPU-cccc-3333,GPU-aaaa-1111", [2, 0]),
    ("GPU-bbbb", [1]),              # a unique prefix names a device, as CUDA allows
    ("GPU-zzzz,GPU-aaaa-1111", []),  # an unknown UUID ends the list
    ("-1", []),                     # the usual way to hide every GPU
])
def test_visible_indices_with_uuids(monkeypatch, env, visible):
    monkeypatch.setattr(hardware, "_nvml", lambda: FakeNvml())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
    assert hardware._visible_indices(3) == visible


def test_visible_gpu_count_reads_the_fingerprint(monkeypatch):
    monkeypatch.setattr(hardware, "fingerprint", lambda: gpu_fp("NVIDIA H200", "NVIDIA H200"))
    assert hardware.visible_gpu_count() == 2


@pytest.mark.parametrize("reasons, throttled", [
    (set(), False),
    ({"sw_power_cap"}, False),      # a compute-bound kernel at its power cap is normal
    ({"hw_slowdown"}, True),
    ({"sw_thermal", "sw_power_cap"}, True),
])
def test_throttle_rule(reasons, throttled):
    r = ClockReport(samples=3, reasons_seen=set(reasons))
    assert r.throttled is throttled
    assert r.to_json()["throttled"] is throttled


def test_clock_monitor_without_nvml_is_empty_and_unthrottled(monkeypatch):
    monkeypatch.setattr(hardware, "_nvml", lambda: None)
    with hardware.clock_monitor() as report:
        pass
    assert report.samples == 0 and not report.throttled


@pytest.mark.parametrize("mask, reasons, throttled", [
    (0x0, set(), False),
    (0x4, {"sw_power_cap"}, False),
    (0x40, {"hw_thermal"}, True),
    (0x4 | 0x40, {"sw_power_cap", "hw_thermal"}, True),     # several reasons at once: bits, not one value
    (0x1 | 0x8 | 0x20, {"hw_slowdown", "sw_thermal"}, True),  # 0x1 (idle) is neither counted nor recorded
], ids=["none", "power-cap", "hw-thermal", "power-cap+hw-thermal", "idle+hw-slowdown+sw-thermal"])
def test_clock_monitor_reads_each_bit_of_the_reasons_mask(fake_nvml, mask, reasons, throttled):
    fake_nvml(mask, count=2)
    with hardware.clock_monitor() as report:
        pass
    assert report.reasons_seen == reasons and report.throttled is throttled
    assert report.samples >= 4 and report.min_sm_clock_mhz == report.max_sm_clock_mhz == 1980  # 2 GPUs, start + end


def test_clock_monitor_records_memory_clock_power_and_temperature(fake_nvml):
    # what tells two machines of one kind apart when they time one case differently
    fake_nvml(0, count=1)
    with hardware.clock_monitor() as report:
        pass
    got = report.to_json()
    assert (got["min_mem_clock_mhz"], got["max_mem_clock_mhz"]) == (3201, 3201)
    assert (got["min_power_w"], got["max_power_w"], got["min_temp_c"], got["max_temp_c"]) == (650.0, 650.0, 61, 61)


def test_clock_report_ranges_span_every_sample():
    r = ClockReport()
    r.add(1980, 3201, 600_000, 55, 0)
    r.add(1755, None, 700_000, 60, 0x4)
    assert (r.min_sm_clock_mhz, r.max_sm_clock_mhz, r.min_mem_clock_mhz, r.max_mem_clock_mhz) == (1755, 1980, 3201, 3201)
    assert (r.min_power_w, r.max_power_w, r.min_temp_c, r.max_temp_c) == (600.0, 700.0, 55, 60)
    assert r.samples == 2 and r.reasons_seen == {"sw_power_cap"} and not r.throttled


def test_machine_id_comes_from_the_gpu_uuids_not_the_host():
    a = {"host": "runner-1", "gpus": [{"uuid": "GPU-aaaa"}, {"uuid": "GPU-bbbb"}]}
    b = {"host": "runner-2", "gpus": [{"uuid": "GPU-bbbb"}, {"uuid": "GPU-aaaa"}]}
    c = {"host": "runner-1", "gpus": [{"uuid": "GPU-cccc"}, {"uuid": "GPU-bbbb"}]}
    assert hardware.machine_id(a) == hardware.machine_id(b)  # the same GPUs in another order, another host name
    assert hardware.machine_id(a) != hardware.machine_id(c)  # one GPU swapped: another machine
    assert hardware.machine_id(a).startswith("gpu-") and len(hardware.machine_id(a)) == 16
    assert hardware.machine_id({"gpus": [{"uuid": None}]}) == "unknown"


def test_machine_id_on_a_cpu_box_is_stable_and_in_the_fingerprint():
    fp = hardware.fingerprint()
    assert fp["machine_id"] == hardware.machine_id(fp) == hardware.machine_id(dict(fp, host="elsewhere"))
    assert fp["machine_id"].startswith("cpu-") or fp["machine_id"] == "unknown"


def test_cpu_change_names_both_models_only_when_they_differ():
    rec, here = {"cpu": {"model": "Intel Xeon 8480"}}, {"cpu": {"model": "AMD EPYC 9654"}}
    assert hardware.cpu_change(rec, here) == "CPU 'Intel Xeon 8480' at recording, 'AMD EPYC 9654' here"
    assert hardware.cpu_change(rec, rec) == ""
    assert hardware.cpu_change(None, here) == "" and hardware.cpu_change({"cpu": {}}, here) == ""


def test_fingerprint_on_this_cpu_box_has_no_gpus_and_does_not_import_torch():
    # A fresh interpreter: in this one torch may already be imported by someone else's test.
    code = textwrap.dedent("""
        import json, sys
        import moebench.plugin  # collection imports the plugin: it must stay torch-free too
        from moebench.core import hardware
        fp = hardware.fingerprint()
        print(json.dumps({"gpus": fp["gpus"], "key": hardware.hardware_key(fp),
                          "torch": "torch" in sys.modules, "cuda": any(m.startswith("torch.cuda") for m in sys.modules)}))
    """)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["gpus"] == [], "this test runs on a CPU-only box"
    assert got["key"].startswith("cpu-") and got["key"].endswith("c")
    assert got["torch"] is False and got["cuda"] is False
