"""The price of pipelined programs (synth.cost.pipeline): the pipeline
formula against a piece-by-piece schedule, one piece = step by step, and the
level each step loads."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from synth.cost import Model
from synth.cost.model import Algorithm
from synth.cost.pipeline import crossed_level, pipelined_seconds, predict_pipelined
from synth.cost.predict import predict_program
from synth.synthesis.lowering import lower
from synth.synthesis.placement import enumerate_placements, parse_axes
from synth.synthesis.reduction import Reduction
from synth.synthesis.search import synthesize_reduction
from synth.synthesis.semantics import Goal
from synth.topology import load_topology


def _schedule(step_s, levels, pieces):
    """Reference: pieces enter the steps in order; (piece p, step i) starts
    when piece p has left step i - 1 and the level of step i is free, levels
    serving pieces in order and, for one piece, steps in order (a list
    schedule, simulated)."""
    free = {level: 0.0 for level in levels}
    done_prev_piece = [0.0] * len(step_s)
    end = 0.0
    for _ in range(pieces):
        ready = 0.0
        for i, (t, level) in enumerate(zip(step_s, levels)):
            start = max(ready, free[level], done_prev_piece[i])
            ready = free[level] = done_prev_piece[i] = start + t
        end = ready
    return end


@pytest.mark.parametrize("seed", range(5))
def test_one_step_per_level_is_the_textbook_pipeline(seed):
    rng = np.random.default_rng(seed)
    for n, pieces in itertools.product((1, 2, 3, 5), (1, 2, 4, 8)):
        t = [float(x) for x in rng.uniform(0.1, 3.0, size=n)]
        levels = list(range(n))
        assert pipelined_seconds(t, levels, pieces) == pytest.approx(_schedule(t, levels, pieces))
        assert pipelined_seconds(t, levels, pieces) == pytest.approx(sum(t) + (pieces - 1) * max(t))


def test_steps_on_one_level_do_not_overlap():
    """ReduceScatter and AllGather inside the node around a step across
    nodes: the two intra-node steps share their links, so the busiest stage
    is their sum. The price lies between what the links must carry and the
    schedule that finishes each piece before the next takes the node's links."""
    t, levels = [1.0, 0.5, 1.0], [1, 0, 1]
    for pieces in (1, 2, 4, 8):
        price = pipelined_seconds(t, levels, pieces)
        assert price == pytest.approx(2.5 + (pieces - 1) * 2.0)
        assert pieces * 2.0 <= price <= _schedule(t, levels, pieces) + 1e-12  # level 1 carries 2.0 per piece


def test_crossed_level():
    topology = load_topology("testbed-2x4")  # node x2 > rank x4: device d on node d // 4
    assert crossed_level(topology, (0, 4)) == 0
    assert crossed_level(topology, (0, 1, 2, 3)) == 1
    assert crossed_level(topology, (1, 5, 6)) == 0
    deep = load_topology("testbed-2x2x2")
    assert [crossed_level(deep, g) for g in ((0, 1), (0, 2), (0, 4), (3,))] == [2, 1, 0, 2]


def test_one_piece_is_the_step_by_step_ring_price_and_more_pieces_cost_less_at_large_sizes():
    placement = enumerate_placements(load_topology("testbed-2x4"), parse_axes("dp=8"))[0]
    reduction = Reduction.of(placement, "dp", Goal.ALLREDUCE)
    program = next(p for p in synthesize_reduction(reduction, 5).programs if len(p.instructions) == 3)
    lowered = lower(program, reduction)
    size = 1 << 26
    one = predict_pipelined(lowered, reduction, size, 1)
    assert one.pipelined_s == pytest.approx(one.step_by_step_s)
    assert one.step_by_step_s == pytest.approx(predict_program(lowered, reduction, size, Model(Algorithm.RING)))
    four = predict_pipelined(lowered, reduction, size, 4)
    assert four.step_levels == tuple(min(crossed_level(reduction.topology, g) for g in s.groups
                                         if g[0] in set(lowered.reduction_groups[0])) for s in lowered.steps)
    assert four.pipelined_s < one.pipelined_s
    assert four.pipelined_s == pytest.approx(pipelined_seconds(four.piece_step_s, four.step_levels, 4))
