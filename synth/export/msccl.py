"""Compile a verified program to an MSCCL algorithm XML: the file the MSCCL
executor build of NCCL (Azure/msccl-executor-nccl) loads from ``MSCCL_ALGO_DIR``.

Format and semantics followed: msccl-executor-nccl at commit c6f6b36d
(2024-12-13), ``src/misc/msccl/msccl_parser.cc`` (the reader: one start tag per
line, double-quoted values, no XML declaration, ``<algo>`` first),
``src/include/msccl/msccl_struct.h`` (limits: 64 steps and 32 thread blocks per
channel, ``cnt`` < 72, dependency ids < 128) and ``src/device/msccl_kernel.cu``
(step types; a thread block with ``send=B, chan=c`` and the one on rank B with
``recv=A, chan=c`` share one in-order connection). docs/nccl-programs.md has the
details; :mod:`synth.export.msccl_check` checks every file this module writes,
without sharing its code.

Lowering. The program is taken in rank coordinates (:func:`group_runs`: rank
``r`` = the ``r``-th member of every reduction group placed alike, so ``ngpus``
is the group size and one file serves every group). Each of the ``k`` chunks is
cut into ``pieces`` sub-chunks (``nchunksperloop = k x pieces``; a plan's
export takes the count :mod:`synth.cost.pipeline` prices cheapest). Each step runs
on its groups as a ring in member order, one thread block per member and step
on channel = step index: ReduceScatter ``s, rrs..., rrc``; AllGather ``s,
rcs..., r``; AllReduce ``s, rrs..., rrcs, rcs..., r``; Reduce and Broadcast as a
chain ending (starting) at the root. A thread block handles one piece through
all its rounds before the next piece, and waits (``depid``/``deps``) only for
the steps of other thread blocks that last wrote or read the memory it touches:
so a piece enters step t+1 as soon as step t has produced it (pipelining across
steps), while the step-t block goes on with the next piece.

Buffers. AllReduce works in ``o`` (reads ``i`` until a chunk is first written,
then ``o``), valid in place (``i`` = ``o``) and out of place. ReduceScatter
keeps partial sums of chunks it does not own in scratch and writes its own
shard into ``o``; AllGather writes into ``o`` and copies its own shard from
``i``. Hazards are tracked on memory cells with the in-place aliases merged
(AllReduce ``o[x]`` = ``i[x]``; ReduceScatter ``o[p]`` = ``i[r P + p]``;
AllGather ``i[p]`` = ``o[r P + p]``), so each file is valid in both modes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..cost import Model
from ..errors import SynthError
from ..runtime.pipelined import Op, Schedule, Stream
from ..synthesis.language import Collective, Program
from ..synthesis.lowering import LoweredProgram, expand, group_runs
from ..synthesis.reduction import Reduction
from ..synthesis.semantics import Goal
from .msccl_cost import FilePrice, FilePricer, group_comm, layouts, protocol_ranges, ring_protocol
from .msccl_flow import NCCL_STEPS, SLICES_PER_PIECE, SLOTS_PER_SLICE, max_allowed_count

# limits of msccl-executor-nccl (msccl_struct.h; MSCCL_MAX_NUM_STEPS is its build default)
MAX_STEPS_PER_TB = 64
MAX_COUNT = 71  # cnt < MSCCL_MAX_COUNT (72)
MAX_CHANNELS = 32
MAX_DEPENDENCY_TB = 127
PROTOCOLS = ("Simple", "LL128", "LL")
COLLECTIVE_NAMES = {goal: goal.value for goal in Goal}  # MSCCL's coll names are the goals' names
PIECES_TRIED = (8, 4, 2, 1)
INSTANCES_TRIED = (1, 2, 4, 8)
ELEMENT_BYTES = 4  # the widest common element (float32): a count it divides, it divides for 2- and 1-byte types too  # channels per step the export prices (pieces dealt over them)


@dataclass
class XmlStep:
    type: str
    srcbuf: str = "i"
    srcoff: int = -1
    dstbuf: str = "o"
    dstoff: int = -1
    cnt: int = 0
    depid: int = -1
    deps: int = -1
    hasdep: int = 0


@dataclass
class ThreadBlock:
    id: int
    send: int
    recv: int
    chan: int
    steps: list[XmlStep] = field(default_factory=list)


@dataclass(frozen=True)
class MscclAlgorithm:
    """One MSCCL algorithm: the ``<algo>`` attributes and, per gpu, its
    ``(i_chunks, o_chunks, s_chunks)`` and thread blocks."""

    name: str
    proto: str
    nchannels: int
    nchunksperloop: int
    ngpus: int
    coll: str
    inplace: int
    outofplace: int
    min_bytes: int
    max_bytes: int  # inclusive; 0: unbounded
    chunks: tuple[tuple[int, int, int], ...]
    thread_blocks: tuple[tuple[ThreadBlock, ...], ...]
    pieces: int
    instances: int = 1  # channels per step

    def xml(self) -> str:
        """The file, as the executor's reader takes it (see the module
        docstring), after one comment line per loading condition
        (:func:`loading_notes`; the reader skips comments)."""
        lines = [f"<!-- {note} -->" for note in loading_notes(self.coll, self.ngpus, self.nchunksperloop)]
        lines += [f'<algo name="{self.name}" proto="{self.proto}" nchannels="{self.nchannels}" '
                 f'nchunksperloop="{self.nchunksperloop}" ngpus="{self.ngpus}" coll="{self.coll}" '
                 f'inplace="{self.inplace}" outofplace="{self.outofplace}" minBytes="{self.min_bytes}" '
                 f'maxBytes="{self.max_bytes}">']
        for gpu, ((i, o, s), tbs) in enumerate(zip(self.chunks, self.thread_blocks)):
            lines.append(f'  <gpu id="{gpu}" i_chunks="{i}" o_chunks="{o}" s_chunks="{s}">')
            for tb in tbs:
                lines.append(f'    <tb id="{tb.id}" send="{tb.send}" recv="{tb.recv}" chan="{tb.chan}">')
                for n, st in enumerate(tb.steps):
                    lines.append(f'      <step s="{n}" type="{st.type}" srcbuf="{st.srcbuf}" srcoff="{st.srcoff}" '
                                 f'dstbuf="{st.dstbuf}" dstoff="{st.dstoff}" cnt="{st.cnt}" depid="{st.depid}" '
                                 f'deps="{st.deps}" hasdep="{st.hasdep}"/>')
                lines.append("    </tb>")
            lines.append("  </gpu>")
        lines.append("</algo>")
        return "\n".join(lines) + "\n"


def loading_notes(coll: str, ngpus: int, nchunksperloop: int) -> tuple[str, ...]:
    """What a call needs for the executor to run this file rather than NCCL's
    own algorithm, and what is safe to run beside it (msccl-executor-nccl
    c6f6b36d: msccl_lifecycle.cc:309-311 and 332-339, msccl_status.cc:10,
    msccl_kernel.cu:203-206 and 233-234)."""
    multiple = "the element count x ngpus" if coll in ("allgather", "reducescatter") else "the element count"
    notes = [f"synth-reduce: {coll} on {ngpus} ranks. Selected only when {multiple} is a multiple of "
             f"{nchunksperloop} (nchunksperloop); any other count runs NCCL's own algorithm.",
             "Sum, prod, min and max only: the executor leaves ncclAvg to NCCL. For an average, call a sum and "
             f"scale by 1/{ngpus} before or after it (as PyTorch DDP divides gradients before its sum).",
             "One MSCCL collective at a time per process: the executor keeps one set of thread-block flags per "
             "process, so two MSCCL kernels running at once (two communicators on two streams) may hang."]
    if coll not in ("allreduce", "allgather", "reducescatter"):
        notes = notes[:1]
    return tuple(notes)


def _ring_ops(collective: Collective, g: int, i: int) -> list[tuple[str, int]]:
    """Member ``i``'s operations in a ring of ``g`` (sends to ``i + 1``,
    receives from ``i - 1``): ``(type, part)``, part -1 = the whole list."""
    if collective is Collective.REDUCESCATTER:
        return [("s", (i - 1) % g)] + [("rrs", (i - 1 - r) % g) for r in range(1, g - 1)] + [("rrc", i)]
    if collective is Collective.ALLGATHER:
        return [("s", i)] + [("rcs", (i - r) % g) for r in range(1, g - 1)] + [("r", (i + 1) % g)]
    if collective is Collective.ALLREDUCE:
        return ([("s", (i - 1) % g)] + [("rrs", (i - 1 - r) % g) for r in range(1, g - 1)] + [("rrcs", i)]
                + [("rcs", (i - r) % g) for r in range(1, g - 1)] + [("r", (i + 1) % g)])
    # Reduce ends at the root (member 0) and Broadcast starts there: a chain in ring order 1, 2, ..., g-1, 0
    position = (i - 1) % g  # 0 for member 1, g - 1 for the root
    if collective is Collective.REDUCE:
        kind = "s" if position == 0 else "rrc" if position == g - 1 else "rrs"
    else:  # BROADCAST: root sends, 1 .. g-2 pass on, g-1 receives
        kind = "s" if i == 0 else "r" if i == g - 1 else "rcs"
    return [(kind, -1)]


# which step types read their source, write their destination, send, receive (the executor's step types)
_READS = frozenset({"s", "rrs", "rrc", "rrcs", "cpy"})
_WRITES = frozenset({"rrc", "rrcs", "rcs", "r", "cpy"})
_SENDS = frozenset({"s", "rrs", "rrcs", "rcs"})
_RECEIVES = frozenset({"r", "rcs", "rrs", "rrc", "rrcs"})


class _Compiler:
    """One algorithm being built: every rank's thread blocks, where each of
    its xml chunks' values is now, and per memory cell the step that last
    wrote it and the steps that read it since (what a new step must wait for)."""

    def __init__(self, goal: Goal, k: int, pieces: int, chunk_of_rank: Sequence[int], instances: int = 1,
                 split_allreduce: bool = False, max_message: int = MAX_COUNT) -> None:
        self.goal, self.k, self.pieces, self.instances = goal, k, pieces, instances
        self.max_message = max_message
        self.split_allreduce = split_allreduce
        self.channels = 0  # channels the steps so far took
        position = [0] * k
        for rank, chunk in enumerate(chunk_of_rank):
            position[chunk] = rank
        self.position = position
        self.tbs: list[list[ThreadBlock]] = [[] for _ in range(k)]
        # per rank and xml chunk: where its current value is (None: the rank does not hold it)
        self.location: list[list[tuple[str, int] | None]] = []
        for r in range(k):
            if goal is Goal.ALLGATHER:
                held: list[tuple[str, int] | None] = [None] * (k * pieces)
                for p in range(pieces):
                    held[r * pieces + p] = ("i", p)
            else:
                held = [("i", x) for x in range(k * pieces)]
            self.location.append(held)
        self.writer: list[dict[int, tuple[int, int]]] = [{} for _ in range(k)]  # cell -> (tb, step)
        self.readers: list[dict[int, list[tuple[int, int]]]] = [{} for _ in range(k)]
        self.waited: list[dict[int, dict[int, int]]] = [{} for _ in range(k)]  # tb -> other tb -> step waited

    # ---- layout

    def xml_chunk(self, chunk: int, piece: int) -> int:
        if self.goal is Goal.ALLREDUCE:
            return piece * self.k + chunk
        return self.position[chunk] * self.pieces + piece

    def destination(self, rank: int, x: int) -> tuple[str, int]:
        if self.goal is Goal.REDUCESCATTER:
            return ("o", x - rank * self.pieces) if x // self.pieces == rank else ("s", x)
        return ("o", x)

    def cell(self, rank: int, place: tuple[str, int]) -> int:
        """Memory cell of ``place`` with the in-place aliases merged."""
        buf, off = place
        n = self.k * self.pieces
        if self.goal is Goal.ALLREDUCE:
            return off if buf in "io" else n + off
        if self.goal is Goal.REDUCESCATTER:
            return off if buf == "i" else rank * self.pieces + off if buf == "o" else n + off
        return rank * self.pieces + off if buf == "i" else off if buf == "o" else n + off

    # ---- thread blocks, dependencies

    def thread_block(self, rank: int, send: int, recv: int, chan: int) -> ThreadBlock:
        for tb in self.tbs[rank]:
            if (tb.send, tb.recv, tb.chan) == (send, recv, chan):
                return tb
        tb = ThreadBlock(len(self.tbs[rank]), send, recv, chan)
        self.tbs[rank].append(tb)
        return tb

    def emit(self, rank: int, tb: ThreadBlock, step: XmlStep, reads: list[int], writes: list[int]) -> None:
        """Append ``step`` to ``tb`` with the dependencies its memory accesses need."""
        needed: dict[int, int] = {}
        for c in reads:
            w = self.writer[rank].get(c)
            if w and w[0] != tb.id:
                needed[w[0]] = max(needed.get(w[0], -1), w[1])
        for c in writes:
            for other in [self.writer[rank].get(c), *self.readers[rank].get(c, [])]:
                if other and other[0] != tb.id:
                    needed[other[0]] = max(needed.get(other[0], -1), other[1])
        waited = self.waited[rank].setdefault(tb.id, {})
        deps = sorted((t, s) for t, s in needed.items() if waited.get(t, -1) < s)
        for t, s in deps[1:]:
            tb.steps.append(XmlStep("nop", depid=t, deps=s))
        if deps:
            step.depid, step.deps = deps[0]
        for t, s in deps:
            waited[t] = s
            self.tbs[rank][t].steps[s].hasdep = 1
        index = len(tb.steps)
        tb.steps.append(step)
        for c in reads:
            self.readers[rank].setdefault(c, []).append((tb.id, index))
        for c in writes:
            self.writer[rank][c] = (tb.id, index)
            self.readers[rank][c] = []

    # ---- steps

    def segments(self, members: Sequence[int], xs: list[int]) -> list[list[int]]:
        """``xs`` (sorted xml chunks) cut into runs that are contiguous, for every
        member, where it holds them now and where it writes them, and at most
        ``max_message`` long: the same cuts for a sender and its receiver. Computed
        before the step touches ``xs``; each run then moves as one."""
        out: list[list[int]] = []
        for x in xs:
            if out and x == out[-1][-1] + 1 and len(out[-1]) < self.max_message and all(
                    self._continues(m, out[-1][-1], x) for m in members):
                out[-1].append(x)
            else:
                out.append([x])
        return out

    def _continues(self, rank: int, a: int, b: int) -> bool:
        la, lb = self.location[rank][a], self.location[rank][b]
        if (la is None) != (lb is None) or (la and lb and (la[0] != lb[0] or lb[1] != la[1] + 1)):
            return False
        da, db = self.destination(rank, a), self.destination(rank, b)
        return da[0] == db[0] and db[1] == da[1] + 1

    def step(self, collective: Collective, groups: Sequence[tuple[Sequence[int], Sequence[int]]]) -> None:
        """The next step of the program on its groups (member lists, ordered
        chunk lists): piece ``p`` on the step's ``p mod instances``-th channel,
        one thread block per member and channel. With ``split_allreduce`` an
        AllReduce runs as a ReduceScatter ring on the step's first channels
        and an AllGather ring on the next ones (two thread blocks per member,
        each with about half the operations: a ring of ``g`` then needs ``g``
        steps per thread block instead of ``2g - 1``); each piece enters the
        AllGather as soon as its ReduceScatter has produced it."""
        phases = ((Collective.REDUCESCATTER, Collective.ALLGATHER)
                  if self.split_allreduce and collective is Collective.ALLREDUCE else (collective,))
        first_channel = self.channels
        self.channels += len(phases) * self.instances
        for members, chunks in groups:
            g = len(members)
            if g < 2 or not chunks:
                continue
            length = len(chunks) // g
            parts = [list(chunks[j * length:(j + 1) * length]) for j in range(g)]
            rings = []  # per phase: every member's operations, thread blocks per instance and member, parts used
            for number, phase in enumerate(phases):
                ops = [_ring_ops(phase, g, i) for i in range(g)]
                tbs: list[list[ThreadBlock]] = []
                for instance in range(min(self.instances, self.pieces)):
                    row = []
                    for i, m in enumerate(members):
                        sends = any(kind in _SENDS for kind, _ in ops[i])
                        receives = any(kind in _RECEIVES for kind, _ in ops[i])
                        row.append(self.thread_block(m, members[(i + 1) % g] if sends else -1,
                                                     members[(i - 1) % g] if receives else -1,
                                                     first_channel + number * self.instances + instance))
                    tbs.append(row)
                rings.append((ops, tbs, sorted({part for member_ops in ops for _, part in member_ops})))
            for piece in range(self.pieces):
                for ops, tbs, used in rings:
                    blocks = tbs[piece % len(tbs)]
                    cuts = {part: self.segments(members, sorted(self.xml_chunk(c, piece)
                                                                for c in (chunks if part < 0 else parts[part])))
                            for part in used}
                    # segment by segment, each a ring pass of its own: a member sends one message per round
                    # and receives it back before the next, so no connection ever holds more than one
                    for j in range(max(len(c) for c in cuts.values())):
                        for i, m in enumerate(members):
                            for kind, part in ops[i]:
                                if j < len(cuts[part]):
                                    self._operate(m, blocks[i], kind, cuts[part][j])

    def _operate(self, rank: int, tb: ThreadBlock, kind: str, seg: list[int]) -> None:
        src = self.location[rank][seg[0]] if kind in _READS else None
        if kind in _READS and src is None:
            raise SynthError(f"internal: rank {rank} sends chunk {seg[0]} it does not hold")
        dst = self.destination(rank, seg[0]) if kind in _WRITES else None
        step = XmlStep(kind, cnt=len(seg))
        if src:
            step.srcbuf, step.srcoff = src
        if dst:
            step.dstbuf, step.dstoff = dst
        reads = [self.cell(rank, self.location[rank][x]) for x in seg] if src else []
        writes = [self.cell(rank, self.destination(rank, x)) for x in seg] if dst else []
        self.emit(rank, tb, step, reads, writes)
        if dst:
            for x in seg:
                self.location[rank][x] = self.destination(rank, x)

    def finish(self) -> None:
        """Copy what did not end where the goal wants it (a rank's own shard of
        an AllGather, or any chunk never written) in a local thread block."""
        for rank in range(self.k):
            wanted = [x for x in range(self.k * self.pieces)
                      if self.goal is not Goal.REDUCESCATTER or x // self.pieces == rank]
            stale = [x for x in wanted if self.location[rank][x] != self.destination(rank, x)]
            if not stale:
                continue
            tb = self.thread_block(rank, -1, -1, 0)
            for x in stale:
                src, dst = self.location[rank][x], self.destination(rank, x)
                if src is None:
                    raise SynthError(f"internal: rank {rank} ends without chunk {x}")
                step = XmlStep("cpy", src[0], src[1], dst[0], dst[1], 1)
                self.emit(rank, tb, step, [self.cell(rank, src)], [self.cell(rank, dst)])
                self.location[rank][x] = dst


def compile_program(program: Program, reduction: Reduction, name: str, proto: str = "Simple",
                    min_bytes: int = 0, max_bytes: int = 0, pieces: int | None = None,
                    instances: int = 1, split_allreduce: bool | None = None) -> MscclAlgorithm:
    """The MSCCL algorithm of ``program`` on ``reduction`` (module docstring).
    ``pieces``: sub-chunks per chunk (pipelining); None: the most of 8, 4, 2, 1
    whose thread blocks fit MSCCL's 64 steps. ``instances``: channels per step,
    piece ``p`` on the ``p mod instances``-th (thread blocks in parallel on
    disjoint pieces; more SMs per step, fewer steps per thread block).
    ``split_allreduce``: AllReduce steps as ReduceScatter and AllGather thread
    blocks on channels of their own (:meth:`_Compiler.step`); None: only when
    one ring per thread block does not fit (a ring of more than 32 ranks, or
    the pieces asked for). SynthError when the goal has no MSCCL collective or
    nothing fits the limits."""
    if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
        raise SynthError(f"--instances {instances!r}: channels per step, an integer >= 1")
    if reduction.goal not in COLLECTIVE_NAMES:
        raise SynthError(f"MSCCL export: no MSCCL collective for {reduction.goal.value}")
    if proto not in PROTOCOLS:
        raise SynthError(f"MSCCL export: protocol '{proto}': choose one of {', '.join(PROTOCOLS)}")
    chunk_of_rank, steps = group_runs(program, reduction)
    k = len(chunk_of_rank)
    if len(steps) * instances > MAX_CHANNELS:
        raise SynthError(f"MSCCL export: {len(steps)} steps x {instances} instance(s) need {len(steps) * instances} "
                         f"channels; MSCCL has {MAX_CHANNELS}")

    def build(p: int, split: bool) -> tuple[_Compiler, int]:
        compiler = _Compiler(reduction.goal, k, p, chunk_of_rank, instances, split,
                             largest_message(proto, k * p, max_bytes))
        for collective, groups in steps:
            compiler.step(collective, [(members, expand(runs)) for members, runs in groups])
        compiler.finish()
        return compiler, max(len(tb.steps) for tbs in compiler.tbs for tb in tbs)

    def fits(compiler: _Compiler, longest: int) -> bool:
        return (longest <= MAX_STEPS_PER_TB and max(len(tbs) for tbs in compiler.tbs) <= MAX_DEPENDENCY_TB + 1
                and compiler.channels <= MAX_CHANNELS)

    # AllReduce steps as one ring per thread block first; split into ReduceScatter and AllGather thread
    # blocks (more channels, half the operations each) only when no piece count fits that way
    problems = []
    splits = ((False, True) if any(c is Collective.ALLREDUCE for c, _ in steps) else (False,)) \
        if split_allreduce is None else (split_allreduce,)
    for split in splits:
        if pieces:
            tries = [pieces]
        else:  # thread blocks grow about linearly with the pieces: one build of 1 piece says which counts may fit
            single, longest = build(1, split)
            if not fits(single, longest):
                tries = [1]
            else:
                tries = [p for p in PIECES_TRIED if p > 1 and longest * p <= MAX_STEPS_PER_TB]
                tries.append(1)
        for p in tries:
            compiler, longest = (single, longest) if p == 1 and not pieces else build(p, split)
            if fits(compiler, longest):
                return _algorithm(compiler, name, proto, min_bytes, max_bytes, compiler.channels)
            how = "AllReduce as ReduceScatter + AllGather thread blocks, " if split else ""
            channels = f", {compiler.channels} channels" if compiler.channels > MAX_CHANNELS else ""
            problems.append(f"{how}{p} piece(s): {longest} steps in a thread block{channels}")
    raise SynthError(f"MSCCL export: {program} on {k} ranks does not fit MSCCL's {MAX_STEPS_PER_TB} steps per "
                     f"thread block and {MAX_CHANNELS} channels ({'; '.join(problems)})")


def largest_message(proto: str, nchunksperloop: int, max_bytes: int) -> int:
    """The most chunks one message (step) may carry so that no ring member
    fills its outgoing connection before it receives, at every size up to
    ``max_bytes`` (0: unbounded). Each ring pass starts with every member
    sending; its next step receives, reduces and sends, and waits for free
    send space before it consumes its input (synth.export.msccl_flow). So
    the first message may take the connection's slots but one slice: one
    piece in Simple (4 of 8 slots), seven in LL and LL128 (one slot each);
    a piece carries ``maxAllowedCount`` chunks at the largest size of the range."""
    largest = max_bytes or 2**62
    per_piece = max_allowed_count(proto, largest, nchunksperloop)
    slots = SLICES_PER_PIECE[proto] * SLOTS_PER_SLICE[proto]
    pieces = (NCCL_STEPS - SLOTS_PER_SLICE[proto]) // slots
    return max(1, min(MAX_COUNT, pieces * per_piece))


def _algorithm(c: _Compiler, name: str, proto: str, min_bytes: int, max_bytes: int, channels: int) -> MscclAlgorithm:
    n = c.k * c.pieces
    if c.goal is Goal.ALLREDUCE:
        chunks = (n, n, 0)
    elif c.goal is Goal.REDUCESCATTER:
        chunks = (n, c.pieces, n)
    else:
        chunks = (c.pieces, n, 0)
    nchannels = max(1, channels)
    return MscclAlgorithm(name, proto, nchannels, n, c.k, COLLECTIVE_NAMES[c.goal], 1, 1, min_bytes, max_bytes,
                          tuple(chunks for _ in range(c.k)), tuple(tuple(tbs) for tbs in c.tbs), c.pieces,
                          min(c.instances, c.pieces))


# ---------------------------------------------------------------- a plan's files


@dataclass(frozen=True)
class MscclFile:
    """One file of a plan's export: its name, the reduction and size range it
    serves, and the algorithm."""

    name: str
    axes: tuple[str, ...]
    goal: Goal
    program: Program
    algorithm: MscclAlgorithm
    reduction: Reduction | None = None
    lowered: LoweredProgram | None = None
    size_bytes: int = 0  # the size the file's pieces and channels were chosen at
    price: FilePrice | None = None  # its price as written there

    def to_dict(self) -> dict:
        a = self.algorithm
        return {"file": self.name, "reduce": list(self.axes), "collective": self.goal.value, "coll": a.coll,
                "ngpus": a.ngpus, "proto": a.proto, "minBytes": a.min_bytes, "maxBytes": a.max_bytes,
                "nchannels": a.nchannels, "nchunksperloop": a.nchunksperloop, "pieces": a.pieces,
                "instances": a.instances,
                "thread_blocks": sum(len(tbs) for tbs in a.thread_blocks),
                "steps": sum(len(tb.steps) for tbs in a.thread_blocks for tb in tbs),
                "program": "; ".join(str(i) for i in self.program.instructions)}


def protocol_for(reduction: Reduction, size_bytes: int) -> str:
    """The protocol written for a ring of the goal's collective over one
    reduction group at ``size_bytes``: NCCL's (synth.cost.nccl) LL for small
    sizes, LL128 where the links allow it, Simple for large ones; never LL128
    across nodes unless the topology states a GPU-NIC path where NCCL enables
    it (synth.export.msccl_cost)."""
    return ring_protocol(group_comm(reduction), reduction.goal.collective, float(max(1, size_bytes)))


def _cheapest(lowered: LoweredProgram, reduction: Reduction, size: int, model: Model | None, name: str, proto: str,
              min_bytes: int, max_bytes: int, instances: int | None = None) -> tuple[MscclAlgorithm, FilePrice]:
    """The program compiled with the pieces and channels per step
    (``instances``; None: chosen too) that the file's price as written
    (synth.export.msccl_cost) makes cheapest at ``size``, among those that fit
    MSCCL's limits with one ring per thread block, those whose
    ``nchunksperloop`` divides ``size``'s float32 element count first (the
    executor runs only such calls); split AllReduce steps
    (:func:`compile_program`'s ``split_allreduce``) only when none does."""
    pricer = FilePricer(lowered, reduction, model)
    tried = INSTANCES_TRIED if instances is None else (instances,)
    k = len(lowered.reduction_groups[0])

    def undivided(pieces: int) -> bool:  # the executor skips a call whose element count nchunksperloop does not divide
        return size % ELEMENT_BYTES != 0 or (size // ELEMENT_BYTES) % (k * pieces) != 0

    ranked = sorted(((pricer.price(size, proto, p, c), p, c) for p, c in layouts(PIECES_TRIED, tried)),
                    key=lambda t: (undivided(t[1]), t[0].seconds, t[1], t[2]))
    if instances is not None and not ranked:
        ranked = [(pricer.price(size, proto, p, instances), p, instances) for p in PIECES_TRIED]
    problems = []
    for split in (False, True):
        for price, pieces, channels in ranked:
            try:
                return compile_program(lowered.program, reduction, name, proto, min_bytes, max_bytes, pieces,
                                       channels, split), price
            except SynthError as exc:
                problems.append(str(exc))
    raise SynthError(problems[-1])


def _size_in(low: int, high: int | None, preferred: int | None) -> int:
    """The size a sub-range's pieces and channels are chosen at: the plan's
    size where it falls inside, else the range's middle (geometric; 4 x its
    start when unbounded)."""
    if preferred is not None and low <= preferred and (high is None or preferred < high):
        return preferred
    start = max(low, 1)
    return 4 * start if high is None else max(start, int((start * high) ** 0.5))


def plan_files(plan, axes: Sequence[str] | None = None, model: Model | None = None,
               instances: int | None = None) -> list[MscclFile]:
    """Every reduction of ``plan`` (those over exactly ``axes`` when given)
    and each of its size ranges as MSCCL algorithms: a range is cut where the
    written protocol changes (:func:`synth.export.msccl_cost.protocol_ranges`),
    and each part is compiled with the pieces and channels per step priced
    cheapest as written (:func:`_cheapest`) at a size inside it. A range that
    is not cut keeps the name ``AXES-COLL-N.xml``; the parts of a cut one are
    ``AXES-COLL-N-J.xml``."""
    if instances is not None and (isinstance(instances, bool) or not isinstance(instances, int) or instances < 1):
        raise SynthError(f"--instances {instances!r}: channels per step, an integer >= 1")
    files = []
    chosen = [p for p in plan.reductions if axes is None or set(p.reduction.axes) == set(axes)]
    if not chosen:
        known = "; ".join(",".join(p.reduction.axes) for p in plan.reductions)
        raise SynthError(f"--reduce {','.join(axes or ())}: the plan reduces over {known}")
    for planned in chosen:
        reduction = planned.reduction
        label = "-".join(reduction.axes) + "-" + COLLECTIVE_NAMES[reduction.goal]
        for n, program in enumerate(planned.programs):
            parts = protocol_ranges(reduction, program.min_bytes, program.max_bytes, model)
            for j, (low, high, proto) in enumerate(parts):
                size = _size_in(low, high, program.predicted_for_bytes or max(program.min_bytes, 1 << 20))
                name = f"{label}-{n}.xml" if len(parts) == 1 else f"{label}-{n}-{j}.xml"
                algorithm, price = _cheapest(program.lowered, reduction, size, model, name.removesuffix(".xml"),
                                             proto, low, 0 if high is None else high - 1, instances)
                files.append(MscclFile(name, reduction.axes, reduction.goal, program.program, algorithm, reduction,
                                       program.lowered, size, price))
    return files


def export_algorithm(lowered: LoweredProgram, reduction: Reduction, size_bytes: int, name: str,
                     model: Model | None = None) -> MscclAlgorithm:
    """The file the export writes for a plan of this one program, for the
    part of its size range that holds ``size_bytes``: the protocol written
    there, over the sizes where it is written, with the pieces and channels
    per step priced cheapest at ``size_bytes`` (what ``bench --pipelined``
    runs)."""
    for low, high, proto in protocol_ranges(reduction, 0, None, model):
        if low <= size_bytes and (high is None or size_bytes < high):
            return _cheapest(lowered, reduction, size_bytes, model, name, proto, low,
                             0 if high is None else high - 1)[0]
    raise SynthError(f"internal: no protocol range holds {size_bytes} bytes")


def shadowed(files: Sequence[MscclFile]) -> list[tuple[MscclFile, MscclFile]]:
    """Pairs ``(first, other)`` of files of different reductions with the same
    collective and ranks over overlapping sizes: the executor selects by those
    alone and takes the first in path order, so ``first`` serves both."""
    out = []
    ordered = sorted(files, key=lambda f: f.name)
    for i, a in enumerate(ordered):
        for b in ordered[i + 1:]:
            if a.axes != b.axes and (a.algorithm.coll, a.algorithm.ngpus) == (b.algorithm.coll, b.algorithm.ngpus) \
                    and _overlap(a.algorithm, b.algorithm):
                out.append((a, b))
    return out


def _overlap(a: MscclAlgorithm, b: MscclAlgorithm) -> bool:
    a_high = a.max_bytes or float("inf")
    b_high = b.max_bytes or float("inf")
    return a.min_bytes <= b_high and b.min_bytes <= a_high


def schedule_of(algorithm: MscclAlgorithm, rank: int) -> Schedule:
    """Rank ``rank``'s thread blocks as the runtime's streams
    (:mod:`synth.runtime.pipelined`), step indices kept (nops included)."""
    streams = []
    for tb in algorithm.thread_blocks[rank]:
        ops = tuple(Op(st.type, (st.srcbuf, st.srcoff), (st.dstbuf, st.dstoff), st.cnt,
                       ((st.depid, st.deps),) if st.depid >= 0 else ()) for st in tb.steps)
        streams.append(Stream(tb.send, tb.recv, tb.chan, ops))
    return Schedule(tuple(streams), algorithm.nchunksperloop, algorithm.chunks[rank][2])
