"""What ``tune`` makes of its measurements: a plan with one program per range
of sizes (:func:`size_winners`, :func:`tuned_ranges`), proved before it is
written.

For example, measured at 1 MiB and 16 MiB with winners ``A`` and ``B`` on the
placement of the fastest correct program at 16 MiB, the plan runs ``A`` below
4 MiB (the geometric mean of the two sizes) and ``B`` from there on; with the
same winner at both sizes, one range covers every size.
"""

from __future__ import annotations

import math
from typing import Sequence

from ..errors import SynthError
from ..plan import Plan, PlannedProgram, PlannedReduction, one_chunk_layout, write_plan
from ..synthesis.language import format_program
from ..synthesis.verify import verify_lowered
from ..units import format_size
from .bench_measure import Timing
from .bench_setup import BenchRequest, collectively, set_key
from .executor import World


def _range_bounds(sizes: Sequence[int]) -> list[int]:
    """Where the size ranges of a tuned plan meet: between consecutive measured
    sizes, at their geometric mean (rounded down, above the smaller size)."""
    return [max(math.isqrt(a * b), a + 1) for a, b in zip(sizes, sizes[1:])]


def size_winners(timings: Sequence[Timing], sizes: Sequence[int]) -> list[Timing]:
    """What ``tune`` chooses, per measured size in increasing order: on the
    placement (and reduction) of the fastest correct program at the largest
    size, the fastest correct program of that size. Every rank computes the same
    from the gathered times."""
    sizes = sorted(set(sizes))
    correct = [m for m in timings if m.wrong == 0]
    largest = [m for m in correct if m.size_bytes == sizes[-1]]
    if not largest:
        raise SynthError("no program gave correct results at the largest size; no plan written")
    group = set_key(min(largest, key=lambda m: m.median_s).candidate)
    winners = []
    for size in sizes:
        here = [m for m in correct if m.size_bytes == size and set_key(m.candidate) == group]
        if not here:
            raise SynthError(f"no program gave correct results at {format_size(size)}; no plan written")
        winners.append(min(here, key=lambda m: m.median_s))
    return winners


def tuned_ranges(winners: Sequence[Timing]) -> list[PlannedProgram]:
    """The size ranges of a tuned plan: the winner of size ``s`` runs from the
    previous bound to the bound between ``s`` and the next measured size
    (:func:`_range_bounds`); the first range starts at 0, the last is unbounded;
    adjacent ranges with the same program are merged."""
    bounds = [0, *_range_bounds([m.size_bytes for m in winners]), None]
    ranges: list[PlannedProgram] = []
    for m, low, high in zip(winners, bounds, bounds[1:]):
        if ranges and ranges[-1].program == m.candidate.lowered.program:
            ranges[-1] = PlannedProgram(ranges[-1].lowered, ranges[-1].min_bytes, high)
        else:
            ranges.append(PlannedProgram(m.candidate.lowered, low, high))
    return ranges


def write_tuned(request: BenchRequest, world: World, timings: Sequence[Timing], sizes: Sequence[int]) -> None:
    """Collective: rank 0 writes the tuned plan to ``request.out`` (every
    program proved first); then the winners and the plan's ranges are printed."""
    winners = size_winners(timings, sizes)
    reduction = winners[0].candidate.reduction
    programs = tuned_ranges(winners)

    def write() -> None:
        if world.rank == 0:
            for p in programs:
                verify_lowered(p.lowered)  # never write an unproved plan
            write_plan(request.out, Plan(reduction.placement,
                                         (PlannedReduction(reduction, one_chunk_layout(programs)),)))

    collectively(world, write)
    defaults = {(set_key(m.candidate), m.size_bytes): m.median_s for m in timings if m.candidate.is_default}
    print("#")
    for m in winners:
        c = m.candidate
        default = defaults.get((set_key(c), m.size_bytes))
        speedup = f", {default / m.median_s:.2f}x the default" if default else ""
        print(f"# winner at {format_size(m.size_bytes)}: {c.label} {format_program(c.lowered.program, ' ; ')} "
              f"({m.median_s * 1e6:.1f} us{speedup})")
    for p in programs:
        upper = "" if p.max_bytes is None else f" < {p.max_bytes}"
        print(f"# plan: {p.min_bytes} <= bytes{upper}: {format_program(p.program, ' ; ')}")
    print(f"wrote plan -> {request.out}")
