"""What ``tune`` writes from its measurements: the placement of the fastest
correct program at the largest size, on it the fastest correct program of each
measured size, size ranges split between measured sizes (geometric mean),
adjacent equal programs merged; a plan that loads and proves. The measurements
are given (times chosen by the test), so every decision is checked exactly."""

from __future__ import annotations

import math

import pytest

from synth.errors import SynthError
from synth.plan import Plan, PlannedReduction, load_plan, verify_plan, write_plan
from synth.runtime.bench_measure import Timing
from synth.runtime.bench_setup import BenchCandidate
from synth.runtime.bench_tune import size_winners, tuned_ranges
from synth.synthesis.language import parse_program
from synth.synthesis.lowering import lower
from synth.synthesis.placement import Placement, parse_axes
from synth.synthesis.reduction import Reduction
from synth.topology import load_topology

TOPOLOGY = load_topology("testbed-2x4")
DEFAULT = "AllReduce(root, inside)"
BLUECONNECT = "ReduceScatter(node, inside)\nAllReduce(node, parallel(root))\nAllGather(node, inside)"
TREE = "Reduce(node, inside)\nAllReduce(node, master(root))\nBroadcast(node, inside)"
ACROSS = Reduction.of(Placement(TOPOLOGY, parse_axes("dp=4,mp=2"), ((2, 2), (1, 2))), ["dp"])
INSIDE = Reduction.of(Placement(TOPOLOGY, parse_axes("dp=4,mp=2"), ((1, 4), (2, 1))), ["dp"])


def candidate(reduction: Reduction, text: str, index: int) -> BenchCandidate:
    return BenchCandidate(f"{index}/{text[:3]}", index, reduction, lower(parse_program(text), reduction),
                     text == DEFAULT, None)


def timings(table: dict) -> list[Timing]:
    """``{(candidate, size): (median seconds, wrong)}`` as measurements."""
    return [Timing(c, size, size // 4, (t, t, t), wrong) for (c, size), (t, wrong) in table.items()]


def test_winners_come_from_the_placement_that_wins_at_the_largest_size():
    a, b, c = candidate(ACROSS, DEFAULT, 1), candidate(ACROSS, BLUECONNECT, 1), candidate(ACROSS, TREE, 1)
    inside = candidate(INSIDE, DEFAULT, 0)
    table = {(a, 64): (3, 0), (b, 64): (2, 0), (c, 64): (1, 5),       # c is fastest but wrong
             (a, 4096): (2, 0), (b, 4096): (3, 0), (c, 4096): (4, 0),
             (a, 2**20): (9, 0), (b, 2**20): (7, 0), (c, 2**20): (8, 0),
             (inside, 64): (0.5, 0), (inside, 4096): (0.5, 0), (inside, 2**20): (7.5, 0)}
    winners = size_winners(timings(table), [2**20, 64, 4096])
    assert [(m.candidate, m.size_bytes) for m in winners] == [(b, 64), (a, 4096), (b, 2**20)]
    ranges = tuned_ranges(winners)
    first, second = math.isqrt(64 * 4096), math.isqrt(4096 * 2**20)
    assert [(p.min_bytes, p.max_bytes, p.program) for p in ranges] == [
        (0, first, b.lowered.program), (first, second, a.lowered.program), (second, None, b.lowered.program)]
    assert first == 512 and second == 65536


def test_adjacent_equal_programs_merge_and_the_plan_loads_and_proves(tmp_path):
    a, b = candidate(ACROSS, DEFAULT, 1), candidate(ACROSS, BLUECONNECT, 1)
    table = {(a, 64): (2, 0), (b, 64): (1, 0), (a, 4096): (2, 0), (b, 4096): (1, 0), (a, 2**20): (1, 0),
             (b, 2**20): (2, 0)}
    ranges = tuned_ranges(size_winners(timings(table), [64, 4096, 2**20]))
    assert [(p.min_bytes, p.max_bytes, p.program) for p in ranges] == [
        (0, 65536, b.lowered.program), (65536, None, a.lowered.program)]
    path = tmp_path / "tuned.json"
    write_plan(path, Plan(ACROSS.placement, (PlannedReduction(ACROSS, tuple(ranges)),)))
    plan = load_plan(path)
    assert [p.program for p in plan.only.programs] == [b.lowered.program, a.lowered.program]
    assert plan.only.program_for(65535).program == b.lowered.program
    assert plan.only.program_for(65536).program == a.lowered.program
    verify_plan(plan)  # raises if a program does not prove


def test_consecutive_sizes_still_get_their_own_range():
    a, b = candidate(ACROSS, DEFAULT, 1), candidate(ACROSS, BLUECONNECT, 1)
    table = {(a, 8): (1, 0), (b, 8): (2, 0), (a, 9): (2, 0), (b, 9): (1, 0)}
    ranges = tuned_ranges(size_winners(timings(table), [8, 9]))
    assert [(p.min_bytes, p.max_bytes) for p in ranges] == [(0, 9), (9, None)]  # isqrt(72) = 8 would drop size 8


def test_no_correct_program_means_no_plan():
    a = candidate(ACROSS, DEFAULT, 1)
    with pytest.raises(SynthError, match="no program gave correct results at the largest size; no plan written"):
        size_winners(timings({(a, 64): (1, 0), (a, 4096): (1, 3)}), [64, 4096])
    b = candidate(ACROSS, BLUECONNECT, 1)
    with pytest.raises(SynthError, match="no program gave correct results at 64 B; no plan written"):
        size_winners(timings({(a, 64): (1, 2), (b, 64): (1, 1), (a, 4096): (1, 0)}), [64, 4096])
