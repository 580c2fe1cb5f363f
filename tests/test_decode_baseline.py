"""The users' external figure: a valid baseline file, keyed and hashed like the scenario it belongs to,
compared only on its own hardware."""

from __future__ import annotations

from pathlib import Path

from moebench.core import provenance
from moebench.baselines.store import load_file, other_hardware_entries
from moebench.decode.scenarios import cases_of, load_scenarios

REPO = Path(__file__).resolve().parents[1]
KEY = "nvidia-rtx-pro-6000-blackwell-server-edition-x8"
FILE = REPO / "baselines" / KEY / "decode.json"


def _glm_case():
    [case] = [c for c in cases_of(load_scenarios(REPO / "benchmarks" / "decode_scenarios.toml"))
              if c.scenario.name == "glm-5-nvfp4-tp8-sglang"]
    return case


def test_external_baseline_file_validates():
    doc = load_file(FILE, hardware_key=KEY, family="decode")
    [(key, entry)] = doc["entries"].items()
    m = entry["metrics"]["ms_per_token"]
    assert (m["value"], m["unit"], m["direction"]) == (97.0, "ms", "lower")
    prov = entry["provenance"]
    assert prov["kind"] == "external"
    for word in ("SGLang", "GLM-5-NVFP4", "TP8", "192 ms/token", "warm-up"):
        assert word in prov["source"], word


def test_external_entry_matches_the_scenario_key_and_definition():
    # Editing the scenario makes the users' figure STALE on their box: update the hash consciously.
    doc = load_file(FILE, hardware_key=KEY, family="decode")
    case = _glm_case()
    assert case.key in doc["entries"]
    assert doc["entries"][case.key]["definition_hash"] == provenance.definition_hash(case.definition())
    assert case.scenario.only_on == (KEY,)


def test_external_figure_is_seen_from_other_hardware_as_someone_elses():
    found = other_hardware_entries(REPO / "baselines", "nvidia-h200-x1", "decode", _glm_case().key)
    assert list(found) == [KEY] and found[KEY].metrics["ms_per_token"].value == 97.0
