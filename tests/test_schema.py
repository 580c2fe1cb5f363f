"""Baseline file validation: a valid file loads, and every malformed variant stops with a BaselineError
whose message is one line naming the file and the dotted path of the field at fault; a file with several
problems gets all of them in one message, one line each.

Files are loaded the way a run loads them (BaselineSet.load of <root>/<hardware-key>/<family>.json), so
the folder/hardware-key and file-name/family checks are part of what is tested.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moebench.baselines.compare import NOISE_FACTOR
from moebench.baselines.schema import NOISE_MAX, REL_TOL_MAX, BaselineError, fingerprint_id, validate_file
from moebench.baselines.store import BaselineSet, dumps, family_path, load_file
from moebench.core.metrics import Metric

# The hardware key of conftest.valid_document(). (Not imported: two conftest.py modules share the name.)
HW = "test-hw-x1"
REPO = Path(__file__).resolve().parents[1]

A = "entries['fake[a]']"
B = "entries['fake[b]']"


def test_valid_file_loads(tmp_path, valid_doc):
    path = family_path(tmp_path, HW, "gemm")
    path.parent.mkdir(parents=True)
    path.write_text(dumps(valid_doc))
    bs = BaselineSet.load(tmp_path, HW)
    assert bs.docs["gemm"] == valid_doc
    entry = bs.entry("gemm", "fake[a]")
    assert entry.metrics["latency_us"] == Metric(100.0, "us", "lower", 0.01, 20, 0.05)
    assert entry.definition_hash == "0123456789abcdef"
    assert bs.entry("gemm", "fake[zzz]") is None
    assert bs.fingerprint("gemm") == valid_doc["fingerprint"]


def test_missing_folder_is_an_empty_set(tmp_path):
    bs = BaselineSet.load(tmp_path / "nowhere", HW)
    assert bs.docs == {} and bs.entry("gemm", "fake[a]") is None


def _del(*keys):
    def mutate(doc):
        d = doc
        for k in keys[:-1]:
            d = d[k]
        del d[keys[-1]]
    return mutate


def _set(value, *keys):
    def mutate(doc):
        d = doc
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = value
    return mutate


LAT = ("entries", "fake[a]", "metrics", "latency_us")
PROV_A = ("entries", "fake[a]", "provenance")
PROV_B = ("entries", "fake[b]", "provenance")

# (id, mutation of the valid document, the dotted field path the message must name)
MALFORMED = [
    ("missing field", _del(*LAT, "unit"), f"{A}.metrics.latency_us.unit"),
    ("missing value", _del(*LAT, "value"), f"{A}.metrics.latency_us.value"),
    ("wrong direction", _set("down", *LAT, "direction"), f"{A}.metrics.latency_us.direction"),
    ("negative noise", _set(-0.01, *LAT, "noise"), f"{A}.metrics.latency_us.noise"),
    ("n = 0", _set(0, *LAT, "n"), f"{A}.metrics.latency_us.n"),
    ("n not an integer", _set(2.5, *LAT, "n"), f"{A}.metrics.latency_us.n"),
    ("value a string", _set("100", *LAT, "value"), f"{A}.metrics.latency_us.value"),
    ("value a boolean", _set(True, *LAT, "value"), f"{A}.metrics.latency_us.value"),
    ("negative rel_tol", _set(-0.1, *LAT, "rel_tol"), f"{A}.metrics.latency_us.rel_tol"),
    # Physically impossible values used to load, then gated as "delta -4074.8%, tolerance 700%".
    ("negative time", _set(-4.0, *LAT, "value"), f"{A}.metrics.latency_us.value"),
    ("zero time", _set(0.0, *LAT, "value"), f"{A}.metrics.latency_us.value"),
    ("rel_tol 7 (700%)", _set(7, *LAT, "rel_tol"), f"{A}.metrics.latency_us.rel_tol"),
    ("rel_tol 0", _set(0.0, *LAT, "rel_tol"), f"{A}.metrics.latency_us.rel_tol"),
    ("empty unit", _set("", *LAT, "unit"), f"{A}.metrics.latency_us.unit"),
    ("no metrics", _set({}, "entries", "fake[a]", "metrics"), f"{A}.metrics"),
    ("no definition_hash", _del("entries", "fake[a]", "definition_hash"), f"{A}.definition_hash"),
    ("wrong schema_version", _set(3, "schema_version"), "schema_version"),
    ("schema_version true", _set(True, "schema_version"), "schema_version"),
    ("schema_version 1.0", _set(1.0, "schema_version"), "schema_version"),
    ("no schema_version", _del("schema_version"), "schema_version"),
    ("measured without commit", _del(*PROV_A, "commit"), f"{A}.provenance.commit"),
    ("measured with empty commit", _set("", *PROV_A, "commit"), f"{A}.provenance.commit"),
    ("measured without versions", _del(*PROV_A, "versions"), f"{A}.provenance.versions"),
    ("external without source", _del(*PROV_B, "source"), f"{B}.provenance.source"),
    ("unknown provenance kind", _set("guessed", *PROV_B, "kind"), f"{B}.provenance.kind"),
    ("provenance without date", _del(*PROV_B, "date"), f"{B}.provenance.date"),
    ("hardware_key not the folder's", _set("nvidia-h200-x8", "hardware_key"), "hardware_key"),
    ("hardware_key not a slug", _set("../../tmp/evil", "hardware_key"), "hardware_key"),
    ("family not the file's", _set("decode", "family"), "family"),
    ("entries not an object", _set([], "entries"), "entries"),
    ("fingerprint missing", _del("fingerprint"), "fingerprint"),
    # Bounds: a tolerance past a doubling, and a noise whose band (2 x noise) would hide a doubling.
    ("rel_tol 1.01", _set(1.01, *LAT, "rel_tol"), f"{A}.metrics.latency_us.rel_tol"),
    ("noise 0.51", _set(0.51, *LAT, "noise"), f"{A}.metrics.latency_us.noise"),
    ("noise 50", _set(50.0, *LAT, "noise"), f"{A}.metrics.latency_us.noise"),
    # The bounds of what combining runs stores (moebench.baselines.combine): a spread is >= 0, a run counts.
    ("negative noise_machines", _set(-0.01, *LAT, "noise_machines"), f"{A}.metrics.latency_us.noise_machines"),
    ("independent_runs 0", _set(0, "entries", "fake[a]", "independent_runs"), f"{A}.independent_runs"),
    # An entry's machine: one of the header's fingerprints, each stored under its own id.
    ("entry names no stored fingerprint", _set("0123abcd0123", "entries", "fake[a]", "fingerprint"),
     f"{A}.fingerprint"),
    ("fingerprints not an object", _set([], "fingerprints"), "fingerprints"),
    ("fingerprint edited after its id", _set({"0123abcd0123": {"gpus": []}}, "fingerprints"),
     "fingerprints['0123abcd0123']"),
]


def _assert_one_line(err: BaselineError, path, field: str) -> None:
    msg = str(err)
    assert "\n" not in msg, f"message is not one line: {msg!r}"
    assert str(path) in msg, f"message does not name the file: {msg!r}"
    assert f": {field}: " in msg, f"message does not name the field {field!r}: {msg!r}"


@pytest.mark.parametrize("mutate, field", [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_malformed_file_names_file_and_field(tmp_path, valid_doc, mutate, field):
    mutate(valid_doc)
    path = family_path(tmp_path, HW, "gemm")
    path.parent.mkdir(parents=True)
    path.write_text(dumps(valid_doc))
    with pytest.raises(BaselineError) as e:
        BaselineSet.load(tmp_path, HW)
    _assert_one_line(e.value, path, field)


def test_every_problem_of_a_file_is_reported_at_once(tmp_path, valid_doc):
    # Only the first problem used to be shown: a reviewer fixed one field per run.
    lat_a = valid_doc["entries"]["fake[a]"]["metrics"]["latency_us"]
    lat_a["value"], lat_a["rel_tol"] = -4.0, 7
    valid_doc["entries"]["fake[b]"]["metrics"]["tokens_per_s"]["noise"] = -0.5
    del valid_doc["entries"]["fake[b]"]["provenance"]["source"]
    valid_doc["family"] = "nope"
    path = family_path(tmp_path, HW, "gemm")
    path.parent.mkdir(parents=True)
    path.write_text(dumps(valid_doc))
    with pytest.raises(BaselineError) as e:
        BaselineSet.load(tmp_path, HW)
    head, *lines = str(e.value).splitlines()
    assert head == f"{path}: 5 errors"
    fields = [f"{A}.metrics.latency_us.value", f"{A}.metrics.latency_us.rel_tol", f"{B}.metrics.tokens_per_s.noise",
              f"{B}.provenance.source", "family"]
    assert len(lines) == len(fields)
    for field in fields:
        assert [l for l in lines if l.startswith(f"  {path}: {field}: ")], f"no line names {field}: {lines}"


def test_bad_json_names_line_and_column(tmp_path):
    # Line 3 lacks its comma: the parser stops at the first character of line 4's key, column 3.
    text = '{\n  "schema_version": 1,\n  "hardware_key": "test-hw-x1"\n  "family": "gemm"\n}\n'
    path = family_path(tmp_path, HW, "gemm")
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(BaselineError) as e:
        BaselineSet.load(tmp_path, HW)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg
    assert ": line 4 column 3: invalid JSON" in msg


@pytest.mark.parametrize("text, message", [
    # json's message ends in " at" (str(e) puts the position after it): the line used to end there, cut off
    ('{\n  "schema_version": 1,\n  "hardware_key": "test-hw',
     "line 3 column 19: invalid JSON: Unterminated string starting at line 3 column 19"),
    ('{"family": "ge\tmm"}', "line 1 column 15: invalid JSON: Invalid control character at line 1 column 15"),
    ('{"family" "gemm"}', "line 1 column 11: invalid JSON: Expecting ':' delimiter"),  # complete as json says it
], ids=["unterminated string", "control character", "missing colon"])
def test_bad_json_is_one_complete_line(tmp_path, text, message):
    path = tmp_path / "gemm.json"
    path.write_text(text)
    with pytest.raises(BaselineError) as e:
        load_file(path)
    assert str(e.value) == f"{path}: {message}"


def test_nan_in_the_file_is_not_a_finite_number(tmp_path, valid_doc):
    # Python's json reads the non-standard token NaN; the schema must still refuse it.
    path = tmp_path / "gemm.json"
    path.write_text(dumps(valid_doc).replace('"value": 100.0', '"value": NaN'))
    with pytest.raises(BaselineError) as e:
        load_file(path)
    _assert_one_line(e.value, path, f"{A}.metrics.latency_us.value")


@pytest.mark.parametrize("doc, field", [([], "(top level)"), ("text", "(top level)"), ({}, "schema_version")])
def test_not_an_object(doc, field):
    with pytest.raises(BaselineError) as e:
        validate_file(doc, "x.json")
    assert str(e.value).startswith(f"x.json: {field}: ")


def test_baseline_error_is_a_value_error():
    # Callers that only know ValueError (CLI, scripts) still catch it.
    assert issubclass(BaselineError, ValueError)


def test_validation_does_not_change_the_document(valid_doc):
    before = json.dumps(valid_doc, sort_keys=True)
    validate_file(valid_doc, "x.json", hardware_key=HW, family="gemm")
    assert json.dumps(valid_doc, sort_keys=True) == before


def test_the_bounds_still_show_a_doubling_and_hold_every_committed_baseline():
    # The widest stored noise band (NOISE_FACTOR x NOISE_MAX) must not reach past the widest tolerance,
    # a doubling; and the committed files (rel_tol up to 1.00 for eager NCCL, noise up to 0.45) load.
    assert NOISE_FACTOR * NOISE_MAX <= REL_TOL_MAX == 1.0
    committed = sorted((REPO / "baselines").glob("*/*.json"))
    assert committed
    for path in committed:
        load_file(path, hardware_key=path.parent.name, family=path.stem)


def test_an_entry_naming_its_machine_loads_with_it(tmp_path, valid_doc):
    fp = {"gpus": [{"name": "NVIDIA H200"}]}
    valid_doc["fingerprints"] = {fingerprint_id(fp): fp}
    valid_doc["entries"]["fake[a]"]["fingerprint"] = fingerprint_id(fp)
    path = family_path(tmp_path, HW, "gemm")
    path.parent.mkdir(parents=True)
    path.write_text(dumps(valid_doc))
    bs = BaselineSet.load(tmp_path, HW)
    assert bs.fingerprint("gemm", "fake[a]") == fp
    assert bs.fingerprint("gemm", "fake[b]") == valid_doc["fingerprint"], "an entry naming none: the header's"


def _with_own_machines(doc: dict, own, runs=None) -> None:
    """fake[a] as an entry of two machines and 4 runs whose latency_us names its own machines (and runs)."""
    doc["entries"]["fake[a]"].update(machines=["gpu-a", "gpu-b"], independent_runs=4)
    doc["entries"]["fake[a]"]["metrics"]["latency_us"]["machines"] = own
    if runs is not None:
        doc["entries"]["fake[a]"]["metrics"]["latency_us"]["independent_runs"] = runs


def test_a_metric_naming_machines_of_its_entry_loads_with_them(tmp_path, valid_doc):
    _with_own_machines(valid_doc, ["gpu-b"], 3)
    path = family_path(tmp_path, HW, "gemm")
    path.parent.mkdir(parents=True)
    path.write_text(dumps(valid_doc))
    entry = BaselineSet.load(tmp_path, HW).entry("gemm", "fake[a]")
    assert entry.machines_of("latency_us") == ("gpu-b",) and entry.machines == ("gpu-a", "gpu-b")
    assert entry.measured_on("gpu-a") and not entry.measured_on("gpu-a", "latency_us")


@pytest.mark.parametrize("own, runs, what", [
    (["gpu-z"], None, "names 'gpu-z', not one of the entry's machines (['gpu-a', 'gpu-b'])"),
    ([], None, "must be a non-empty list of machine ids, got []"),
    (["gpu-a", ""], None, "must be a non-empty list of machine ids"),
    ("gpu-a", None, "must be a non-empty list of machine ids, got 'gpu-a'"),
    (["gpu-a"], 5, "5 is more than the entry's independent_runs (4)"),
    (["gpu-a"], 0, "must be an integer >= 1, got 0"),
])
def test_a_metric_s_own_machines_are_checked_against_its_entry_naming_the_field(tmp_path, valid_doc, own, runs, what):
    _with_own_machines(valid_doc, own, runs)
    path = family_path(tmp_path, HW, "gemm")
    path.parent.mkdir(parents=True)
    path.write_text(dumps(valid_doc))
    with pytest.raises(BaselineError) as e:
        BaselineSet.load(tmp_path, HW)
    field = f"{A}.metrics.latency_us.{'machines' if runs is None else 'independent_runs'}"
    _assert_one_line(e.value, path, field)
    assert what in str(e.value)
