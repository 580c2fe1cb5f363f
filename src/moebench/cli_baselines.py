"""`moebench baselines show|diff|promote`: read, compare and (reviewed) update baseline files.

The parser and the other commands live in moebench.cli; case patterns, exit codes and CliError come
from moebench.cli_common; numbers and tables from the report layer (moebench.report).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from moebench.baselines.combine import combine_entries
from moebench.baselines.compare import Verdict, display_rank
from moebench.baselines.schema import validate_file
from moebench.baselines.store import load_file
from moebench.baselines.update import merge_files
from moebench.cli_common import EXIT_FOUND, EXIT_OK, CliError, check_patterns, matcher
from moebench.report import fmt_pct, fmt_value, table
from moebench.results import ResultsDoc, read_json
from moebench.runs import baseline_entries


def _baseline_files(path: Path) -> list[Path]:
    """A baseline file, a hardware folder (<family>.json) or a root (<hardware-key>/<family>.json)."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise CliError(f"{path}: no such file or folder")
    files = sorted(path.glob("*.json")) or sorted(path.glob("*/*.json"))
    if not files:
        raise CliError(f"{path}: no baseline files (<family>.json or <hardware-key>/<family>.json) in this folder")
    return files


def _entries(path: Path) -> dict[tuple[str, str, str], dict]:
    """(hardware key, family, case key) -> stored entry, over every baseline file under `path`."""
    out = {}
    for f in _baseline_files(path):
        doc = load_file(f)
        for key, entry in doc["entries"].items():
            out[(doc["hardware_key"], doc["family"], key)] = entry
    return out


def _provenance(p: dict) -> str:
    if p.get("kind") == "external":
        return f"external: {p.get('source', '?')} ({p.get('date', '?')[:10]})"
    return f"measured {str(p.get('commit', '?'))[:10]} {str(p.get('date', '?'))[:10]}"


def _machine(fp: dict) -> str:
    gpus = fp.get("gpus") or []
    what = f"{len(gpus)} x {gpus[0].get('name')}" if gpus else f"CPU {fp.get('cpu', {}).get('model', '?')}"
    versions = ", ".join(f"{k} {v}" for k, v in sorted((fp.get("versions") or {}).items()) if v and k in ("torch", "triton", "vllm", "sglang"))
    driver = f", driver {fp['driver']}" if fp.get("driver") else ""
    return what + driver + (f"; {versions}" if versions else "")


def cmd_baselines_show(args: argparse.Namespace) -> int:
    """A table of the entries of baseline files, each file introduced by its header."""
    keep = matcher(args.case)
    files = _baseline_files(Path(args.path))
    docs = [(f, load_file(f)) for f in files]
    check_patterns(args.case, [k for _, d in docs for k in d["entries"]], args.path)
    for f, doc in docs:
        keys = [k for k in sorted(doc["entries"]) if keep is None or keep(k)]
        if keep is not None and not keys:
            continue
        print(f"{f}: {doc['hardware_key']} / {doc['family']}, {len(doc['entries'])} entries, schema {doc['schema_version']}, "
              f"created {doc.get('created', '?')}, updated {doc.get('updated', '?')}")
        print(f"  recorded on {_machine(doc['fingerprint'])}")
        rows = []
        for k in keys:
            e = doc["entries"][k]
            for name, m in sorted(e["metrics"].items()):
                rows.append([k, name, fmt_value(m["value"], m["unit"]), m["direction"], fmt_pct(100 * m["rel_tol"]),
                             fmt_pct(100 * m["noise"]), str(m["n"]), _provenance(e["provenance"])])
        print(table(["case", "metric", "value", "better", "rel_tol", "noise", "n", "provenance"], rows, right=(2, 4, 5, 6)))
        print()
    return EXIT_OK


def cmd_baselines_diff(args: argparse.Namespace) -> int:
    """What changed between two baseline files or folders, entry by entry and metric by metric."""
    a, b = _entries(Path(args.a)), _entries(Path(args.b))
    lines, unchanged = [], 0
    for k in sorted(set(a) | set(b)):
        hw, fam, key = k
        where = f"{hw}/{fam} {key}"
        if k not in a:
            ms = ", ".join(f"{n} {fmt_value(m['value'], m['unit'])}" for n, m in sorted(b[k]["metrics"].items()))
            lines.append(f"+ {where}: {ms} ({_provenance(b[k]['provenance'])})")
            continue
        if k not in b:
            lines.append(f"- {where}")
            continue
        ea, eb = a[k], b[k]
        changes = []
        for n in sorted(set(ea["metrics"]) | set(eb["metrics"])):
            ma, mb = ea["metrics"].get(n), eb["metrics"].get(n)
            if ma is None:
                changes.append(f"{n} added {fmt_value(mb['value'], mb['unit'])}")
            elif mb is None:
                changes.append(f"{n} removed")
            else:
                if ma["value"] != mb["value"]:
                    pct = 100 * (mb["value"] - ma["value"]) / ma["value"] if ma["value"] else None
                    changes.append(f"{n} {fmt_value(ma['value'])} -> {fmt_value(mb['value'], mb['unit'])} ({fmt_pct(pct, signed=True)})")
                for field in ("rel_tol", "direction", "unit"):
                    if ma[field] != mb[field]:
                        changes.append(f"{n} {field} {ma[field]} -> {mb[field]}")
        if ea["definition_hash"] != eb["definition_hash"]:
            changes.append("case definition changed")
        if ea["provenance"] != eb["provenance"] and changes:
            changes.append(f"now {_provenance(eb['provenance'])}")
        if changes:
            lines.append(f"~ {where}: " + "; ".join(changes))
        else:
            unchanged += 1
    for line in lines:
        print(line)
    added = sum(1 for line in lines if line.startswith("+"))
    removed = sum(1 for line in lines if line.startswith("-"))
    print(f"{added} added, {removed} removed, {len(lines) - added - removed} changed, {unchanged} unchanged")
    return EXIT_FOUND if args.exit_code and lines else EXIT_OK


def _promotion_source(path: Path) -> list[tuple[str, str, dict, dict, str]]:
    """(hardware key, family, fingerprint, {key: entry}, source note) from a results file, a proposed
    baseline file, or a folder of them (--baseline-propose DIR)."""
    if path.is_dir():
        files = sorted(path.glob("*.json")) + sorted(path.glob("*/*.json"))
        if not files:
            raise CliError(f"{path}: no proposed baseline files (<hardware-key>/<family>.json) in this folder")
        return [s for f in files for s in _promotion_source(f)]
    doc = read_json(path)
    if isinstance(doc, dict) and "schema_version" in doc:
        validate_file(doc, str(path))
        return [(doc["hardware_key"], doc["family"], doc["fingerprint"], doc["entries"], f"proposed in {path}")]
    run = ResultsDoc.from_json(doc, str(path))
    verdicts = {k: c.verdict for k, c in run.cases.items()}
    return [(run.hardware_key, fam, run.fingerprint,
             {k: dict(e, _verdict=verdicts[k]) for k, e in entries.items()}, f"measured in {path}")
            for fam, entries in sorted(baseline_entries(run).items())]


def _combined_sources(paths: list[str]) -> list[tuple[str, str, dict, dict, str]]:
    """The promotion sources of every path, with each (hardware key, family) merged into one: a case in
    several runs becomes the median of them (combine_entries), its verdict the worst it had."""
    groups: dict[tuple[str, str], list[tuple[dict, dict, str]]] = {}
    for p in paths:
        for hw, fam, fp, entries, note in _promotion_source(Path(p)):
            groups.setdefault((hw, fam), []).append((fp, entries, note))
    out = []
    for (hw, fam), parts in groups.items():
        if len(parts) == 1:
            out.append((hw, fam, *parts[0]))
            continue
        by_key: dict[str, list[dict]] = {}
        for _, entries, _ in parts:
            for k, e in entries.items():
                by_key.setdefault(k, []).append(e)
        merged = {}
        for k, es in by_key.items():
            worst = max((e.get("_verdict") for e in es if e.get("_verdict")), key=lambda v: -display_rank(v), default=None)
            merged[k] = dict(combine_entries([{f: v for f, v in e.items() if f != "_verdict"} for e in es], k),
                             **({"_verdict": worst} if worst else {}))
        out.append((hw, fam, parts[-1][0], merged, f"{len(parts)} runs: " + ", ".join(n for *_, n in parts)))
    return out


def cmd_baselines_promote(args: argparse.Namespace) -> int:
    """Write the selected cases of a reviewed run (or of proposed baselines; several: independent runs,
    combined) into the baseline folder, through the same locked, validated, atomic merge as
    --baseline-update (update.merge_files)."""
    sources = _combined_sources(args.source)
    all_keys = [k for *_, entries, _ in sources for k in entries]
    where = " ".join(args.source)
    if not all_keys:
        raise CliError(f"{where}: no case with gated metrics to promote")
    check_patterns(args.case, all_keys, where)
    keep = matcher(args.case) if not args.all else (lambda k: True)
    updates, notes, sizes = [], {}, {}
    for hw, fam, fp, entries, note in sources:
        chosen = {k: {f: v for f, v in e.items() if f != "_verdict"} for k, e in entries.items() if keep(k)}
        if not chosen:
            continue
        updates.append((hw, fam, fp, chosen))
        notes[hw, fam] = [f"  ! {k} was {e['_verdict']} in that run: promoting accepts its value"
                          for k, e in sorted(entries.items())
                          if keep(k) and e.get("_verdict") not in (None, Verdict.PASS, Verdict.NEW, Verdict.STALE)]
        sizes[hw, fam] = (len(chosen), note)
    verb = "would promote" if args.dry_run else "promoted"
    for m in merge_files(updates, root=Path(args.baseline_dir), write=not args.dry_run):
        hw, fam = m.doc["hardware_key"], m.doc["family"]
        n, note = sizes[hw, fam]
        print(f"{verb} {n} case{'s' if n != 1 else ''} ({note}) into {m.target}: "
              f"{len(m.changes)} change{'s' if len(m.changes) != 1 else ''}")
        for line in m.changes + notes[hw, fam]:
            print(line)
    return EXIT_OK
