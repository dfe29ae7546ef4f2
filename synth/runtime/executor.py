"""Execute a plan in place on one contiguous buffer per rank: the runtime.

A lowered program says, per step, which groups of global ranks act together and
which chunks each group covers (``docs/plan-schema.md``). :func:`schedule` turns
that into one rank's list of :class:`Call` (collective, group, pieces);
:class:`Executor` maps pieces to element ranges of the caller's buffer, creates
one sub-communicator per distinct group once (cached on the world), and calls
the backend's collectives. Backends live in :mod:`synth.runtime.backends`.

Buffer layout. A buffer of ``n`` elements is cut into ``k`` pieces (``k`` = the
reduction group size) of ``q = ceil(n / k)`` elements: piece ``r`` is elements
``[r*q, (r+1)*q)``, the shard of reduction rank ``r``, and holds the plan's chunk
``chunk_of_rank[r]``. If ``k`` does not divide ``n`` the executor runs on an
internal copy padded with zeros to ``k*q`` elements and copies the first ``n``
back: no element is lost or duplicated. Otherwise it works in the caller's
buffer; only a call whose pieces are not consecutive packs them into a scratch
buffer and unpacks the result.

Collective semantics are those of the numpy reference (:mod:`synth.synthesis.execute`),
exactly, including what stays in place: a ReduceScatter member ``i`` overwrites
only part ``i`` of the covered pieces, a Reduce changes only the root's buffer.

World and communicator interface (duck-typed; see :class:`World`): a world is
one rank's view of all ranks; ``split`` makes the communicators of a set of
disjoint groups; a communicator has ``allreduce(a)``, ``reduce_scatter(a, out)``,
``allgather(a)``, ``reduce(a)`` and ``bcast(a)``, in place on a contiguous array
``a``, sum, root = member 0, ``out`` = this member's part of the sum.

Test hook: ``Executor._runners[i]._ops[(length, dtype)]`` (the prepared steps
of program ``i`` for a buffer length and element type, and its padded copy)
is read by tests/runtime/test_runtime.py to count the scratch memory an
executor holds against :func:`scratch_elements`.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import SynthError
from ..plan import Plan, PlannedProgram, as_plan
from ..synthesis.execute import execute
from ..synthesis.language import Collective
from ..synthesis.lowering import LoweredProgram
from ..synthesis.semantics import Goal
from .watchdog import progressed

Group = tuple[int, ...]
Range = tuple[int, int]


@dataclass(frozen=True)
class Call:
    """One collective a rank takes part in: ``group`` holds global ranks, root
    first, ``member`` is this rank's position in it, ``pieces`` are the buffer
    pieces the step covers, in the order of its chunk list."""

    step: int
    collective: Collective
    group: Group
    member: int
    pieces: tuple[int, ...]

    @property
    def own_pieces(self) -> tuple[int, ...]:
        """Part ``member`` of ``pieces`` cut into ``len(group)`` equal parts: what
        a ReduceScatter leaves summed here, or an AllGather contributes."""
        size = len(self.pieces) // len(self.group)
        return self.pieces[self.member * size : (self.member + 1) * size]

    def byte_ranges(self, piece_bytes: int) -> tuple[Range, ...]:
        """The covered ``[start, stop)`` byte ranges, in operand order."""
        return element_ranges(self.pieces, piece_bytes)


def element_ranges(pieces: Sequence[int], piece_len: int) -> tuple[Range, ...]:
    """``[start, stop)`` ranges of ``pieces`` of ``piece_len`` units each, in the
    given order, with consecutive pieces merged."""
    out: list[Range] = []
    for p in pieces:
        start = p * piece_len
        if out and out[-1][1] == start:
            out[-1] = (out[-1][0], start + piece_len)
        else:
            out.append((start, start + piece_len))
    return tuple(out)


def piece_length(length: int, num_chunks: int) -> int:
    """Elements per piece, ``ceil(length / num_chunks)``."""
    return -(-length // num_chunks)


def schedule(lowered: LoweredProgram, rank: int) -> tuple[Call, ...]:
    """The calls of ``rank``, in step order (steps where it is idle are absent)."""
    piece_of_chunk = np.argsort(lowered.chunk_of_rank)
    calls = []
    for number, step in enumerate(lowered.steps):
        for group, chunks in zip(step.groups, step.chunks):
            if rank in group and chunks:  # an empty chunk list moves nothing: the group is idle
                pieces = tuple(int(piece_of_chunk[c]) for c in chunks)
                calls.append(Call(number, step.collective, group, group.index(rank), pieces))
    return tuple(calls)


def reference(lowered: LoweredProgram, buffers: np.ndarray) -> np.ndarray:
    """What every rank's buffer holds after the program, by the numpy reference
    executor: ``buffers`` has one row per rank; returns new rows."""
    n_ranks, n = buffers.shape
    k = lowered.num_chunks
    q = piece_length(n, k)
    pieces = np.zeros((n_ranks, k * q), dtype=buffers.dtype)
    pieces[:, :n] = buffers
    where = list(lowered.chunk_of_rank)
    chunked = np.empty((n_ranks, k, q), dtype=buffers.dtype)
    chunked[:, where] = pieces.reshape(n_ranks, k, q)  # piece r holds chunk chunk_of_rank[r]
    execute(lowered.steps, chunked)
    return chunked[:, where].reshape(n_ranks, k * q)[:, :n].copy()


# ---------------------------------------------------------------- worlds

# dtype names a backend's collectives sum: MPI on host buffers, and CUDA
# libraries (NCCL; torch.distributed, whose gloo sums all six on CPU too)
HOST_DTYPES = frozenset({"float32", "float64", "int32", "int64"})
GPU_DTYPES = HOST_DTYPES | {"float16", "bfloat16"}


class World:
    """One rank's view of all ranks; backends subclass it.

    Subclasses set ``name``, ``rank``, ``size``, ``xp`` (the array module of
    buffers: numpy or cupy) and ``dtypes`` (supported dtype names), and implement
    ``allgather(obj)`` (every rank's object, in rank order), ``split(groups)``
    (collective over the world: the communicator of this rank's group among the
    disjoint ``groups``, or None), ``barrier()``, ``synchronize()`` (wait for
    queued device work) and ``wtime()`` (seconds). A world whose buffers are not
    numpy-like (torch tensors: :class:`synth.runtime.torch_world.TorchWorld`) overrides
    ``buffer_problem`` and ``dtype_name``; ``launcher`` says how to start N ranks."""

    name = "abstract"
    launcher = "mpiexec -n {ranks}"  # how to start N ranks, for error messages
    rank = 0
    size = 1
    xp: Any = np
    dtypes: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self._communicators: dict[Group, Any] = {}  # every group seen -> comm, or None if not a member

    def allgather(self, obj: Any) -> list[Any]:
        raise NotImplementedError

    def split(self, groups: Sequence[Group]) -> Any:
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait until queued collectives have finished (no-op on host backends)."""

    def wtime(self) -> float:
        raise NotImplementedError

    def dtype_name(self, buffer: Any) -> str:
        """``float32``, ``bfloat16``, ...: the name of the buffer's element type."""
        return buffer.dtype.name

    def buffer_problem(self, buffer: Any) -> str | None:
        """Why this rank's buffer cannot be run (None if it can), without
        communicating: the world's array type, 1-D, contiguous, a supported dtype."""
        if not isinstance(buffer, self.xp.ndarray):
            return f"the {self.name} backend takes {self.xp.__name__} arrays, not {type(buffer).__name__}"
        if buffer.ndim != 1 or not buffer.flags.c_contiguous:
            return "the buffer must be a 1-D contiguous array (use buffer.reshape(-1) on a contiguous tensor)"
        if not getattr(buffer.flags, "writeable", True):  # numpy's flag; cupy arrays are always writable
            return "the buffer is read-only; the program runs in place on it (pass a writable array, e.g. a copy)"
        if not buffer.dtype.isnative:
            return (f"the buffer's byte order ({buffer.dtype.str}) is not this machine's; convert it first, "
                    "e.g. buffer.astype(buffer.dtype.newbyteorder('='))")
        if buffer.dtype.name not in self.dtypes:
            return (
                f"dtype {buffer.dtype.name} is not supported by the {self.name} backend; "
                f"use one of {', '.join(sorted(self.dtypes))}"
            )
        return None

    def agree(self, problem: str | None) -> None:
        """Collective: if any rank has a problem, raise the same SynthError on
        every rank (naming the first rank unless all ranks report the same);
        likewise if some ranks reached another collective (:func:`steps_problem`)."""
        problems = self.allgather(problem)
        progressed()
        mixed = steps_problem(problems)
        if mixed:
            raise SynthError(mixed)
        failed = [(r, p) for r, p in enumerate(problems) if p is not None]
        if not failed:
            return
        rank, first = failed[0]
        if len(failed) == self.size and len({p for _, p in failed}) == 1:
            raise SynthError(first)
        others = f" (and {len(failed) - 1} other rank(s))" if len(failed) > 1 else ""
        raise SynthError(f"rank {rank}: {first}{others}")

    def communicators(self, lowered: LoweredProgram) -> dict[Group, Any]:
        """Collective: this rank's communicator for each of its groups, creating
        each distinct group once per world (one ``split`` per step that brings
        new groups; all ranks decide alike since they hold the same plan)."""
        for step in lowered.steps:
            new = [g for g in step.groups if g not in self._communicators]
            if new:
                comm = self.split(new)
                for g in new:
                    self._communicators[g] = comm if self.rank in g else None
        return {g: c for g, c in self._communicators.items() if c is not None}


def _fingerprint(programs: Sequence[LoweredProgram], ranges: Sequence[tuple[int, int | None]]) -> str:
    """A hash of everything that decides which collectives a rank calls."""
    digest = hashlib.sha256(repr(tuple(ranges)).encode())
    for lowered in programs:
        steps = [(s.collective.value, s.groups, s.chunks) for s in lowered.steps]
        digest.update(repr((lowered.num_devices, lowered.num_chunks, lowered.chunk_of_rank, steps)).encode())
    return digest.hexdigest()


# ---------------------------------------------------------------- executor


def scratch_elements(lowered: LoweredProgram, rank: int, length: int) -> int:
    """Elements an executor allocates for ``rank`` besides the caller's buffer
    of ``length`` elements (cached per length and dtype): the padded work buffer
    when ``k`` does not divide ``length``, a packing buffer for each call whose
    pieces are not consecutive, and the output of each ReduceScatter."""
    k = lowered.num_chunks
    q = piece_length(length, k)
    if not q:
        return 0
    total = k * q if k * q != length else 0
    for call in schedule(lowered, rank):
        if len(element_ranges(call.pieces, q)) > 1:
            total += len(call.pieces) * q
        if call.collective is Collective.REDUCESCATTER:
            total += len(call.own_pieces) * q
    return total


class _Op:
    """A call bound to a communicator and a piece length: element ranges, the
    communicator's method and scratch buffers are fixed once per buffer length
    and dtype, so a call does little more than the collective itself."""

    def __init__(self, call: Call, comm: Any, q: int, xp: Any, dtype: Any) -> None:
        collective = call.collective
        self.ranges = element_ranges(call.pieces, q)
        self.span = slice(*self.ranges[0]) if len(self.ranges) == 1 else None
        self.packed = None if self.span is not None else xp.empty(len(call.pieces) * q, dtype=dtype)
        self.run = {
            Collective.ALLREDUCE: comm.allreduce,
            Collective.REDUCESCATTER: comm.reduce_scatter,
            Collective.ALLGATHER: comm.allgather,
            Collective.REDUCE: comm.reduce,
            Collective.BROADCAST: comm.bcast,
        }[collective]
        # packed operands go back, except where the collective left them unchanged
        self.unpack = self.packed is not None and not (collective is Collective.REDUCE and call.member != 0)
        self.out = None
        if collective is Collective.REDUCESCATTER:
            self.own = element_ranges(call.own_pieces, q)
            self.out = xp.empty(len(call.own_pieces) * q, dtype=dtype)
            self.unpack = False

    def __call__(self, work: Any) -> None:
        if self.span is not None:
            data = work[self.span]
        else:
            data = self.packed
            _copy_ranges(work, self.ranges, data, into_work=False)
        if self.out is None:
            self.run(data)
        else:
            self.run(data, self.out)
            _copy_ranges(work, self.own, self.out, into_work=True)
        if self.unpack:
            _copy_ranges(work, self.ranges, data, into_work=True)


def _copy_ranges(work: Any, ranges: Sequence[Range], flat: Any, into_work: bool) -> None:
    """Copy ``work``'s ranges, concatenated, to ``flat`` or back."""
    offset = 0
    for start, stop in ranges:
        end = offset + stop - start
        if into_work:
            work[start:stop] = flat[offset:end]
        else:
            flat[offset:end] = work[start:stop]
        offset = end


class _Runner:
    """One lowered program bound to a world: this rank's calls, its
    communicators, and the ops per buffer length and dtype."""

    def __init__(self, lowered: LoweredProgram, world: World) -> None:
        self.lowered = lowered
        self.world = world
        self.calls = schedule(lowered, world.rank)
        self._comms = world.communicators(lowered)
        self._ops: dict[tuple[int, Any], tuple[list[_Op], Any]] = {}

    def __call__(self, buffer: Any) -> None:
        progressed()  # for the watchdog (bench --timeout): a program ran on this rank
        n = buffer.shape[0]
        key = (n, buffer.dtype)
        bound = self._ops.get(key)
        if bound is None:
            bound = self._ops[key] = self._bind(n, buffer.dtype)
        ops, padded = bound
        if padded is None:
            for op in ops:
                op(buffer)
            return
        padded[:n] = buffer
        padded[n:] = 0
        for op in ops:
            op(padded)
        buffer[...] = padded[:n]

    def _bind(self, n: int, dtype: Any) -> tuple[list[_Op], Any]:
        """The ops for buffers of ``n`` elements, and the padded work buffer if
        ``k`` does not divide ``n`` (an empty buffer needs no op)."""
        xp = self.world.xp
        k = self.lowered.num_chunks
        q = piece_length(n, k)
        ops = [_Op(c, self._comms[c.group], q, xp, dtype) for c in self.calls] if q else []
        padded = xp.zeros(k * q, dtype=dtype) if k * q != n else None
        return ops, padded


class Executor:
    """A plan bound to a world. Building it is collective over the world
    (checks that every rank holds the same plan for this world size, creates the
    sub-communicators of every program once); so is each call
    ``executor(buffer)``, which runs the program for the buffer's size in place
    on this rank's 1-D contiguous ``buffer``.

    ``plan`` is the path of a plan file, a :class:`~synth.plan.Plan` (with
    ``reduce`` and ``goal`` naming one of its reductions when it holds several)
    or a single lowered program. A path is the way to run a plan under mpiexec
    or torchrun: every rank loads it (:func:`~synth.plan.load_plan` checks
    every stored field against the derivation of the program text) and the
    ranks agree on the outcome, so a missing, corrupted or tampered copy on
    any rank, or a wrong argument on one rank, is the same one-line SynthError
    on every rank, never a hang; then the ranks compare a digest of what they
    were given (the programs and their size ranges, which ``reduce`` and
    ``goal`` select), and a difference is again one error on every rank.
    ``check=True`` (the default) first checks collectively that every rank passes
    a supported, writable, native byte-order buffer of the same length and
    dtype, and raises the same SynthError on every rank otherwise, before any
    rank's buffer changes; ``check=False`` skips that small collective in hot
    loops whose buffers were checked once (every rank must then pass the same
    length, or ranks may pick programs of different size ranges)."""

    def __init__(self, plan: LoweredProgram | Plan | str | os.PathLike, world: World,
                 reduce: str | Sequence[str] | None = None, goal: Goal | str | None = None) -> None:
        programs: tuple[PlannedProgram, ...] = ()
        problem = None
        try:
            if isinstance(plan, LoweredProgram):
                programs = (PlannedProgram(plan),)
            else:
                programs = as_plan(plan).find(reduce, goal).programs
            devices = programs[0].lowered.num_devices
            if world.size != devices:
                problem = (
                    f"the plan is for {devices} ranks but {world.size} were launched; "
                    f"run it with {devices} ranks (e.g. {world.launcher.format(ranks=devices)})"
                )
        except SynthError as exc:
            problem = str(exc)
        except (TypeError, ValueError, AttributeError, KeyError, OSError, MemoryError) as exc:
            # a wrong argument on one rank: still agreed, else the other ranks would wait in agree forever
            problem = f"Executor({type(plan).__name__}, reduce={reduce!r}, goal={goal!r}): {type(exc).__name__}: {exc}"
        world.agree(problem)
        fingerprint = _fingerprint([p.lowered for p in programs], [(p.min_bytes, p.max_bytes) for p in programs])
        fingerprints = world.allgather(fingerprint)
        if len(set(fingerprints)) > 1:
            differ = [r for r, f in enumerate(fingerprints) if f != fingerprints[0]]
            raise SynthError(f"ranks {differ} hold a different plan than rank 0; pass every rank the same plan")
        self.world = world
        self.programs = programs
        self._runners = [_Runner(p.lowered, world) for p in programs]

    @property
    def lowered(self) -> LoweredProgram:
        """The program of a plan with one size range."""
        if len(self._runners) != 1:
            raise SynthError("this executor holds one program per size range; see Executor.program_for")
        return self._runners[0].lowered

    @property
    def calls(self) -> tuple[Call, ...]:
        """This rank's calls (of a plan with one size range)."""
        return schedule(self.lowered, self.world.rank)

    def program_for(self, size_bytes: int) -> LoweredProgram:
        """The program a buffer of ``size_bytes`` bytes runs."""
        return self._runner(size_bytes).lowered

    def _runner(self, size_bytes: int) -> _Runner:
        for program, runner in zip(self.programs, self._runners):
            if program.covers(size_bytes):
                return runner
        raise AssertionError("plan size ranges cover every size")  # checked when the plan was built

    def __call__(self, buffer: Any, check: bool = True) -> None:
        if check:
            self.check(buffer)
        self._runner(buffer.nbytes)(buffer)

    def check(self, buffer: Any) -> None:
        """Collective: every rank passes a supported 1-D contiguous buffer of the
        same length and dtype; else the same SynthError on every rank."""
        world = self.world
        problem = world.buffer_problem(buffer)
        n = int(buffer.shape[0]) if problem is None else None
        dtype = world.dtype_name(buffer) if problem is None else None
        infos = world.allgather((n, dtype, problem))
        problems = [f"rank {r}: {p}" for r, (_, _, p) in enumerate(infos) if p]
        for label, index in (("lengths", 0), ("dtypes", 1)):
            values = {}
            for r, info in enumerate(infos):
                if info[2] is None:
                    values.setdefault(info[index], []).append(r)
            if len(values) > 1:
                listed = "; ".join(f"{v} on {ranks_text(rs)}" for v, rs in values.items())
                problems.append(f"buffer {label} differ across ranks ({listed}); every rank must pass the same")
        if problems:
            raise SynthError("; ".join(problems))


def _step(payload: Any) -> str:
    """Which agreement a gathered payload belongs to: :meth:`World.agree`'s
    (None or a message) or a tagged one, ``(TAG, ...)`` with a readable TAG."""
    if payload is None or isinstance(payload, str):
        return "a setup check"
    if isinstance(payload, tuple) and payload and isinstance(payload[0], str):
        return payload[0]
    return "another collective"


def steps_problem(payloads: Sequence[Any]) -> str | None:
    """If the ranks' payloads of one allgather belong to different agreements
    (ranks given different commands or arguments reach different collectives),
    the message saying so: the same whichever rank computes it."""
    steps: dict[str, list[int]] = {}
    for rank, payload in enumerate(payloads):
        steps.setdefault(_step(payload), []).append(rank)
    if len(steps) == 1:
        return None
    at = "; ".join(f"{ranks_text(ranks)} at {step}" for step, ranks in steps.items())
    return f"the ranks reached different collectives ({at}): give every rank the same command and arguments"


def ranks_text(ranks: Sequence[int]) -> str:
    """``rank 3``, ``ranks 0,1,2`` or ``ranks 0..15 (16 ranks)``, for messages."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + (",".join(map(str, ranks)) if len(ranks) <= 8 else f"{ranks[0]}..{ranks[-1]} ({len(ranks)} ranks)")
