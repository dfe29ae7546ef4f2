"""The intra-node link graph (synth.linkgraph, synth.cost.rings): parsing, NCCL's view of a sub-group, the links model."""

import copy
import itertools

import numpy as np
import pytest

from synth.cost.links import graph_scale
from synth.cost.model import Algorithm, Model
from synth.cost.nccl import comm_of, ring_graph
from synth.cost.predict import step_cost
from synth.cost.rings import Members, best_ring, rings_at, rings_with_type
from synth.errors import SynthError
from synth.synthesis.language import Collective
from synth.topology import load_topology, topology_from_dict

# the DGX-1 hybrid cube-mesh as p3dn.yaml's comment gives it (nvidia-smi topo -m, NVIDIA/nccl-tests#29)
CUBE_MESH = {(0, 1): 2, (0, 2): 2, (0, 3): 1, (0, 4): 1, (1, 2): 1, (1, 3): 2, (1, 5): 1, (2, 3): 1, (2, 6): 2,
             (3, 7): 2, (4, 5): 2, (4, 6): 2, (4, 7): 1, (5, 6): 1, (5, 7): 2, (6, 7): 1}
NVLINK_SM70 = 20.0  # topo.h SM70_NVLINK_BW


def _doc(graph, gpus=8, **gpu_level):
    level = {"name": "gpu", "count": gpus, "bandwidth_GBps": 150.0, "latency_us": 1.0, "fabric": "ring",
             "link": "nvlink", "nvlinks": 6, "compute_capability": 7.0, "graph": graph}
    level.update(gpu_level)
    return {"name": "t", "levels": [{"name": "node", "count": 2, "bandwidth_GBps": 12.5, "latency_us": 10.0},
                                    level]}


def _mesh_doc():
    return _doc({"kind": "mesh", "pcie_GBps": 12.0, "nvlinks": {f"{a}-{b}": n for (a, b), n in CUBE_MESH.items()}})


def test_p3dn_graph_is_the_transcribed_cube_mesh():
    graph = load_topology("p3dn").levels[-1].graph
    assert graph.kind == "mesh" and graph.pcie_GBps == 12.0
    assert {(a, b): n for a, b, n in graph.nvlinks} == CUBE_MESH
    assert [graph.links_of(g) for g in range(8)] == [6] * 8  # six NVLink 2 ports per V100
    missing = {(a, b) for a, b in itertools.combinations(range(8), 2) if (a, b) not in CUBE_MESH}
    assert missing == {(0, 5), (0, 6), (0, 7), (1, 4), (1, 6), (1, 7), (2, 4), (2, 5), (2, 7), (3, 4), (3, 5), (3, 6)}


def test_topology_round_trips_with_its_graph():
    topo = topology_from_dict(_mesh_doc(), "t.yaml")
    again = topology_from_dict(topo.to_dict(), "again.yaml")
    assert again.levels == topo.levels


def _brute_best_ring(members, pair):
    """Independently: the best over all orders of the smallest consecutive pair bandwidth."""
    best = 0.0
    for order in itertools.permutations(members):
        best = max(best, min(pair(a, b) for a, b in zip(order, order[1:] + order[:1])))
    return best


@pytest.mark.parametrize("members", [(0, 1), (0, 5), (0, 1, 2, 3), (0, 2, 4, 6), (0, 1, 6, 7), (0, 3, 5, 6),
                                     (1, 2, 4, 7), tuple(range(8))])
def test_best_ring_matches_brute_force(members):
    graph = load_topology("p3dn").levels[-1].graph

    def pair(a, b):
        n = CUBE_MESH.get((min(a, b), max(a, b)), 0)
        return n * 25.0 if n else 12.0

    bw, order = best_ring(Members(graph, members, 25.0))
    assert bw == _brute_best_ring(members, pair)
    assert sorted(order) == sorted(members)


def test_subgroup_without_direct_nvlinks_gets_the_lower_bandwidth():
    topo = load_topology("p3dn")
    full = ring_graph(comm_of(topo, tuple(range(8))))
    pcie_pair = ring_graph(comm_of(topo, (0, 7)))  # no NVLink between 0 and 7
    nv2_pair = ring_graph(comm_of(topo, (0, 1)))  # two NVLinks
    assert full.channels * full.bw_intra == 6 * NVLINK_SM70  # the whole node: as without a graph
    assert (pcie_pair.channels, pcie_pair.bw_intra, pcie_pair.path_type) == (1, 12.0, "pci")
    assert nv2_pair.channels * nv2_pair.bw_intra == 2 * NVLINK_SM70 and nv2_pair.path_type == "nvl"
    # 0,1 and 6,7 are NVLink islands joined only by PCIe: the ring crosses PCIe
    assert ring_graph(comm_of(topo, (0, 1, 6, 7))).path_type == "pci"
    assert graph_scale(topo, ((0, 7),)) == pytest.approx(12.0 / 120.0)
    assert graph_scale(topo, ((0, 1),)) == pytest.approx(40.0 / 120.0)
    assert graph_scale(topo, (tuple(range(8)),)) == 1.0


def _brute_rings(members, speed):
    """Independently: the most rings of ``speed`` over direct NVLinks only (path type nvl) that fit, by trying
    every multiset of directed Hamiltonian cycles (first member fixed)."""
    cap = {}
    for (a, b), n in CUBE_MESH.items():
        if a in members and b in members:
            cap[a, b] = cap[b, a] = int((n * NVLINK_SM70 + 1e-3) // speed)
    cycles = []
    for rest in itertools.permutations(members[1:]):
        order = (members[0],) + rest
        edges = list(zip(order, order[1:] + order[:1]))
        if all(cap.get(e, 0) > 0 for e in edges):
            cycles.append(edges)
    best = 0
    for k in range(1, 8):
        found = False
        for combo in itertools.combinations_with_replacement(range(len(cycles)), k):
            use = {}
            for c in combo:
                for e in cycles[c]:
                    use[e] = use.get(e, 0) + 1
            if all(use[e] <= cap[e] for e in use):
                found = True
                break
        if not found:
            break
        best = k
    return best


@pytest.mark.parametrize("members,speed", [((0, 1, 2, 3), 20.0), ((0, 1, 2, 3), 40.0), ((0, 1, 3, 2), 18.0),
                                           ((0, 1, 4, 5), 20.0), ((0, 1), 40.0), ((0, 1), 20.0)])
def test_rings_at_matches_brute_force(members, speed):
    graph = load_topology("p3dn").levels[-1].graph
    local = tuple(sorted(members))
    assert rings_at(Members(graph, local, NVLINK_SM70), speed, "nvl", 32) == _brute_rings(local, speed)


def test_nvb_paths_through_a_member_come_before_pcie():
    graph = load_topology("p3dn").levels[-1].graph
    members = Members(graph, (0, 2, 4, 6), NVLINK_SM70)
    assert members.path(0, 6) == ("nvb", 40.0)  # 0-2-6, both NV2
    assert members.path(2, 4) == ("nvb", 40.0)  # 2-6-4
    assert Members(graph, (0, 6), NVLINK_SM70).path(0, 6) == ("pci", 12.0)  # GPU 2 is not in the group
    assert rings_with_type(members, 40.0, 32)[1] == "nvb"


def test_nvswitch_subgroups_keep_the_full_rate():
    doc = _doc({"kind": "nvswitch"}, fabric="switch", nvlinks=12, compute_capability=8.0)
    with_graph = topology_from_dict(doc, "t.yaml")
    del doc["levels"][1]["graph"]
    without = topology_from_dict(doc, "t.yaml")
    for members in [(0, 1), (0, 7), (0, 2, 5), tuple(range(8))]:
        assert ring_graph(comm_of(with_graph, members)) == ring_graph(comm_of(without, members))
        assert graph_scale(with_graph, (members,)) == 1.0
        groups, nbytes = np.array([members]), np.array([1e8])
        model = Model(Algorithm.NCCL)
        assert (step_cost(with_graph, model.profile_for(with_graph), Algorithm.NCCL, Collective.ALLREDUCE, groups,
                          nbytes)[0]
                == step_cost(without, model.profile_for(without), Algorithm.NCCL, Collective.ALLREDUCE, groups,
                             nbytes)[0])


def test_step_cost_of_a_pcie_pair_is_slower_than_an_nvlink_pair():
    topo = load_topology("p3dn")
    model = Model(Algorithm.NCCL)
    profile = model.profile_for(topo)

    def cost(members):
        return step_cost(topo, profile, Algorithm.NCCL, Collective.ALLREDUCE, np.array([members]), np.array([1e8]))[0]

    assert cost((0, 7)) > 2 * cost((0, 1))
    # concurrent pairs on disjoint NVLinks do not slow each other (the slowest of alike pairs)
    pairs = np.array([(0, 1), (2, 6), (4, 5), (3, 7)])  # all NV2
    both = step_cost(topo, profile, Algorithm.NCCL, Collective.ALLREDUCE, pairs, np.full(4, 1e8))[0]
    assert both == pytest.approx(cost((0, 1)))


@pytest.mark.parametrize("change,message", [
    (lambda g: g["nvlinks"].update({"0-8": 1}), "GPU 8 is not in the node"),
    (lambda g: g["nvlinks"].update({"3-3": 1}), "joins a GPU to itself"),
    (lambda g: g["nvlinks"].update({"1-0": 1}), "1-0 has 1 links but 0-1 has 2"),
    (lambda g: g["nvlinks"].update({"0-5": 0}), "must have a whole number of NVLinks >= 1"),
    (lambda g: g["nvlinks"].update({"0-5": -1}), "must have a whole number of NVLinks >= 1"),
    (lambda g: g["nvlinks"].update({"0_5": 1}), "is not a GPU pair"),
    (lambda g: g.update({"pcie_GBps": -3.0}), "'pcie_GBps' must be a positive number"),
    (lambda g: g.pop("pcie_GBps"), "kind mesh needs 'pcie_GBps'"),
    (lambda g: g.update({"kind": "torus"}), "'kind' must be one of nvswitch, mesh, pcie"),
    (lambda g: g.update({"speed": 1}), "unknown key 'speed'"),
    (lambda g: g["nvlinks"].update({"0-5": 1}), "GPU 0 has 7 NVLinks in 'nvlinks' but the level says nvlinks: 6"),
])
def test_graph_errors_name_the_field_and_the_fix(change, message):
    doc = _mesh_doc()
    graph = copy.deepcopy(doc["levels"][1]["graph"])
    change(graph)
    doc["levels"][1]["graph"] = graph
    with pytest.raises(SynthError, match="levels\\[1\\] \\(gpu\\): graph") as err:
        topology_from_dict(doc, "t.yaml")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_graph_placement_errors():
    doc = _mesh_doc()
    doc["levels"][0]["graph"] = {"kind": "nvswitch"}
    with pytest.raises(SynthError, match="give it on the innermost level"):
        topology_from_dict(doc, "t.yaml")
    with pytest.raises(SynthError, match="graph kind pcie .* needs link: pcie"):
        topology_from_dict(_doc({"kind": "pcie", "pcie_GBps": 12.0}), "t.yaml")
    with pytest.raises(SynthError, match="graph kind nvswitch needs fabric: switch"):
        topology_from_dict(_doc({"kind": "nvswitch"}), "t.yaml")
