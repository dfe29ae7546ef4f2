"""The step model's Collectives protocol: every implementation states each
member, and a placement's collectives say its groups' extent as the device
ids of its mesh show it."""

from __future__ import annotations

import numpy as np
import pytest
from planner_cases import AlltoallsByBytes, Recording
from test_nccl_sms import Holding
from test_overlaps import Fixed

from synth.planner import stepmodel
from synth.planner.collectivecosts import CollectiveCosts
from synth.planner.collectives import BareCollectives, Collectives
from synth.planner.pruning import CheapestCollectives, PlacementDependent
from synth.synthesis.placement import enumerate_placements, parse_axes
from synth.synthesis.semantics import Goal
from synth.topology import load_topology

MEMBERS = sorted(name for name in vars(Collectives) if not name.startswith("_"))


def test_the_protocol_names_what_the_step_model_asks():
    assert MEMBERS == ["alltoall", "nodes", "reduce", "send", "size", "sm_share"]


def test_every_implementation_states_every_member():
    topology = load_topology("testbed-2x2x2")
    costs = CollectiveCosts(topology)
    placement = enumerate_placements(topology, parse_axes("ep=4,dp=2"))[0]
    implementations = [costs.on(placement), costs.on(placement, True), CheapestCollectives([costs.on(placement)]),
                       stepmodel._FreeCollectives(), Recording(), AlltoallsByBytes(2), Fixed(), Holding()]
    for collectives in implementations:
        missing = [name for name in MEMBERS if not callable(getattr(type(collectives), name, None))]
        assert not missing, f"{type(collectives).__name__} lacks {missing}"


def test_bare_collectives_hold_no_sms_inside_one_node():
    bare = BareCollectives()
    assert bare.sm_share("dp", Goal.ALLREDUCE, 2**20) == 0.0 and bare.nodes("ep") == 1
    with pytest.raises(NotImplementedError, match="BareCollectives does not say the size of axis 'dp_shard'"):
        bare.size("dp_shard")


def test_the_cheapest_collectives_say_nothing_of_one_placement():
    topology = load_topology("testbed-2x2x2")
    costs = CollectiveCosts(topology)
    cheapest = CheapestCollectives([costs.on(p) for p in enumerate_placements(topology, parse_axes("ep=4,dp=2"))])
    assert cheapest.sm_share("dp", Goal.ALLREDUCE, 2**20) == 0.0
    for ask in (cheapest.nodes, cheapest.size):
        with pytest.raises(PlacementDependent):
            ask("ep")


def _groups(placement, axis: str) -> np.ndarray:
    """The device ids of every group of ``axis``, one row each, from the mesh."""
    mesh = np.moveaxis(placement.mesh, placement.axis_names.index(axis), -1)
    return mesh.reshape(-1, mesh.shape[-1])


@pytest.mark.parametrize("topology_name, axes", [("testbed-2x2x2", "ep=4,dp=2"), ("testbed-4x4", "ep=8,dp=2"),
                                                 ("testbed-2x4", "dp=4,ep=2")])
def test_a_placements_nodes_and_sizes_are_its_mesh_groups(topology_name, axes):
    """Nodes: the distinct innermost-level groups (device id // devices per
    node) among one group's devices; size: a group's devices. HSDP's sub-axes
    of dp are read on the split placement: the shard group inside one node."""
    topology = load_topology(topology_name)
    per_node = topology.counts[-1]
    costs = CollectiveCosts(topology)
    seen = set()
    for placement in enumerate_placements(topology, parse_axes(axes)):
        collectives = costs.on(placement)
        split = costs.hsdp(placement)
        for axis, on in (("ep", placement), ("dp", placement), ("dp_shard", split), ("dp_replicate", split)):
            groups = _groups(on, axis)
            nodes = {len(set((group // per_node).tolist())) for group in groups}
            assert len(nodes) == 1  # every group spans as many nodes
            assert collectives.nodes(axis) == nodes.pop()
            assert collectives.size(axis) == groups.shape[1]
            seen.add((axis, collectives.nodes(axis)))
        assert collectives.nodes("tp") == 1  # not placed
    assert ("dp_shard", 1) in seen and any(axis == "ep" and n > 1 for axis, n in seen)


def test_a_placements_reduction_seconds_and_share_are_one_programs():
    topology = load_topology("dgx-h100").scaled({"node": 2})
    costs = CollectiveCosts(topology)
    placement = enumerate_placements(topology, parse_axes("dp=8,tp=2"))[0]
    for default_only, price in ((False, costs.best), (True, costs.default)):
        collectives = costs.on(placement, default_only)
        for goal in (Goal.ALLREDUCE, Goal.REDUCESCATTER):
            program = price(placement, "dp", goal, 2**26)
            assert collectives.reduce("dp", goal, 2**26) == program.seconds
            assert collectives.sm_share("dp", goal, 2**26) == program.sm_share
            assert 0 < program.sm_share < 1
