"""The search's graph: counting programs without listing them, the k cheapest
programs by k shortest paths (against sorting every program), loads of a given
program, the state budget and the progress hook."""

from __future__ import annotations

import itertools

import pytest

import synth.synthesis.search as search_module
from synth.errors import SynthError
from synth.synthesis.search import clear_cache, search
from synth.synthesis.semantics import Goal


@pytest.mark.parametrize("sizes, steps", [((2, 2), 5), ((2, 3), 4), ((2, 2, 2), 4), ((4,), 5), ((), 3)])
@pytest.mark.parametrize("goal", list(Goal))
def test_count_is_the_number_of_listed_programs(sizes, steps, goal):
    found = search(sizes, goal, steps)
    assert found.count == len(found.indices) == found.stats.programs
    assert len(set(p for p, _ in found.indices)) == len(found.indices)
    for program, loads in found.indices[:50]:
        assert found.path_loads(program) == loads
    assert found.path_loads((10**6,)) is None


def _costs(kind: str):
    """Step costs with many exact ties (kind 'ties'), with rounding that makes
    sums depend on order ('rounding'), or spread ('spread')."""
    if kind == "ties":
        return lambda index, loads: float(index % 3)
    if kind == "rounding":
        return lambda index, loads: [1e16, 1.0, 0.1, 3.0, 1e-3][index % 5] * (1 + sum(loads) % 2)
    return lambda index, loads: ((index * 7919 + sum(loads) * 104729) % 1000) / 997.0


@pytest.mark.parametrize("sizes, steps, goal", [((2, 2), 5, Goal.ALLREDUCE), ((2, 3), 4, Goal.ALLREDUCE),
                                                ((2, 2, 2), 4, Goal.REDUCESCATTER), ((2, 2), 4, Goal.ALLGATHER)])
@pytest.mark.parametrize("kind", ["ties", "rounding", "spread"])
def test_best_is_the_prefix_of_sorting_every_program(sizes, steps, goal, kind):
    """k shortest paths give exactly the first k of every program sorted by
    (cost summed in step order, length, instruction order), the order the
    ranking uses, ties and rounding included."""
    found = search(sizes, goal, steps)
    cost = _costs(kind)
    every = sorted(((sum(cost(i, l) for i, l in zip(p, loads)), len(p), p) for p, loads in found.indices))
    for top in (1, 2, 3, 7, found.count, found.count + 5):
        best = found.best(cost, top)
        assert [(c, p) for c, p, _ in best] == [(c, p) for c, _, p in every[:top]]
    assert found.best(cost, 0) == []


def test_the_state_budget_stops_a_search_that_would_exhaust_memory(monkeypatch):
    clear_cache()
    monkeypatch.setattr(search_module, "STATE_BUDGET", 64 * 20)
    with pytest.raises(SynthError) as exc:
        search((2, 4, 2, 4), Goal.ALLREDUCE, 5)
    assert str(exc.value).startswith("the search on the synthesis hierarchy 2x4x2x4 holds ")
    assert str(exc.value).endswith("--max-steps 5; lower --max-steps")
    clear_cache()


def test_progress_reports_long_searches():
    clear_cache()
    lines: list[str] = []
    search((2, 2, 2, 2), Goal.ALLREDUCE, 5, lines.append)
    assert lines and all(line.startswith("searching 2x2x2x2: step ") for line in lines)
    depths = [int(line.split()[3]) for line in lines]
    assert depths == sorted(depths) and set(depths) <= set(range(1, 6))
    lines.clear()
    search((2, 2, 2, 2), Goal.ALLREDUCE, 5, lines.append)  # memoised: no work, no lines
    assert lines == []


def test_layers_hold_every_program_once():
    found = search((2, 2), Goal.ALLREDUCE, 4)
    paths = set()
    for depth in range(1, 5):
        for goal_state in found.goal_states:
            stack = [(goal_state, depth, ())]
            while stack:
                node, d, suffix = stack.pop()
                if d == 0:
                    if node == 0:
                        paths.add(suffix)
                    continue
                stack.extend((prev, d - 1, (i,) + suffix) for prev, i, _ in found.layers[d].get(node, ()))
    assert paths == {p for p, _ in found.indices}
    assert all(a <= b for a, b in itertools.pairwise(len(p) for p, _ in found.indices))


def test_blas_runs_on_one_thread_during_a_search_and_is_restored_after():
    """The search holds numpy's BLAS to one thread (synth.blas: its threads
    spin between the search's small products) and restores the caller's
    count on every exit, also when the search fails; the caller's limit is
    set to 2 first, so the test does not depend on the machine's cores."""
    import numpy as np
    from threadpoolctl import threadpool_info, threadpool_limits

    from synth.blas import one_blas_thread

    def blas_threads() -> set[int]:
        return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}

    np.ones((2, 2)) @ np.ones((2, 2))  # numpy's BLAS is loaded
    assert blas_threads(), "no BLAS library found to limit"
    seen = []
    real = search_module._search

    def spy(*args):
        seen.append(blas_threads())
        return real(*args)

    with threadpool_limits(2, user_api="blas"):
        assert blas_threads() == {2}
        with one_blas_thread():
            assert blas_threads() == {1}
        assert blas_threads() == {2}
        clear_cache()
        search_module._search, saved = spy, real
        try:
            search((2, 2), Goal.ALLREDUCE, 3)
            search_module._search = lambda *args: seen.append(blas_threads()) or (_ for _ in ()).throw(
                SynthError("search failed"))
            with pytest.raises(SynthError, match="search failed"):
                search((2, 3), Goal.ALLREDUCE, 3)
        finally:
            search_module._search = saved
            clear_cache()
        assert seen == [{1}, {1}]
        assert blas_threads() == {2}


def test_the_cache_registry_holds_and_clears_every_memo():
    """Every LRU memo of the package's imported modules is registered in
    synth.caches (found by looking at the modules' functions, not at the
    registry); clearing one package forgets its memos and keeps the others';
    search.clear_cache forgets the searches and the state spaces."""
    import sys

    from synth import caches
    from synth.cost.predict import clear_caches as clear_cost_caches
    from synth.synthesis.statespace import state_space

    search((2, 2), Goal.ALLREDUCE, 3)
    memos = {f"{name}.{value.__qualname__}": value for name, module in list(sys.modules.items())
             if name.startswith("synth.") and module is not None
             for value in vars(module).values()
             if hasattr(value, "cache_clear") and getattr(value, "__module__", None) == name}
    assert "synth.synthesis.statespace.space.state_space" in memos
    assert set(memos) <= set(caches.registered())
    assert "synth.synthesis.search._SEARCHES" in caches.registered("synth.synthesis")
    assert not [m for m in caches.registered("synth.synthesis") if not m.startswith("synth.synthesis.")]
    assert state_space.cache_info().currsize > 0
    clear_cost_caches()  # the cost stage's memos only
    assert state_space.cache_info().currsize > 0 and search_module._SEARCHES
    caches.clear_caches("synth.synthesis.statespace")
    assert state_space.cache_info().currsize == 0 and search_module._SEARCHES
    search((2, 2), Goal.ALLREDUCE, 3)
    clear_cache()
    assert state_space.cache_info().currsize == 0 and not search_module._SEARCHES
