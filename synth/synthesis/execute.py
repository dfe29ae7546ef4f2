"""In-place execution of lowered programs on numpy buffers: the reference backend.

This models what a collective library does with a contiguous buffer per device,
independently of the search's contributor-set semantics: every device always
has all ``k`` chunks, a collective reads and overwrites only the chunks it
covers, and whatever else is in a buffer (stale partial sums, garbage) stays.
If a program double counts or reads stale data, the sums come out wrong.

Buffers have shape ``(devices, chunks, chunk_len)``. Per step and group, with
``chunks`` its ordered chunk list and ``m`` members (root first), the list is
cut into ``m`` equal parts (part ``i`` belongs to member ``i``):

* AllReduce: every member's ``chunks`` := the sum over members.
* ReduceScatter: member ``i``'s part ``i`` := the sum over members of part ``i``.
* AllGather: member ``i``'s part ``i`` is copied to every member.
* Reduce: the root's ``chunks`` := the sum; Broadcast: the root's ``chunks`` are
  copied to every member.

Every rule reads and writes chunk ``c`` of the members only from chunk ``c``
of the members: chunks never mix. So a run on some of the chunks (buffer
columns for those chunks only) computes exactly what a run on all chunks
computes for them; :func:`check_numerically` uses that to check a sample of
the chunks of a reduction group too large to hold whole.

Test hooks: ``_apply_columns`` (one collective on buffer columns) and
``_apply_tiled`` (its path on a view of the buffers when a step tiles the
devices); tests replace ``_apply_tiled`` to compare the two paths.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

import numpy as np

from ..errors import SynthError
from .language import Collective
from .lowering import LoweredProgram, LoweredStep, Runs, as_runs, check_structure
from .semantics import Goal

#: (device, chunk) slots one check executes at once (each holds ``ceil(length
#: / k)`` elements, 3 by default): the whole system if it fits, else reduction
#: group 0 alone, else a sample of that group's chunks (see :func:`numeric_scope`)
LIMIT = 1 << 20

#: elements per shard in an allgather check (shards are whole chunks: no padding)
ALLGATHER_SHARD = 3

#: a step as the core runs it: the collective and, per group, its members
#: (device ids, root first) and ordered chunk list as runs
RunStep = tuple[Collective, Sequence[tuple[Sequence[int], Runs]]]


def run_steps(steps: Sequence[LoweredStep]) -> list[RunStep]:
    """The steps as :func:`execute_runs` runs them: each chunk list as runs,
    made once per chunk-list object (lowering shares one list among the rows
    of a synthesis group), so that those groups share one runs object too."""
    made: dict[int, tuple[tuple[int, ...], Runs]] = {}  # id of a chunk list -> (the list, kept alive; its runs)

    def runs_of(chunks: tuple[int, ...]) -> Runs:
        seen = made.get(id(chunks))
        if seen is None:
            seen = made[id(chunks)] = (chunks, as_runs(chunks))
        return seen[1]

    return [(s.collective, [(g, runs_of(c)) for g, c in zip(s.groups, s.chunks)]) for s in steps]


def execute(steps: Sequence[LoweredStep], buffers: np.ndarray) -> None:
    """Run ``steps`` in place on ``buffers`` (devices x chunks x chunk_len)."""
    execute_runs(run_steps(steps), buffers)


def execute_runs(steps: Sequence[RunStep], buffers: np.ndarray, sample: np.ndarray | None = None) -> None:
    """Run ``steps`` in place; with ``sample`` (sorted chunk ids), buffer column
    ``j`` holds chunk ``sample[j]`` and only those chunks are computed. The
    groups of a step act at once (they are disjoint), so those with as many
    members are computed together, every (group, column) pair in one array
    operation. Groups that hold the same
    chunk runs (the parallel groups of a step, and the same runs in later
    steps) share one computation of their columns: looked up first by the
    identity of the runs object (a trace shares one object among the groups
    with the same list, :func:`~synth.synthesis.lowering.trace`), so a list
    of thousands of runs met by thousands of groups is not hashed and
    compared per group; then by value, once per distinct object."""
    columns: dict[tuple[Runs, int], tuple[np.ndarray, np.ndarray]] = {}
    # (id of a runs object, members) -> (the object, kept so that its id is not reused; its columns)
    same_object: dict[tuple[int, int], tuple[Runs, tuple[np.ndarray, np.ndarray]]] = {}
    sampled = None if sample is None else sample.tolist()
    for collective, groups in steps:
        # per group size: the groups' members, and per (group, column) pair its column and owner
        alike: dict[int, tuple[list[Sequence[int]], list[np.ndarray], list[np.ndarray]]] = {}
        for members, runs in groups:
            seen = same_object.get((id(runs), len(members)))
            if seen is not None:
                found = seen[1]
            else:
                key = (runs, len(members))
                found = columns.get(key)
                if found is None:
                    if sampled is not None and not samples_in(runs, sampled):
                        found = columns[key] = _NO_COLUMNS  # most groups of a large step hold no sampled chunk
                    else:
                        found = columns[key] = _columns(runs, len(members), sample)
                same_object[id(runs), len(members)] = (runs, found)
            cols, owner = found
            if len(cols):
                same = alike.setdefault(len(members), ([], [], []))
                same[0].append(members)
                same[1].append(cols)
                same[2].append(owner)
        for member_lists, col_lists, owner_lists in alike.values():
            if len({len(c) for c in col_lists}) == 1:  # as many columns each: (groups, members, columns) at once
                _apply_columns(collective, buffers, np.array(member_lists)[:, :, None], np.stack(col_lists)[:, None, :],
                               np.stack(owner_lists)[:, None, :], axis=1)
            else:  # every (group, column) pair at once, members outermost (a member's columns are read in a row)
                which = np.repeat(np.arange(len(member_lists)), [len(c) for c in col_lists])
                _apply_columns(collective, buffers, np.array(member_lists).T[:, which],
                               np.concatenate(col_lists)[None, :], np.concatenate(owner_lists)[None, :], axis=0)


def _apply_columns(collective: Collective, buffers: np.ndarray, members: np.ndarray, cols: np.ndarray,
                   owner: np.ndarray, axis: int) -> None:
    """One collective on buffer columns: ``members`` and ``cols`` broadcast to
    index every member's copy of every column its group acts on, the members
    along ``axis`` (of size 1 in ``cols`` and ``owner``); ``owner``: per
    column, the index along ``axis`` of the member whose part holds it."""
    if axis == 1 and _apply_tiled(collective, buffers, members[:, :, 0], cols[:, 0, :], owner[:, 0, :]):
        return
    every = (members, cols)
    root = np.take(members, [0], axis=axis)
    if collective is Collective.BROADCAST:
        buffers[every] = buffers[root, cols]
        return
    if collective in (Collective.ALLGATHER, Collective.REDUCESCATTER):
        owner = np.take_along_axis(members, owner, axis=axis)  # the members broadcast along the columns
    if collective is Collective.ALLGATHER:
        buffers[every] = buffers[owner, cols]
        return
    total = np.expand_dims(buffers[every].sum(axis=axis), axis)
    if collective is Collective.ALLREDUCE:
        buffers[every] = total
    elif collective is Collective.REDUCE:
        buffers[root, cols] = total
    else:  # ReduceScatter: each column to the member whose part holds it
        buffers[owner, cols] = total


def _apply_tiled(collective: Collective, buffers: np.ndarray, members: np.ndarray, cols: np.ndarray,
                 owner: np.ndarray) -> bool:
    """:func:`_apply_columns` (members along axis 1) as operations on a view of
    ``buffers``, without gathering every (member, column) pair, when the step
    tiles the devices: its (groups, members) array is every device in order,
    ``arange(n)`` reshaped (groups of consecutive devices: the inside groups
    and the innermost parallel ones), and every group acts on the same columns
    with the same owners (sampled chunks that every group holds). Returns
    False, having done nothing, otherwise (strided groups too: writing through
    a transposed view was slower than gathering). The sums are the same
    integers as the gathered path's."""
    g, m = members.shape
    n = g * m
    if n != len(buffers) or not buffers.flags.c_contiguous or (g > 1 and not (
            (cols == cols[:1]).all() and (owner == owner[:1]).all())):
        return False
    if not np.array_equal(members, np.arange(n).reshape(g, m)):
        return False
    tiled = buffers.reshape(g, m, *buffers.shape[1:])
    col, own = cols[0], owner[0]
    every = slice(None) if np.array_equal(col, np.arange(buffers.shape[1])) else col
    if collective is Collective.BROADCAST:
        tiled[:, 1:, every] = tiled[:, :1, every]
    elif collective is Collective.ALLGATHER:
        tiled[:, :, every] = tiled[:, own, col][:, None]
    else:
        total = tiled[:, :, every].sum(axis=1)
        if collective is Collective.ALLREDUCE:
            tiled[:, :, every] = total[:, None]
        elif collective is Collective.REDUCE:
            tiled[:, 0, every] = total
        else:  # ReduceScatter: each column to the member whose part holds it
            tiled[:, own, col] = total
    return True


#: buffers after each prefix of steps run so far, for small checks (the programs
#: of a search share prefixes; the data is the same for the same seed): forgotten
#: all at once past _PREFIX_BYTES
_PREFIXES: dict[tuple, np.ndarray] = {}
_PREFIX_BYTES = 64 << 20
_SMALL_BYTES = 1 << 16


def _run_from_prefix(steps: Sequence[RunStep], buffers: np.ndarray, sample: np.ndarray | None,
                     base: tuple) -> np.ndarray:
    """:func:`execute_runs` of ``steps`` on ``buffers`` (the initial data of
    ``base``), starting from the longest prefix already run when the buffers
    are small; returns the final buffers."""
    if buffers.nbytes > _SMALL_BYTES:
        execute_runs(steps, buffers, sample)
        return buffers
    if len(_PREFIXES) * buffers.nbytes > _PREFIX_BYTES:
        _PREFIXES.clear()
    keys = [base]
    for collective, groups in steps:
        keys.append((keys[-1], collective, tuple((tuple(members), runs) for members, runs in groups)))
    done = next((i for i in range(len(steps), 0, -1) if keys[i] in _PREFIXES), 0)
    if done:
        buffers = _PREFIXES[keys[done]].copy()
    for number in range(done, len(steps)):
        execute_runs(steps[number:number + 1], buffers, sample)
        _PREFIXES[keys[number + 1]] = buffers.copy()
    return buffers


_NO_COLUMNS = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


def samples_in(runs: Runs, sampled: list[int]) -> bool:
    """Whether some chunk of ``sampled`` (sorted) lies in one of ``runs``."""
    for first, stop in runs:
        i = bisect_left(sampled, first)
        if i < len(sampled) and sampled[i] < stop:
            return True
    return False


def _columns(runs: Runs, members: int, sample: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The buffer columns of a group's chunk list and, per column, the member
    whose part holds it (its position in the list divided by the part size);
    every run at once with numpy (an AllGather over many devices lists a run
    per member)."""
    if not runs:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    bounds = np.array(runs, dtype=np.int64).reshape(-1, 2)
    first, stop = bounds[:, 0], bounds[:, 1]
    lengths = stop - first
    part = max(int(lengths.sum()) // members, 1)
    shift = first - (np.cumsum(lengths) - lengths)  # a chunk's position in the list is the chunk minus its run's shift
    if sample is None:
        lo, hi = first, stop
    else:
        lo, hi = np.searchsorted(sample, first), np.searchsorted(sample, stop)
    counts = hi - lo
    cols = np.arange(int(counts.sum())) + np.repeat(lo - (np.cumsum(counts) - counts), counts)
    chunks = cols if sample is None else sample[cols]
    return cols, (chunks - np.repeat(shift, counts)) // part


def numeric_scope(num_devices: int, k: int, groups: int) -> tuple[str, int]:
    """What a numeric check covers within :data:`LIMIT`, and how many chunks of
    each covered group it runs: the whole system, reduction group 0, or a sample
    of group 0's chunks."""
    if num_devices * k <= LIMIT:
        return "whole system", k
    where = f"reduction group 0 of {groups}" if groups > 1 else "the reduction group"
    if k * k <= LIMIT:
        return where, k
    sampled = max(LIMIT // k, 1)
    return f"{where}, {sampled} of its {k} chunks (chunks never mix)", sampled


def check_numerically(lowered: LoweredProgram, length: int | None = None, seed: int = 0) -> int:
    """Run the program on random integer data and compare every output element
    in scope (:func:`numeric_scope`) with the direct reduction computed from
    the reduction groups alone.

    ``length`` is the per-device buffer length (AllReduce, ReduceScatter) or
    shard length (AllGather); the default ``2k+1`` is odd and, for ``k > 1``,
    not a multiple of ``k``, so padding is exercised (allgather:
    :data:`ALLGATHER_SHARD`). Returns the number of elements checked; raises
    SynthError on the first mismatch or if the program is malformed
    (:func:`~synth.synthesis.lowering.check_structure`).
    """
    check_structure(lowered)
    k = lowered.num_chunks
    scope, chunks = numeric_scope(lowered.num_devices, k, len(lowered.reduction_groups))
    rows = np.asarray(lowered.reduction_groups, dtype=np.int64)
    steps = run_steps(lowered.steps)
    if scope != "whole system":
        keep = set(lowered.reduction_groups[0])
        renumber = {d: r for r, d in enumerate(lowered.reduction_groups[0])}
        steps = [(c, [(tuple(renumber[d] for d in g), runs) for g, runs in groups if g[0] in keep])
                 for c, groups in steps]
        rows = np.arange(k)[None, :]
    return check_runs(lowered.goal, rows, lowered.chunk_of_rank, steps, chunks, length, seed)


def _rows_of(buffers: np.ndarray, devices: np.ndarray) -> np.ndarray:
    """``buffers[devices]``, as a view (no copy) when the devices are
    consecutive (a reduction group renumbered to 0..k-1 is): read it, do not
    write it."""
    if len(devices) and devices[-1] - devices[0] == len(devices) - 1 and (np.diff(devices) == 1).all():
        return buffers[devices[0]:devices[-1] + 1]
    return buffers[devices]


def check_runs(goal: Goal, rows: np.ndarray, chunk_of_rank: Sequence[int], steps: Sequence[RunStep],
               chunks: int | None = None, length: int | None = None, seed: int = 0) -> int:
    """:func:`check_numerically` of steps on the devices of ``rows`` (one row
    per reduction group, rank order; devices numbered ``0..rows.size-1``),
    running ``chunks`` of the ``k`` chunks (a seeded sample) or all."""
    groups_n, k = rows.shape
    n = rows.size
    rng = np.random.default_rng(seed)
    where = np.asarray(chunk_of_rank)  # rank -> chunk
    sample = None if chunks is None or chunks >= k else np.sort(rng.choice(k, chunks, replace=False))
    cols = np.arange(k) if sample is None else sample
    rank_of_chunk = np.argsort(where)[cols]  # per column, the rank whose shard it holds
    rank_of = np.empty(n, dtype=np.int64)
    rank_of[rows] = np.arange(k)[None, :]
    if goal is Goal.ALLGATHER:
        q = ALLGATHER_SHARD if length is None else length
        shards = rng.integers(-1000, 1000, size=(n, q), dtype=np.int32)
        buffers = rng.integers(-10**6, 10**6, size=(n, len(cols), q), dtype=np.int32)  # garbage
        own = np.searchsorted(cols, where[rank_of])  # column of each device's own shard, if sampled
        held = (own < len(cols)) & (cols[np.minimum(own, len(cols) - 1)] == where[rank_of])
        buffers[np.flatnonzero(held), own[held]] = shards[held]
        valid = np.ones((len(cols), q), dtype=bool)
    else:
        length = 2 * k + 1 if length is None else length
        q = -(-length // k)
        valid = (rank_of_chunk[:, None] * q + np.arange(q)[None, :]) < length  # beyond length: padding
        buffers = rng.integers(-1000, 1000, size=(n, len(cols), q), dtype=np.int32)  # sums fit: k < 2**21
        buffers[:, ~valid] = 0
        # (groups, columns, q)
        totals = np.stack([_rows_of(buffers, row).sum(axis=0, dtype=np.int64) for row in rows])
    base = (goal, rows.tobytes(), rows.shape, tuple(chunk_of_rank), chunks, length, seed)
    buffers = _run_from_prefix(steps, buffers, sample, base)
    checked = 0
    for g in range(groups_n):  # one reduction group at a time: memory stays one group's
        devices = rows[g]
        if goal is Goal.ALLGATHER:
            want = shards[devices[rank_of_chunk]][None]  # chunk j holds the shard of rank rank_of_chunk[j]
            got = _rows_of(buffers, devices)
            mask = np.broadcast_to(valid, got.shape)
        else:
            total = totals[g]
            if goal is Goal.REDUCESCATTER:  # each device: its own shard only, if sampled
                mine = np.searchsorted(cols, where)  # rank r's chunk column
                present = (mine < len(cols)) & (cols[np.minimum(mine, len(cols) - 1)] == where)
                r = np.flatnonzero(present)
                got = buffers[devices[r], mine[r]][:, None]
                want = total[mine[r]][:, None]
                mask = valid[mine[r]][:, None]
            else:
                got = _rows_of(buffers, devices)
                want = total[None]
                mask = np.broadcast_to(valid, got.shape)
        wrong = (got != want) & mask
        if wrong.any():
            i, j, _ = np.argwhere(wrong)[0]
            if goal is Goal.REDUCESCATTER:
                d, shard = devices[r[i]], int(r[i])
            else:
                d, shard = devices[i], int(rank_of_chunk[j])
            chunk = int(where[shard])
            expected = np.broadcast_to(want, got.shape)[i, j]
            raise SynthError(
                f"numpy reference: device {d} holds a wrong result for shard {shard} "
                f"(chunk {chunk}): expected {expected[:3].tolist()}..., got {got[i, j][:3].tolist()}..."
            )
        checked += int(mask.sum())
    return checked
