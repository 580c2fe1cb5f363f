"""The phrase a counter verdict reads with: which kernel's counter moved most, in words and numbers
("dram read bytes +6.2% in fused_moe_w4_mma (24.8 -> 26.3 MB)"). The gate returns the numbers
(compare.Comparison); the counter metrics' names say counter and kernel (core.ncu_kernels)."""

from __future__ import annotations

from typing import Mapping

from moebench.baselines.compare import Comparison, Verdict
from moebench.core.ncu_kernels import BY_KEY, parse_metric_name
from moebench.outputs.report import fmt_pct

_SCALES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K"))
_UNIT_WORDS = {"B": ("B", "B"), "inst": ("inst", " inst")}  # unit -> (plain, after a prefix)


def scaled_pair(before: float, after: float, unit: str) -> str:
    """Two counts in one scale, 3 significant digits: "24.8 -> 26.3 MB", "1.48 -> 1.52 M inst"."""
    big = max(abs(before), abs(after))
    factor, prefix = next(((f, p) for f, p in _SCALES if big >= f), (1.0, ""))
    plain, prefixed = _UNIT_WORDS.get(unit, (unit, f" {unit}"))
    suffix = f"{prefix}{prefixed}" if prefix else plain
    return f"{before / factor:.3g} -> {after / factor:.3g} {suffix}".rstrip()


def counter_moved_most(comparisons: Mapping[str, Comparison], units: Mapping[str, str]) -> str:
    """The per-kernel counter that grew most (relative to its baseline), among the REGRESSIONs when there
    are any, as one phrase; "" when no per-kernel counter was compared with a baseline."""
    best: tuple[bool, float, str] | None = None
    for name, c in comparisons.items():
        parsed = parse_metric_name(name)
        if parsed is None or parsed[1] is None or parsed[0] not in BY_KEY or not c.baseline or c.worse is None:
            continue
        key, kernel = parsed
        rank = (c.verdict is Verdict.REGRESSION, c.worse)
        if best is None or rank > best[:2]:
            phrase = (f"{BY_KEY[key].label} {fmt_pct(c.delta_pct, signed=True)} in {kernel} "
                      f"({scaled_pair(c.baseline, c.value, units.get(name, BY_KEY[key].unit))})")
            best = (*rank, phrase)
    return best[2] if best else ""
