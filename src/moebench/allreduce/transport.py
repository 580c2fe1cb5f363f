"""The transport axis of NCCL allreduce cases, and reading back which transport NCCL chose.

- `auto`: NCCL's own choice (NVLink peer-to-peer on an H200 pair, PCIe peer-to-peer or host memory on a
  PCIe box).
- `pcie`: NCCL kept off NVLink and off peer-to-peer (NCCL_P2P_DISABLE=1): the data goes through host
  memory over PCIe (NCCL's SHM transport), the path of a PCIe box whose GPUs cannot reach each other
  directly. Wherever two GPUs are.
- `pcie-p2p`: peer-to-peer over PCIe at any distance (NCCL_P2P_LEVEL=SYS), the users' RTX PRO 6000 path;
  only where the GPUs are joined by PCIe alone and peer access works (NVML's P2P read status), since on
  an NVLink pair "peer-to-peer" means NVLink.

What NCCL chose is read from its own INFO log (NCCL_DEBUG=INFO, INIT and GRAPH subsystems), lines like
  "NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"   (or SHM/direct/direct, NET/Socket/0)
  "NCCL INFO Pattern 4, crossNic 0, nChannels 24, bw 40.000000/40.000000, type NVL/PIX, sameChannels 1"
Pure Python; the parser takes text, so tests feed it fixtures.
"""

from __future__ import annotations

import re
from typing import Any

TRANSPORTS: dict[str, dict[str, str]] = {
    "auto": {},
    "pcie": {"NCCL_P2P_DISABLE": "1"},
    "pcie-p2p": {"NCCL_P2P_LEVEL": "SYS"},
}
# Set in every NCCL rank's environment (not in the case definition: logging, not behaviour).
LOG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,GRAPH"}

_VIA = re.compile(r"NCCL INFO Channel \d+/\d+ : \d+\[[\w:.]+\] -> \d+\[[\w:.]+\] (?:\[\w+\] )?via (\S+)")
_TYPE = re.compile(r"NCCL INFO Pattern \d+,.*?\btype (\w+)/(\w+)")


def why_not(transport: str, topology: dict[str, Any], world: int) -> str | None:
    """Why this transport cannot be had between the first `world` GPUs (a skip reason), or None.
    `topology` is moebench.allreduce.requirements.ranks_topology()'s record."""
    if transport not in TRANSPORTS:
        raise ValueError(f"unknown transport {transport!r} (known: {', '.join(TRANSPORTS)})")
    if transport != "pcie-p2p":
        return None
    pairs = topology.get("pairs") or {}
    nvlinked = sorted(k for k, p in pairs.items() if p.get("link") == "nvlink")
    if nvlinked:
        return (f"GPUs {topology.get('gpus')} are joined by NVLink ({', '.join(nvlinked)}): PCIe peer-to-peer "
                "cannot be had here (the pcie transport measures PCIe through host memory)")
    blocked = sorted(k for k, p in pairs.items() if not p.get("p2p_read"))
    if blocked:
        return f"peer access over PCIe is off between GPUs {', '.join(blocked)} (NVML P2P read status)"
    if not pairs:
        return f"no GPU pairs among {topology.get('gpus')} to join"
    return None


def chosen(log_text: str) -> dict[str, Any]:
    """What NCCL's INFO log says it used: {'via': sorted channel transports ("P2P/CUMEM/read",
    "SHM/direct/direct"), 'link': the intra-node link type of its graph search ("NVL", "PIX", "SYS", ...),
    'summary': one word (nvlink-p2p, pcie-p2p, shm, net, unknown)}."""
    via = sorted({m.group(1) for m in _VIA.finditer(log_text)})
    links = sorted({m.group(1) for m in _TYPE.finditer(log_text)})
    kinds = {v.split("/")[0] for v in via}
    if kinds == {"P2P"}:
        summary = "nvlink-p2p" if links == ["NVL"] else ("pcie-p2p" if links and "NVL" not in links else "p2p")
    elif kinds == {"SHM"}:
        summary = "shm"
    elif kinds and kinds <= {"NET"}:
        summary = "net"
    elif kinds:
        summary = "mixed: " + ", ".join(sorted(kinds))
    else:
        summary = "unknown"
    return {"via": via, "link": links, "summary": summary}


def contradiction(transport: str, summary: str) -> str | None:
    """Why NCCL's choice contradicts the transport a case asked for (a failure: the case did not measure
    what its id says), or None. An unknown choice (no INFO lines) is not a contradiction."""
    if transport == "pcie" and summary in ("nvlink-p2p", "pcie-p2p", "p2p"):
        return f"transport pcie asked NCCL to stay off peer-to-peer, but its log says it used {summary}"
    if transport == "pcie-p2p" and summary in ("nvlink-p2p", "shm", "net"):
        return f"transport pcie-p2p asked for peer-to-peer over PCIe, but NCCL's log says it used {summary}"
    return None
