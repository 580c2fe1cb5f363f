"""The transport axis of NCCL allreduce: ids and environments, where a transport can be had (from NVML's
topology record), what NCCL says it chose (its INFO log, committed fixtures), and the check that the
case measured the path its id names."""

from __future__ import annotations

from pathlib import Path

import pytest

from moebench.allreduce import transport
from moebench.allreduce.cases import AllreduceCase
from moebench.allreduce.requirements import skip_reason

DATA = Path(__file__).parent / "data"
NVLINK_PAIR = {"gpus": [0, 1], "interconnect": "nvlink",
               "pairs": {"0-1": {"link": "nvlink", "p2p_read": True, "pcie_common_ancestor": "system"}}}
PCIE_PAIR = {"gpus": [0, 1], "interconnect": "pcie",
             "pairs": {"0-1": {"link": "pcie", "p2p_read": True, "pcie_common_ancestor": "hostbridge"}}}
PCIE_NO_P2P = {"gpus": [0, 1], "interconnect": "pcie",
               "pairs": {"0-1": {"link": "pcie", "p2p_read": False, "pcie_common_ancestor": "system"}}}


def case(**kw) -> AllreduceCase:
    axes = dict(backend="nccl", world=2, variant="", dtype="bf16", hidden=7168, tokens=1, mode="graph") | kw
    return AllreduceCase(**axes)


def test_the_id_group_and_environment_carry_the_transport():
    c = case(transport="pcie")
    assert c.id == "nccl-w2-h7168-t1-bf16-graph-pcie" and c.group == "nccl-w2-pcie"
    assert c.env["NCCL_P2P_DISABLE"] == "1" and c.env["NCCL_NVLS_ENABLE"] == "0"
    assert case(transport="pcie-p2p").env["NCCL_P2P_LEVEL"] == "SYS"
    assert case().id == "nccl-w2-h7168-t1-bf16-graph" and "NCCL_P2P_DISABLE" not in case().env
    with pytest.raises(ValueError, match="unknown transport 'nvme'"):
        case(transport="nvme")
    with pytest.raises(ValueError, match="only the nccl backend"):
        case(backend="vllm_custom_ar", transport="pcie")


@pytest.mark.parametrize("name, topo, reason", [
    ("auto", NVLINK_PAIR, None),
    ("pcie", NVLINK_PAIR, None),  # host memory over PCIe works between any two GPUs
    ("pcie-p2p", NVLINK_PAIR, "GPUs [0, 1] are joined by NVLink (0-1): PCIe peer-to-peer cannot be had here"),
    ("pcie-p2p", PCIE_PAIR, None),
    ("pcie-p2p", PCIE_NO_P2P, "peer access over PCIe is off between GPUs 0-1 (NVML P2P read status)"),
])
def test_where_a_transport_can_be_had(name, topo, reason):
    got = transport.why_not(name, topo, 2)
    assert (got is None) if reason is None else got.startswith(reason)


def test_the_skip_comes_from_this_machines_topology():
    fp = {"gpus": [{"index": 0}, {"index": 1}], "topology": {"pairs": NVLINK_PAIR["pairs"]}}
    assert "joined by NVLink" in skip_reason(case(transport="pcie-p2p"), fp)
    assert skip_reason(case(transport="pcie"), fp) is None
    assert skip_reason(case(transport="pcie"), {"gpus": [{"index": 0}]}) == "needs 2 CUDA GPUs, NVML sees 1 visible here"


@pytest.mark.parametrize("fixture, via, link, summary", [
    ("nccl-info-nvlink.log", ["P2P/CUMEM/read"], ["NVL"], "nvlink-p2p"),
    ("nccl-info-shm.log", ["SHM/direct/direct"], ["SYS"], "shm"),
    ("nccl-info-pcie-p2p.log", ["P2P/direct"], ["PHB"], "pcie-p2p"),
])
def test_what_nccl_chose_is_read_from_its_log(fixture, via, link, summary):
    got = transport.chosen((DATA / fixture).read_text())
    assert got == {"via": via, "link": link, "summary": summary}


def test_no_info_lines_is_unknown_not_a_guess():
    assert transport.chosen("")["summary"] == "unknown"
    assert transport.chosen("NCCL INFO Channel 00/0 : 0[0] -> 1[1] via NET/Socket/0\n")["summary"] == "net"


def test_a_case_whose_nccl_took_another_path_did_not_measure_its_id():
    assert transport.contradiction("pcie", "shm") is None
    assert transport.contradiction("pcie", "unknown") is None
    assert transport.contradiction("pcie", "nvlink-p2p") == \
        "transport pcie asked NCCL to stay off peer-to-peer, but its log says it used nvlink-p2p"
    assert "used shm" in transport.contradiction("pcie-p2p", "shm")
    assert transport.contradiction("auto", "shm") is None
