"""A GPU's path to the network (synth.topology.NetworkPath) and the injection
limit it sets (synth.cost.algorithms.rail_lanes): each GPU's network traffic is
capped by its own PCIe link and by the NICs near it. Hand computations for one
GPU with 4 NICs, 8 GPUs with 8 NICs, 8 GPUs with 4 NICs and 8 GPUs with 1 NIC
(TCP), from the PCIe and NIC rates alone."""

from __future__ import annotations

import numpy as np
import pytest

from synth.cost import Algorithm, NetworkProfile, step_cost
from synth.cost.algorithms import rail_lanes
from synth.cost.links import links_of
from synth.errors import SynthError
from synth.synthesis.language import Collective
from synth.topology import topology_from_dict

GiB = 2**30
# PCIe per lane and direction: GT/s x encoding / 8 bits (PCI-SIG)
GEN3_LANE_GBPS, GEN4_LANE_GBPS, GEN5_LANE_GBPS = 8 * 128 / 130 / 8, 16 * 128 / 130 / 8, 32 * 128 / 130 / 8


def node_of(gpus: int, nics: int, nic_GBps: float, gen: int, transport: str = "ib", gpus_per_nic: int | None = None,
            nodes: int = 2):
    net = {"name": "node", "count": nodes, "bandwidth_GBps": nic_GBps, "latency_us": 5.0, "ports": nics,
           "link": "net", "transport": transport, "pcie_gen": gen, "pcie_width": 16}
    if gpus_per_nic is not None:
        net["gpus_per_nic"] = gpus_per_nic
    gpu = {"name": "gpu", "count": gpus, "bandwidth_GBps": 450.0, "latency_us": 1.0, "link": "nvlink"}
    return topology_from_dict({"name": f"{gpus}x{nics}", "levels": [net, gpu]}, "test")


def lanes(topology, members) -> float:
    return float(rail_lanes(links_of(topology), members)[0])


def bytes_term_s(topology, members, size_bytes: float) -> float:
    """Seconds per byte-count ``size_bytes`` of a forced-ring AllReduce over
    ``members``: the difference between 2x and 1x the size (both Simple, all
    channels), so the latency terms cancel."""
    prior = NetworkProfile.prior(topology)
    group = np.array([members])

    def at(n: float) -> float:
        return step_cost(topology, prior, Algorithm.RING, Collective.ALLREDUCE, group, np.array([n]))[0]

    return at(2 * size_bytes) - at(size_bytes)


def test_one_gpu_with_four_nics_moves_at_its_pcie_rate_not_four_nics():
    # 1 GPU, 4 x 100 Gb/s (12.5 GB/s) NICs, the GPU on PCIe Gen 4 x16 (31.5 GB/s): 2.52 NICs' worth
    t = node_of(1, 4, 12.5, gen=4)
    pcie = 16 * GEN4_LANE_GBPS
    assert t.network_path(0).pcie_GBps == pytest.approx(pcie)
    assert lanes(t, (0, 1)) == pytest.approx(pcie / 12.5)
    # a ring of the 2 GPUs: 2 rounds of S/2 each way, each GPU's one flow at its PCIe rate: S / pcie
    assert bytes_term_s(t, (0, 1), GiB) == pytest.approx(GiB / (pcie * 1e9), rel=1e-9)


def test_eight_gpus_with_eight_nics_one_rail_each():
    # 8 GPUs, 8 x 400 Gb/s (50 GB/s), Gen 5 x16 (63 GB/s): the NICs limit, every GPU has its rail
    t = node_of(8, 8, 50.0, gen=5)
    assert t.network_path(0).gpus_per_nic == 1 and t.network_path(0).nics_per_group == 1
    assert lanes(t, tuple(range(16))) == 8  # the whole node: its 8 NICs
    assert lanes(t, (0, 8)) == 1  # one GPU per node: its own NIC (63 GB/s of PCIe > 50)
    assert lanes(t, (0, 1, 8, 9)) == 2
    # one GPU per node: a ring of 2, S at 50 GB/s
    assert bytes_term_s(t, (0, 8), GiB) == pytest.approx(GiB / 50e9, rel=1e-9)


def test_eight_gpus_with_four_nics_two_gpus_behind_each():
    # p4d's shape: 8 GPUs, 4 x 100 Gb/s, two GPUs and one NIC behind each PCIe switch (Gen 4 x16)
    t = node_of(8, 4, 12.5, gen=4, gpus_per_nic=2)
    assert lanes(t, tuple(range(16))) == 4
    assert lanes(t, (0, 1, 8, 9)) == 1  # GPUs 0 and 1 share their switch's one NIC
    assert lanes(t, (0, 1, 2, 3, 8, 9, 10, 11)) == 2
    assert lanes(t, (0, 8)) == 1
    # the two GPUs of a switch in a ring of 4 over 2 nodes: one crossing flow per node on one NIC: 6 rounds of S/4
    # at 12.5 GB/s is the slowest flow's time (NVLink at 450 GB/s inside)
    assert bytes_term_s(t, (0, 1, 8, 9), GiB) == pytest.approx(6 * GiB / 4 / 12.5e9, rel=1e-9)


def test_eight_gpus_behind_one_tcp_nic():
    # 8 GPUs, one 200 Gb/s (25 GB/s) NIC, TCP, GPUs on PCIe Gen 3 x16 (15.75 GB/s): the node shares one NIC,
    # and one GPU alone cannot fill it through its PCIe link
    t = node_of(8, 1, 25.0, gen=3, transport="tcp")
    path = t.network_path(0)
    assert (path.transport, path.gpus_per_nic) == ("tcp", 8)
    pcie = 16 * GEN3_LANE_GBPS
    assert lanes(t, tuple(range(16))) == 1  # 8 GPUs' PCIe links (126 GB/s) > one NIC
    assert lanes(t, (0, 8)) == pytest.approx(pcie / 25.0)
    assert bytes_term_s(t, (0, 8), GiB) == pytest.approx(GiB / (pcie * 1e9), rel=1e-9)
    assert bytes_term_s(t, tuple(range(16)), GiB) == pytest.approx(2 * 15 * GiB / 16 / 25e9, rel=1e-9)


def test_without_the_cap_one_gpu_would_get_every_nic():
    """The limit bites only where the PCIe link is the slower: with Gen 5 x16
    (63 GB/s) the 1-GPU, 4-NIC node's 50 GB/s of NICs is the limit again."""
    t = node_of(1, 4, 12.5, gen=5)
    assert lanes(t, (0, 1)) == 4
    assert bytes_term_s(t, (0, 1), GiB) == pytest.approx(GiB / 50e9, rel=1e-9)


@pytest.mark.parametrize("key, value, message", [
    ("pcie_gen", 7, "'pcie_gen' must be a PCIe generation 1-6"),
    ("pcie_width", 3, "'pcie_width' must be a lane count 1, 2, 4, 8 or 16"),
    ("gpus_per_nic", 0, "'gpus_per_nic' must be an integer >= 1"),
])
def test_bad_path_fields_are_refused_naming_the_field(key, value, message):
    level = {"name": "node", "count": 2, "bandwidth_GBps": 25.0, "latency_us": 5.0, key: value}
    gpu = {"name": "gpu", "count": 8, "bandwidth_GBps": 450.0, "latency_us": 1.0}
    with pytest.raises(SynthError, match=message):
        topology_from_dict({"name": "t", "levels": [level, gpu]}, "t.yaml")
    with pytest.raises(SynthError, match=f"'{key}' must be .* on a level with link: net"):
        topology_from_dict({"name": "t", "levels": [{**level, key: {"pcie_gen": 4, "pcie_width": 16,
                                                                      "gpus_per_nic": 1}[key]}, {**gpu, key: 4}]},
                           "t.yaml")


def test_a_gpu_reaches_every_nic_of_its_pcie_switch_up_to_its_pcie_link():
    """8 GPUs and 8 x 200 Gb/s NICs in two PCIe switch groups of 4 GPUs and 4
    NICs (gpus_per_nic 4): one GPU may spread over its switch's 4 NICs, but its
    Gen 4 x16 link carries 31.5 GB/s, 1.26 NICs' worth; 4 GPUs of one switch
    reach its 4 NICs and no more."""
    t = node_of(8, 8, 25.0, gen=4, gpus_per_nic=4)
    assert t.network_path(0).nics_per_group == 4
    pcie = 16 * GEN4_LANE_GBPS
    assert lanes(t, (0, 8)) == pytest.approx(pcie / 25.0)
    assert lanes(t, (0, 1, 2, 3, 8, 9, 10, 11)) == 4
    assert lanes(t, tuple(range(16))) == 8
