"""Reading sm_90a SASS (cuobjdump -sass) of the int4 tensor-core kernel: its instructions, and what a program's
warps execute per warp (test_planted_counters.py's model of ncu's sm__inst_executed, test_w4_prefetch.py's
prefetch count)."""

from __future__ import annotations

import re
from fractions import Fraction


def sass(text: str) -> list[tuple[int, str]]:
    """(address, instruction) of the kernel up to its last EXIT (what follows is padding), predicates kept."""
    ins = [(int(m.group(1), 16), m.group(2).strip()) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", text)]
    last = max(i for i, (_, t) in enumerate(ins) if t == "EXIT")
    return ins[:last + 1]


def counts(ins: list[tuple[int, str]], trips: int, warps: int) -> dict:
    """Warp instructions (and global loads, and their bytes a thread) a program's warps execute, per warp.

    The kernel's SASS is straight-line but for the K loop's back edge (`@P BRA` to an earlier address: the
    loop body runs `trips` times; no loop when trips = 0) and one predicated EXIT before the output store: the
    warps without output rows leave there, and the rest (one warp a program) run the store and the final
    EXIT. A predicated-off instruction is executed all the same (ncu counts it)."""
    text = [t for _, t in ins]
    branches = [i for i, t in enumerate(text) if re.search(r"\b(BRA|BRX|JMP|JMX|CALL|RET|BSSY)\b", t)]
    pexit = [i for i, t in enumerate(text) if re.fullmatch(r"@!?P\d+ EXIT", t)]
    assert len(pexit) == 1 and len(branches) == (1 if trips else 0), (branches, pexit)
    weight = [Fraction(1)] * len(ins)
    if trips:
        back = branches[0]
        target = int(text[back].split()[-1], 16)
        start = next(i for i, (a, _) in enumerate(ins) if a == target)
        assert start < back
        weight[start:back + 1] = [Fraction(trips)] * (back + 1 - start)
    weight[pexit[0] + 1:] = [Fraction(1, warps)] * (len(ins) - pexit[0] - 1)
    op = [re.sub(r"^@!?U?P\w+\s+", "", t).split()[0] for t in text]  # the opcode: LDG.E.64 (not R2.64)
    width = {"LDG.E": 4, "LDG.E.64": 8, "LDG.E.128": 16}
    loads = [i for i, o in enumerate(op) if o.startswith("LDG")]
    assert {op[i] for i in loads} <= set(width), {op[i] for i in loads}
    return dict(inst=sum(weight), loads=sum(weight[i] for i in loads),
                load_bytes=sum(weight[i] * width[op[i]] for i in loads))


