"""Placements: the enumeration against its z3 reference, constraints, mesh and groups."""

import math

import pytest

from synth.errors import SynthError
from synth.synthesis.placement import (
    Placement,
    enumerate_matrices,
    enumerate_matrices_z3,
    enumerate_placements,
    parse_axes,
    parse_constraint,
    parse_reduce,
)
from synth.synthesis.reduction import Reduction
from synth.topology import load_topology


@pytest.mark.parametrize(
    "counts,sizes",
    [
        ((4, 16), (4, 16)),
        ((4, 16), (2, 2, 16)),
        ((4, 16), (64,)),
        ((4, 8), (2, 4, 4)),
        ((2, 4, 2, 4), (4, 4, 4)),
        ((2, 4, 2, 4), (8, 8)),
        ((6, 4), (3, 8)),
        ((12,), (2, 3, 2)),
    ],
)
def test_z3_enumeration_equals_plain_factorisation(counts, sizes):
    z3_found = enumerate_matrices_z3(counts, sizes)
    plain = enumerate_matrices(counts, sizes)
    assert z3_found == plain
    assert len(set(z3_found)) == len(z3_found) > 0
    for m in z3_found:
        assert [math.prod(row[l] for row in m) for l in range(len(counts))] == list(counts)
        assert [math.prod(row) for row in m] == list(sizes)


def test_known_count_p2_a100_two_axes():
    # dp=4 over [node 4, gpu 16]: dp takes 1, 2 or 4 of the node level
    assert enumerate_matrices((4, 16), (4, 16)) == [((1, 4), (4, 4)), ((2, 2), (2, 8)), ((4, 1), (1, 16))]


def test_impossible_products_give_no_matrix():
    assert enumerate_matrices((4, 16), (3, 5)) == []
    assert enumerate_matrices_z3((4, 16), (3, 5)) == []
    # same product, but 3 does not divide any level count
    assert enumerate_matrices((4, 4), (3, 16 // 3 + 1)) == []


def test_constraints_z3_equal_filtered_plain():
    topo = load_topology("rack")
    axes = parse_axes("dp=8,mp=8")
    cons = [parse_constraint("mp@node=1", axes, topo), parse_constraint("dp@gpu<=2", axes, topo),
            parse_constraint("dp@rack>=2", axes, topo)]
    args = (topo.counts, [a.size for a in axes], cons, [a.name for a in axes], topo.level_names)
    found = enumerate_matrices(*args)
    assert found == enumerate_matrices_z3(*args)
    assert found and all(m[1][1] == 1 and m[0][3] <= 2 and m[0][0] >= 2 for m in found)
    unconstrained = enumerate_matrices(topo.counts, [8, 8])
    assert set(found) < set(unconstrained)


def test_unsatisfiable_constraints_give_nothing():
    topo = load_topology("p2-a100")
    axes = parse_axes("dp=4,mp=16")
    cons = [parse_constraint("dp@node=1", axes, topo), parse_constraint("mp@node=1", axes, topo)]
    assert enumerate_placements(topo, axes, cons) == []


def test_constraint_parse_errors():
    topo = load_topology("p2-a100")
    axes = parse_axes("dp=4,mp=16")
    with pytest.raises(SynthError, match="unknown axis 'tp'"):
        parse_constraint("tp@node=1", axes, topo)
    with pytest.raises(SynthError, match="unknown level 'rack'"):
        parse_constraint("dp@rack=1", axes, topo)
    with pytest.raises(SynthError, match="expected AXIS@LEVEL=N"):
        parse_constraint("dp=node", axes, topo)


def test_axes_and_reduce_parsing():
    axes = parse_axes("dp=16, mp=8")
    assert [(a.name, a.size) for a in axes] == [("dp", 16), ("mp", 8)]
    assert parse_reduce(None, axes) == ("dp",)
    assert parse_reduce("mp,dp", axes) == ("dp", "mp")  # declared order
    with pytest.raises(SynthError, match="unknown axis 'pp'"):
        parse_reduce("pp", axes)
    with pytest.raises(SynthError, match="declared twice"):
        parse_axes("dp=2,dp=4")
    with pytest.raises(SynthError, match="expected NAME=SIZE"):
        parse_axes("dp:4")


def _digits_reference(placement, device):
    """Device id -> axis ranks, straight from the documented convention."""
    counts = placement.topology.counts
    m = placement.matrix
    coords = []
    for h in reversed(counts):
        coords.append(device % h)
        device //= h
    coords.reverse()  # level coordinates, outermost first
    ranks = [0] * len(m)
    for l, c in enumerate(coords):
        digits = []
        for a in reversed(range(len(m))):  # last axis fastest inside a level
            digits.append(c % m[a][l])
            c //= m[a][l]
        digits.reverse()
        for a in range(len(m)):
            ranks[a] = ranks[a] * m[a][l] + digits[a]
    return tuple(ranks)


@pytest.mark.parametrize("spec,topo_name", [("dp=4,mp=16", "p2-a100"), ("a=4,b=2,c=8", "rack"), ("x=8,y=4", "p2-v100")])
def test_mesh_follows_documented_digit_order(spec, topo_name):
    topo = load_topology(topo_name)
    axes = parse_axes(spec)
    for placement in enumerate_placements(topo, axes):
        mesh = placement.mesh
        assert mesh.shape == tuple(a.size for a in axes)
        assert sorted(mesh.ravel().tolist()) == list(range(topo.num_devices))
        for device in range(topo.num_devices):
            assert mesh[_digits_reference(placement, device)] == device


def test_reduction_groups_are_mesh_slices_and_synthesis_order():
    topo = load_topology("p2-a100")
    p = Placement(topo, parse_axes("dp=4,mp=16"), ((2, 2), (2, 8)))
    dp = Reduction.of(p, ["dp"])
    groups = dp.reduction_groups
    assert groups.shape == (16, 4)
    for j in range(16):
        assert groups[j].tolist() == p.mesh[:, j].tolist()
    assert (dp.hierarchy.names, dp.hierarchy.sizes) == (("node", "gpu"), (2, 2))
    synth = dp.synthesis_groups
    # synthesis index = (node digit, gpu digit): devices of group 0 by node then gpu
    assert synth[0].tolist() == [0, 8, 32, 40]
    assert [d // 16 for d in synth[0]] == [0, 0, 2, 2]  # first two share a node
    assert sorted(synth[0].tolist()) == sorted(groups[0].tolist())
    both = Reduction.of(p, ["dp", "mp"]).reduction_groups
    assert both.shape == (1, 64) and sorted(both[0].tolist()) == list(range(64))


def test_matrix_must_match_counts_and_sizes():
    topo = load_topology("p2-a100")
    with pytest.raises(SynthError, match="multiplies to"):
        Placement(topo, parse_axes("dp=4,mp=16"), ((2, 2), (4, 4)))
