"""Placement spaces too large to enumerate are refused at once with the cap
named, counted without enumerating them (synth.synthesis.counting); the count
equals a brute-force enumeration on small cases."""

from __future__ import annotations

import itertools
import math

import pytest
from helpers import usage_error

import synth.synthesis.placement as placement
from synth.errors import SynthError
from synth.synthesis.counting import matrix_count
from synth.synthesis.placement import MAX_PLACEMENTS, Constraint


def brute_force(counts, sizes) -> int:
    """Every matrix of divisors of the level counts whose rows multiply to the
    sizes and columns to the counts, tried one by one."""
    divisors = [[d for d in range(1, c + 1) if c % d == 0] for c in counts]
    rows = [[r for r in itertools.product(*divisors) if math.prod(r) == s] for s in sizes]
    return sum(1 for m in itertools.product(*rows)
               if all(math.prod(row[l] for row in m) == c for l, c in enumerate(counts)))


CASES = [((2, 4), (8,)), ((2, 4), (2, 4)), ((4, 4), (2, 2, 4)), ((2, 2, 2), (2, 2, 2)), ((8, 8, 2), (4, 4, 8)),
         ((6, 4), (2, 3, 4)), ((12, 6), (6, 4, 3)), ((2, 2, 2, 2), (4, 2, 2)), ((9, 4), (6, 6)), ((8,), (3, 3))]


@pytest.mark.parametrize("counts, sizes", CASES)
def test_the_count_is_the_number_of_matrices(counts, sizes):
    assert matrix_count(counts, sizes, 10**9) == brute_force(counts, sizes)


def test_the_count_saturates_at_the_cap():
    assert brute_force((2,) * 5, (2,) * 5) == 120
    assert matrix_count((2,) * 5, (2,) * 5, 100) == 101 and matrix_count((2,) * 5, (2,) * 5, 120) == 120
    assert matrix_count((2,) * 18, (2,) * 18, 10**30) == math.factorial(18)


def test_eighteen_axes_on_eighteen_levels_are_refused_at_once(cli, tmp_path):
    levels = "".join(f"  - {{name: l{i}, count: 2, bandwidth_GBps: 10.0, latency_us: 1.0}}\n" for i in range(18))
    path = tmp_path / "t.yaml"
    path.write_text(f"name: eighteen\nlevels:\n{levels}")
    axes = ",".join(f"a{i}=2" for i in range(18))
    assert usage_error(cli, "--topology", path, "--axes", axes) == (
        f"--axes: more than {MAX_PLACEMENTS:,} placements of 18 axes on 18 levels; pin axes to levels with "
        "--constrain (e.g. dp@node=2) or use fewer axes")


def test_a_constrained_space_over_the_cap_is_refused_while_enumerating(monkeypatch):
    monkeypatch.setattr(placement, "MAX_PLACEMENTS", 3)
    names, levels = [f"a{i}" for i in range(4)], [f"l{i}" for i in range(4)]
    pinned = [Constraint("a0", "l0", "=", 2)]  # 3! = 6 placements remain
    with pytest.raises(SynthError, match="more than 3 placements of 4 axes on 4 levels"):
        placement.enumerate_matrices((2,) * 4, (2,) * 4, pinned, names, levels)
    assert len(placement.enumerate_matrices((2,) * 3, (2,) * 3, [Constraint("a0", "l0", "=", 2)], names[:3],
                                            levels[:3])) == 2
