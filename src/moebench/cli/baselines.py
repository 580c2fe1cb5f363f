"""`moebench baselines show|diff|promote`: read, compare and (reviewed) update baseline files.

The parser and the other commands live in moebench.cli.main; case patterns, exit codes and CliError come
from moebench.cli.common; numbers and tables from the report layer (moebench.outputs.report).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from moebench.outputs.baseline_lines import change_line, left_out_line, refusal_lines
from moebench.baselines.combine import combine_entries, metrics_left_out
from moebench.baselines.coverage import MIN_MACHINES, MIN_RUNS, Coverage, coverage, shortfall
from moebench.baselines.compare import Verdict, display_rank
from moebench.baselines.diff import Change, diff, loosening
from moebench.baselines.revision import is_revision, load_revision
from moebench.baselines.rules import metric_machines, metric_runs, rule_of
from moebench.baselines.store import entry_fingerprint, load_file
from moebench.baselines.update import merge_files
from moebench.cli.common import EXIT_FOUND, EXIT_OK, CliError, check_patterns, matcher
from moebench.core.hardware import machine_name
from moebench.outputs.report import fmt_pct, fmt_rule, fmt_value, table
from moebench.results.document import ResultsDoc, read_json
from moebench.history.runs import baseline_entries


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


def _documents(spec: str) -> list[tuple[str, dict]]:
    """(where, document) for every baseline file under a path, or under REV:PATH in git."""
    if is_revision(spec):
        return load_revision(spec)
    return [(str(f), load_file(f)) for f in _baseline_files(Path(spec))]


def _entries(spec: str) -> dict[tuple[str, str, str], dict]:
    """(hardware key, family, case key) -> stored entry, over every baseline file under `spec`; the
    entry's machine as words ("machine"), not its fingerprint id."""
    out = {}
    for _, doc in _documents(spec):
        for key, entry in doc["entries"].items():
            view = {k: v for k, v in entry.items() if k != "fingerprint"}
            fp = entry_fingerprint(doc, entry)
            if fp:
                view["machine"] = machine_name(fp)
            out[(doc["hardware_key"], doc["family"], key)] = view
    return out


def _provenance(p: dict) -> str:
    if p.get("kind") == "external":
        return f"external: {p.get('source', '?')} ({p.get('date', '?')[:10]})"
    return f"measured {str(p.get('commit', '?'))[:10]} {str(p.get('date', '?'))[:10]}"


def _machine(fp: dict) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in sorted((fp.get("versions") or {}).items()) if v and k in ("torch", "triton", "vllm", "sglang"))
    driver = f", driver {fp['driver']}" if fp.get("driver") else ""
    return machine_name(fp) + driver + (f"; {versions}" if versions else "")


def _recorded_on(doc: dict, keys: list[str]) -> list[str]:
    """One line per machine the entries `keys` were recorded on, with how many (a file may hold entries of
    several: --baseline-other-hardware files another machine's numbers under this key)."""
    counts: dict[str, int] = {}
    for k in keys:
        fp = entry_fingerprint(doc, doc["entries"][k])
        what = _machine(fp) if fp else "a machine this file does not name"
        counts[what] = counts.get(what, 0) + 1
    return [f"  recorded on {what} ({n} {'entry' if n == 1 else 'entries'})" for what, n in counts.items()]


def _runs(entry: dict, metric: dict) -> str:
    """A metric's independent runs x its machines ("3x1"; its own where it names them, else its entry's);
    "-" for an entry recorded before it said."""
    runs = metric_runs(entry, metric)
    return f"{runs}x{len(metric_machines(entry, metric))}" if runs is not None else "-"


def _coverage_line(c: Coverage) -> str:
    """The file's tally against the bar: "  180 of 206 metrics from 3+ runs on 2+ machines; 26 short: ..."."""
    head = f"  {c.metrics - len(c.short)} of {c.metrics} metrics from {MIN_RUNS}+ runs on {MIN_MACHINES}+ machines"
    if not c.short:
        return head
    parts = [f"{n} {why}" for why, n in c.counts().items() if n]
    return f"{head}; {len(c.short)} short ({', '.join(parts)}: --short lists them)"


def cmd_baselines_show(args: argparse.Namespace) -> int:
    """A table of the entries of baseline files, each file introduced by its header; with args.short, only
    the metrics short of the bar (moebench.baselines.coverage)."""
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
        for line in _recorded_on(doc, keys):
            print(line)
        print(_coverage_line(coverage(doc["entries"], keys)))
        rows = []
        for k in keys:
            e = doc["entries"][k]
            for name, m in sorted(e["metrics"].items()):
                if args.short and shortfall(k, e, name) is None:
                    continue
                between = m.get("noise_machines")
                machines = metric_machines(e, m)  # a metric measured on fewer than its entry: its own
                rows.append([k, name, fmt_value(m["value"], m["unit"]), m["direction"],
                             fmt_pct(100 * m["rel_tol"]), fmt_pct(100 * m["noise"]),
                             fmt_pct(100 * between) if between is not None else "-",
                             str(m["n"]), _runs(e, m), fmt_rule(rule_of(m, len(machines))),
                             _provenance(e["provenance"])])
        print(table(["case", "metric", "value", "better", "rel_tol", "noise", "machines", "n", "runs", "gate",
                     "provenance"], rows, right=(2, 4, 5, 6, 7, 8)))
        print()
    return EXIT_OK


def _machine_list(machines: list[str] | None) -> str:
    """A metric's own `machines` as the diff line shows them ("the entry's" where it names none)."""
    return ", ".join(machines) if machines else "the entry's"


def _machine_medians(old: dict | None, new: dict | None) -> str:
    """A metric's `by_machine` change as the diff line shows it: the machines added, gone and moved, each
    with its median ("+gpu-c 2732, gpu-a 2759 -> 2761"), not the two whole maps."""
    old, new = old or {}, new or {}
    parts = [f"+{g} {fmt_value(new[g]['value'])}" for g in sorted(set(new) - set(old))]
    parts += [f"-{g} {fmt_value(old[g]['value'])}" for g in sorted(set(old) - set(new))]
    parts += [f"{g} {fmt_value(old[g]['value'])} -> {fmt_value(new[g]['value'])} ({old[g]['runs']} -> {new[g]['runs']} runs)"
              for g in sorted(set(old) & set(new)) if old[g] != new[g]]
    return ", ".join(parts)


def _describe(c: Change) -> str:
    """One change as the diff line shows it: 'graph_us 10 -> 11 us (+10.0%)', 'graph_us noise 1.0% -> 50.0%'."""
    if c.field == "value":
        pct = 100 * (c.new - c.old) / c.old if c.old else None
        text = f"{c.metric} {fmt_value(c.old)} -> {fmt_value(c.new)} ({fmt_pct(pct, signed=True)})"
    elif c.field in ("added", "removed"):
        text = f"{c.metric} {c.field}" + (f" {fmt_value(c.new['value'], c.new['unit'])}" if c.new else "")
    elif c.field in ("noise", "rel_tol") and all(isinstance(x, (int, float)) for x in (c.old, c.new)):
        text = f"{c.metric} {c.field} {fmt_pct(100 * c.old)} -> {fmt_pct(100 * c.new)}"
    elif c.field == "machines" and c.metric:  # a metric's own recorders; none named: its entry's stand
        text = f"{c.metric} machines {_machine_list(c.old)} -> {_machine_list(c.new)}"
    elif c.field == "by_machine" and c.metric:
        text = f"{c.metric} machine medians {_machine_medians(c.old, c.new)}"
    elif c.field == "definition_hash":
        text = "case definition changed"
    elif c.field == "provenance":
        text = f"now {_provenance(c.new)}"
    else:
        text = f"{c.metric + ' ' if c.metric else ''}{c.field} {c.old} -> {c.new}"
    return text + (f" [LOOSER: {c.looser}]" if c.looser else "")


def _rules_changed(old: dict, new: dict, cs: list[Change]) -> list[str]:
    """A line per changed metric saying the gate it gets ("    graph_us gate: rel 5% + ... -> rel 3% + ...")."""
    out = []
    for name in sorted({c.metric for c in cs if c.metric and c.field not in ("added", "removed")}):
        was, now = (fmt_rule(rule_of(e["metrics"][name], len(metric_machines(e, e["metrics"][name]))))
                    for e in (old, new))
        out.append(f"    {name} gate: {now}" if was == now else f"    {name} gate: {was} -> {now}")
    return out


def cmd_baselines_diff(args: argparse.Namespace) -> int:
    """Every field that changed between two baseline files or folders (either may be REV:PATH in git),
    entry by entry and metric by metric, with the changes that loosen the gate marked [LOOSER]; with
    --exit-code, exit 1 when there is one (moebench.baselines.diff says which changes loosen)."""
    before, after = _entries(args.a), _entries(args.b)
    changes = diff(before, after)
    counts = {"added": 0, "removed": 0, "changed": 0, "unchanged": 0}
    for (hw, fam, key), cs in changes.items():
        where = f"{hw}/{fam} {key}"
        whole = cs[0].field if cs and cs[0].metric is None and cs[0].field in ("added", "removed") else ""
        if whole == "added":
            ms = ", ".join(f"{n} {fmt_value(m['value'], m['unit'])}" for n, m in sorted(cs[0].new["metrics"].items()))
            print(f"+ {where}: {ms} ({_provenance(cs[0].new['provenance'])})")
        elif whole == "removed":
            print(f"- {where} [LOOSER: {cs[0].looser}]")
        elif cs:
            print(f"~ {where}: " + "; ".join(_describe(c) for c in cs))
            for line in _rules_changed(before[hw, fam, key], after[hw, fam, key], cs):
                print(line)
        counts[whole or ("changed" if cs else "unchanged")] += 1
    looser = loosening(changes)
    n = f"{len(looser)} change{'s' if len(looser) != 1 else ''}"
    print(f"{counts['added']} added, {counts['removed']} removed, {counts['changed']} changed, {counts['unchanged']} "
          f"unchanged; {n} {'loosens' if len(looser) == 1 else 'loosen'} the gate")
    if looser:
        print(f"moebench baselines diff: {n} marked [LOOSER] let a slower measurement pass: each needs a reviewer's "
              "reason")
    return EXIT_FOUND if args.exit_code and looser else EXIT_OK


class PromotionSource(NamedTuple):
    """One file's cases as promote reads them: a results file (a measured run) or a stored one (a proposed
    baseline file, or a baseline file such as the committed one), whose entries may predate a metric."""

    hardware_key: str
    family: str
    fingerprint: dict
    entries: dict[str, dict]  # case key -> entry (a measured run's with its `_verdict` and `_counted`)
    note: str  # "measured in PATH" or "proposed in PATH", for the output
    path: str
    stored: bool


def promotion_source(path: Path) -> list[PromotionSource]:
    """The sources of a results file, a proposed or stored baseline file, or a folder of them
    (--baseline-propose DIR)."""
    if path.is_dir():
        files = sorted(path.glob("*.json")) + sorted(path.glob("*/*.json"))
        if not files:
            raise CliError(f"{path}: no proposed baseline files (<hardware-key>/<family>.json) in this folder")
        return [s for f in files for s in promotion_source(f)]
    doc = read_json(path)
    if isinstance(doc, dict) and "schema_version" in doc:
        doc = load_file(path)  # validated, and read again refusing a key named twice
        # each entry takes the machine it was recorded on along (merge_entries reads it from the entry)
        entries = {k: {**e, "fingerprint": entry_fingerprint(doc, e)} for k, e in doc["entries"].items()}
        return [PromotionSource(doc["hardware_key"], doc["family"], doc["fingerprint"], entries,
                                f"proposed in {path}", str(path), stored=True)]
    run = ResultsDoc.from_json(doc, str(path))
    verdicts = {k: c.verdict for k, c in run.cases.items()}
    # counted: the case's hardware counters were read in this run (a counting recorded); a run without
    # --counters, or one that could not count, says nothing of whether a counter still exists
    counted = {k for k, c in run.cases.items() if "counting" in (c.info.get("counters") or {})}
    return [PromotionSource(run.hardware_key, fam, run.fingerprint,
                            {k: dict(e, _verdict=verdicts[k], _counted=k in counted) for k, e in entries.items()},
                            f"measured in {path}", str(path), stored=False)
            for fam, entries in sorted(baseline_entries(run).items())]


@dataclass
class LeftOut:
    """A metric a promotion left out of some cases of one file: those cases, and the measured runs among
    the sources that did not measure it (combine.metrics_left_out)."""

    cases: list[str] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)


def _combine_cases(parts: list[PromotionSource]) -> tuple[dict[str, dict], dict[str, LeftOut]]:
    """The cases of several sources of one file, each combined over the sources that have it (its verdict
    the worst it had), and the metrics left out of them (metric -> LeftOut)."""
    by_key: dict[str, list[tuple[dict, PromotionSource]]] = {}
    for src in parts:
        for k, e in src.entries.items():
            by_key.setdefault(k, []).append((e, src))
    merged: dict[str, dict] = {}
    left_out: dict[str, LeftOut] = {}
    for k, pairs in by_key.items():
        entries = [{f: v for f, v in e.items() if f not in ("_verdict", "_counted")} for e, _ in pairs]
        stored = [src.stored for _, src in pairs]  # a stored source may predate a metric; a measured run may not
        uncounted = [not src.stored and not e.get("_counted") for e, src in pairs]  # ... unless it did not count
        worst = max((e.get("_verdict") for e, _ in pairs if e.get("_verdict")), key=lambda v: -display_rank(v),
                    default=None)
        merged[k] = dict(combine_entries(entries, k, stored, uncounted), **({"_verdict": worst} if worst else {}))
        for name, lacking in metrics_left_out(entries, stored, k, uncounted).items():
            out = left_out.setdefault(name, LeftOut())
            out.cases.append(k)
            out.runs.extend(pairs[i][1].path for i in lacking if pairs[i][1].path not in out.runs)
    return merged, left_out


def _combined_sources(paths: list[str], selected) -> tuple[list[tuple[str, str, dict, dict, str]],
                                                            dict[tuple[str, str], dict[str, LeftOut]]]:
    """The promotion sources of every path, with each (hardware key, family) merged into one: a case in
    several runs becomes the median of them (combine_entries), its verdict the worst it had; and per
    (hardware key, family) the metrics left out (a measured run among the sources lacked them). Only the
    `selected(key)` cases are combined: a case left out of the promotion cannot stop it (the torch cases of
    a run whose stored entries are of an older definition, when only the Marlin cases are promoted)."""
    groups: dict[tuple[str, str], list[PromotionSource]] = {}
    for p in paths:
        for src in promotion_source(Path(p)):
            chosen = {k: e for k, e in src.entries.items() if selected(k)}
            groups.setdefault((src.hardware_key, src.family), []).append(src._replace(entries=chosen))
    out = []
    left_out: dict[tuple[str, str], dict[str, LeftOut]] = {}
    for (hw, fam), parts in groups.items():
        if len(parts) == 1:
            out.append((hw, fam, parts[0].fingerprint, parts[0].entries, parts[0].note))
            continue
        merged, left_out[hw, fam] = _combine_cases(parts)
        out.append((hw, fam, parts[-1].fingerprint, merged, f"{len(parts)} runs: " + ", ".join(s.note for s in parts)))
    return out, left_out


def cmd_baselines_promote(args: argparse.Namespace) -> int:
    """Write the selected cases of a reviewed run (or of proposed baselines; several: independent runs,
    combined) into the baseline folder, through the same locked, validated, atomic merge as
    --baseline-update (update.merge_files)."""
    where = " ".join(args.source)
    all_keys = [k for p in args.source for src in promotion_source(Path(p)) for k in src.entries]
    if not all_keys:
        raise CliError(f"{where}: no case with gated metrics to promote")
    check_patterns(args.case, all_keys, where)
    keep = matcher(args.case) if not args.all else (lambda k: True)
    sources, left_out = _combined_sources(args.source, keep)
    updates, notes, sizes = [], {}, {}
    for hw, fam, fp, entries, note in sources:
        chosen = {k: {f: v for f, v in e.items() if f not in ("_verdict", "_counted")} for k, e in entries.items() if keep(k)}
        if not chosen:
            continue
        updates.append((hw, fam, fp, chosen))
        notes[hw, fam] = [f"  ! {k} was {e['_verdict']} in that run: promoting accepts its value"
                          for k, e in sorted(entries.items())
                          if keep(k) and e.get("_verdict") not in (None, Verdict.PASS, Verdict.NEW, Verdict.STALE)]
        # said, not silent: a metric a measured run lacked is not stored for those cases
        notes[hw, fam] += [left_out_line(name, lo.cases, lo.runs)
                           for name, lo in sorted(left_out.get((hw, fam), {}).items())]
        sizes[hw, fam] = (len(chosen), note)
    verb = "would promote" if args.dry_run else "promoted"
    merges = merge_files(updates, root=Path(args.baseline_dir), write=not args.dry_run)
    for m in merges:
        hw, fam = m.doc["hardware_key"], m.doc["family"]
        n, note = sizes[hw, fam]
        some = f"{n - len(m.refused)} of " if m.refused else ""
        print(f"{verb} {some}{n} case{'s' if n != 1 else ''} ({note}) into {m.target}: "
              f"{len(m.changes)} change{'s' if len(m.changes) != 1 else ''}")
        for line in [change_line(c) for c in m.changes] + notes[hw, fam] + [change_line(n) for n in m.notes]:
            print(line)
    refusals, refused = refusal_lines(merges)
    for line in refusals:
        print(line, file=sys.stderr)
    # a promotion that left cases out did not do what was asked
    return EXIT_FOUND if refused else EXIT_OK
