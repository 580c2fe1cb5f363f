"""The command-line options the families add to pytest's, in one list: the registry of option adders.

An adder takes the plugin's option group and adds what its family reads (decode: --decode-model,
--decode-instances, ...). The plugin asks this module, so it knows no family: a family adds its options
by adding its adder to ADDERS, the way it adds its tables to moebench.outputs.family_tables.RENDERERS.
"""

from __future__ import annotations

from typing import Any, Callable

from moebench.decode.options import add_decode_options
from moebench.gemm.options import add_gemm_options

Adder = Callable[[Any], None]

ADDERS: tuple[Adder, ...] = (add_decode_options, add_gemm_options)


def add_family_options(group: Any) -> None:
    """Every registered family's options, into pytest's option group for moebench."""
    for add in ADDERS:
        add(group)
