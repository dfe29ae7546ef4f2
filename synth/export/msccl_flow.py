"""The MSCCL executor's flow control, interpreted: whether a file's thread
blocks can all finish at a given buffer size, and if not, where they stick.

Read from Azure/msccl-executor-nccl at commit c6f6b36d1a4c (2024-12-13); the
references are ``file:line`` at that commit.

* Pieces. The kernel runs every step of a thread block once per loop
  iteration (``src/device/msccl_kernel.cu:207`` loops over ``gridOffset``,
  ``:222`` over the steps) and cuts a step of ``cnt`` chunks into primitive
  calls of at most ``maxAllowedCount`` chunks (``msccl_kernel.cu:245``,
  ``for (c = 0; c < count; c += maxAllowedCount)``). ``maxAllowedCount =
  max(1, chunkEffectiveSize / ceil(nBytes / nchunksperloop))``, at most 71
  (``src/misc/msccl/msccl_setup.cc:55-62``); ``chunkEffectiveSize`` is the
  protocol's buffer / NCCL_STEPS x chunk steps, halved for LL and x 15/16 for
  LL128 (``msccl_setup.cc:46-52``; buffers ``src/init.cc:614-616``: LL 512 KiB,
  LL128 4,915,200 B, Simple 4 MiB). So a step runs as ``ceil(cnt /
  maxAllowedCount)`` pieces, and above about one chunk effective size per
  xml chunk a piece is one chunk.
* Slots. A connection has NCCL_STEPS = 8 slots (``src/include/device.h:27``).
  A Simple call always runs SlicePerChunk = 2 slices of StepPerSlice = 2 slots
  (``src/device/prims_simple.h:211-212, 246-254, 388-406``; the kernel
  instantiates ``ProtoSimple<MSCCL_CHUNKSTEPS/MSCCL_SLICESTEPS,
  MSCCL_SLICESTEPS>``, ``msccl_kernel.cu:332``, with ``MSCCL_CHUNKSTEPS`` = 4 and
  ``MSCCL_SLICESTEPS`` = 2, ``src/include/msccl/msccl_struct.h:23-24``): a piece
  takes 4 slots and a connection holds two. An LL or LL128 call takes one slot
  (``waitSend`` for ``head + 1``: ``src/device/prims_ll.h:96``,
  ``prims_ll128.h:98``): a connection holds eight.
* Order. A slice that receives waits until the sender has posted its slots;
  one that sends waits until the receiver has freed them (``prims_simple.h:144``:
  ``connStepCache + (send ? NCCL_STEPS : 0) < step + StepPerSlice``); a step
  that does both (``rrs``, ``rcs``, ``rrcs``) waits for both before it moves
  its slice, so a receive-reduce-send cannot consume its input while its own
  outgoing connection is full.
* Dependencies. Before a step, in every iteration, a thread block waits until
  each thread block it depends on has published a flag at least ``(iteration,
  step)`` (``msccl_kernel.cu:226-238``, ``curFlag >= goalFlag``); a thread block
  publishes ``(iteration, s)`` after a step with ``hasdep="1"``
  (``:313-318``). Flags only rise, so waiting on a step without ``hasdep`` is
  released by a later step of that thread block that has it.
* Iterations. A size whose xml chunks are larger than the chunk effective
  size runs the loop more than once (``msccl_kernel.cu:181, 207``); iterations
  after the first behave alike, so two are interpreted.

:func:`check_flow` interprets a file at one size per distinct behaviour in
its ``minBytes..maxBytes`` range (the sizes where the pieces of some step or
the number of iterations change) and raises a SynthError naming the size, the
stuck steps and the full connection.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..errors import SynthError

NCCL_STEPS = 8  # slots of a connection (device.h:27)
MAX_ALLOWED_COUNT = 71  # msccl_setup.cc:60-62: maxAllowedCount < MSCCL_MAX_COUNT (72)
# the protocols' connection buffers by default (init.cc:614-616) and the slots one primitive call's slices take
BUFFER_BYTES = {"LL": 8 * 512 * 8 * 16, "LL128": 120 * 640 * 8 * 8, "Simple": 1 << 22}
SLICES_PER_PIECE = {"LL": 1, "LL128": 1, "Simple": 2}
SLOTS_PER_SLICE = {"LL": 1, "LL128": 1, "Simple": 2}
SIMPLE_CHUNK_STEPS = 4
ITERATIONS_INTERPRETED = 2
_RECEIVES = frozenset(("r", "rcs", "rrs", "rrc", "rrcs"))
_SENDS = frozenset(("s", "rcs", "rrs", "rrcs"))
_SHOWN = 6  # stuck thread blocks a message lists


def chunk_effective_bytes(proto: str) -> int:
    """``chunkEffectiveSize`` of ``proto`` with NCCL's default buffers
    (msccl_setup.cc:46-52): what one primitive call moves at most."""
    step = BUFFER_BYTES[proto] // NCCL_STEPS
    if proto == "Simple":
        return step * SIMPLE_CHUNK_STEPS
    if proto == "LL":
        return step // 2
    return step // 16 * 15


def max_allowed_count(proto: str, n_bytes: int, nchunksperloop: int) -> int:
    """Chunks per primitive call at a call of ``n_bytes`` (msccl_setup.cc:55-62)."""
    per_chunk = -(-max(1, n_bytes) // nchunksperloop)
    return min(MAX_ALLOWED_COUNT, max(1, chunk_effective_bytes(proto) // per_chunk))


def iterations(proto: str, n_bytes: int, nchunksperloop: int) -> int:
    """Loop iterations interpreted at ``n_bytes``: 1, or 2 where the kernel runs more than one."""
    return 1 if -(-max(1, n_bytes) // nchunksperloop) <= chunk_effective_bytes(proto) else ITERATIONS_INTERPRETED


def sizes_to_check(proto: str, nchunksperloop: int, min_bytes: int, max_bytes: int) -> list[int]:
    """One size (bytes, the smallest) for each (maxAllowedCount, iterations)
    that a call in ``min_bytes..max_bytes`` (``max_bytes`` 0: unbounded) can have."""
    effective = chunk_effective_bytes(proto)
    n = nchunksperloop
    low_q = max(1, -(-max(1, min_bytes) // n))  # bytes per xml chunk, rounded up as the executor does
    high_q = None if max_bytes == 0 else max(low_q, -(-max_bytes // n))
    out = []
    # maxAllowedCount m (1..71) for q in (effective / (m + 1), effective / m]; q > effective: m = 1, two iterations
    starts = sorted({1} | {effective // (m + 1) + 1 for m in range(1, MAX_ALLOWED_COUNT)} | {effective + 1})
    for start in starts:
        q = max(start, low_q)
        if high_q is not None and q > high_q:
            continue
        nxt = [s for s in starts if s > start]
        if nxt and q >= nxt[0]:
            continue  # the range starts past this region
        out.append(max(min_bytes, (q - 1) * n + 1))
    return sorted(set(out))


@dataclass(frozen=True)
class FlowStep:
    """One step as the flow interpreter needs it."""

    s: int
    type: str
    cnt: int
    waits: tuple[tuple[int, int], ...]  # (thread block id, step) on the same gpu
    hasdep: bool
    line: int


@dataclass(frozen=True)
class FlowBlock:
    gpu: int
    id: int
    send: int
    recv: int
    chan: int
    steps: tuple[FlowStep, ...]


def blocks_of(algo) -> list[FlowBlock]:
    """The thread blocks of a parsed and structure-checked algorithm
    (:mod:`synth.export.msccl_check`), nops folded into their step's waits."""
    out = []
    for gpu in sorted(algo.gpus, key=lambda g: g.id):
        for b in sorted(gpu.blocks, key=lambda x: x.id):
            steps = tuple(FlowStep(st.s, st.type, st.cnt, tuple(st.waits), bool(st.hasdep), st.line)
                          for st in b.steps if st.type != "nop")
            out.append(FlowBlock(gpu.id, b.id, b.send, b.recv, b.chan, steps))
    return out


class _Run:
    """The thread blocks at one (maxAllowedCount, iterations): each runs its
    steps slice by slice; a blocked one is woken by the connection or flag it
    waits for."""

    def __init__(self, blocks: list[FlowBlock], proto: str, allowed: int, loops: int) -> None:
        self.blocks, self.allowed, self.loops = blocks, allowed, loops
        self.slices, self.slots = SLICES_PER_PIECE[proto], SLOTS_PER_SLICE[proto]
        self.index = {(b.gpu, b.id): i for i, b in enumerate(blocks)}
        n = len(blocks)
        self.position = [[0, 0, 0, 0] for _ in range(n)]  # iteration, step, piece, slice
        self.checked = [False] * n  # the current step's dependencies were met
        self.flag = [(-1, -1)] * n
        self.posted: dict[tuple[int, int, int], int] = {}  # slots a connection's sender posted
        self.freed: dict[tuple[int, int, int], int] = {}  # slots its receiver consumed
        self.waiting: dict[object, list[int]] = {}
        # per thread block: the step indices (s) with hasdep, to find the flag that releases a wait
        self.flagged = [{st.s for st in b.steps if st.hasdep} for b in blocks]

    def pieces(self, step: FlowStep) -> int:
        return -(-step.cnt // self.allowed)

    def _block(self, i: int, on: object) -> None:
        self.waiting.setdefault(on, []).append(i)

    def _wake(self, on: object, ready: deque) -> None:
        for j in self.waiting.pop(on, ()):
            ready.append(j)

    def run(self) -> list[int]:
        """Indices of the thread blocks left unfinished."""
        ready = deque(range(len(self.blocks)))
        while ready:
            self._advance(ready.popleft(), ready)
        return [i for i, p in enumerate(self.position) if p[0] < self.loops]

    def _advance(self, i: int, ready: deque) -> None:
        b, pos = self.blocks[i], self.position[i]
        if not b.steps:
            pos[0] = self.loops
            return
        inbox, outbox = (b.recv, b.gpu, b.chan), (b.gpu, b.send, b.chan)
        while pos[0] < self.loops:
            it, at = pos[0], pos[1]
            step = b.steps[at]
            if not self.checked[i]:
                for tb, s in step.waits:
                    j = self.index[(b.gpu, tb)]
                    if self.flag[j] < (it, s):
                        self._block(i, ("flag", j))
                        return
                self.checked[i] = True
            receives, sends = step.type in _RECEIVES, step.type in _SENDS
            total = self.pieces(step) * self.slices
            while pos[2] * self.slices + pos[3] < total:
                if receives and self.posted.get(inbox, 0) - self.freed.get(inbox, 0) < self.slots:
                    self._block(i, inbox)
                    return
                if sends and self.posted.get(outbox, 0) + self.slots - self.freed.get(outbox, 0) > NCCL_STEPS:
                    self._block(i, outbox)
                    return
                if receives:
                    self.freed[inbox] = self.freed.get(inbox, 0) + self.slots
                    self._wake(inbox, ready)
                if sends:
                    self.posted[outbox] = self.posted.get(outbox, 0) + self.slots
                    self._wake(outbox, ready)
                pos[3] += 1
                if pos[3] == self.slices:
                    pos[2], pos[3] = pos[2] + 1, 0
            if step.hasdep:
                self.flag[i] = (it, step.s)
                self._wake(("flag", i), ready)
            self.checked[i] = False
            pos[1], pos[2], pos[3] = at + 1, 0, 0
            if pos[1] == len(b.steps):
                pos[0], pos[1] = it + 1, 0

    def describe(self, i: int) -> str:
        b, (it, at, piece, _) = self.blocks[i], self.position[i]
        step = b.steps[at]
        where = (f"gpu {b.gpu} tb {b.id} step {step.s} ({step.type} cnt={step.cnt}, line {step.line}), "
                 f"iteration {it + 1}")
        if not self.checked[i]:
            late = []
            for tb, s in step.waits:
                j = self.index[(b.gpu, tb)]
                if self.flag[j] < (it, s):
                    shown = "none" if self.flag[j][0] < 0 else f"step {self.flag[j][1]} of iteration {self.flag[j][0] + 1}"
                    late.append(f"tb {tb} step {s} (its flag: {shown})")
            return f"{where}: waits for {', '.join(late)}"
        inbox, outbox = (b.recv, b.gpu, b.chan), (b.gpu, b.send, b.chan)
        piece_text = f"piece {piece + 1} of {self.pieces(step)}"
        reasons = []
        if step.type in _RECEIVES and self.posted.get(inbox, 0) - self.freed.get(inbox, 0) < self.slots:
            reasons.append(f"receives nothing from gpu {b.recv} on chan {b.chan}")
        if step.type in _SENDS and self.posted.get(outbox, 0) + self.slots - self.freed.get(outbox, 0) > NCCL_STEPS:
            held = self.posted[outbox] - self.freed.get(outbox, 0)
            reasons.append(f"connection gpu {b.gpu} -> gpu {b.send} chan {b.chan} is full ({held} of {NCCL_STEPS} "
                           "slots unreceived)")
        return f"{where}, {piece_text}: {'; '.join(reasons)}"


def check_flow_at(algo, blocks: list[FlowBlock], n_bytes: int, source: str) -> None:
    """Interpret the file at a call of ``n_bytes``; SynthError on a deadlock."""
    allowed = max_allowed_count(algo.proto, n_bytes, algo.nchunksperloop)
    loops = iterations(algo.proto, n_bytes, algo.nchunksperloop)
    run = _Run(blocks, algo.proto, allowed, loops)
    stuck = run.run()
    if stuck:
        shown = " | ".join(run.describe(i) for i in stuck[:_SHOWN]) + (" | ..." if len(stuck) > _SHOWN else "")
        raise SynthError(f"{source}: deadlock at {n_bytes} bytes ({algo.proto}, {allowed} chunk(s) per piece, "
                         f"{loops} loop iteration(s)): {len(stuck)} thread block(s) stuck: {shown}")


def check_flow(algo, source: str) -> list[int]:
    """Interpret the file at every behaviour of its size range
    (:func:`sizes_to_check`; sizes giving the same pieces for every step are
    run once); the sizes interpreted. SynthError on the first deadlock."""
    blocks = blocks_of(algo)
    counts = sorted({st.cnt for b in blocks for st in b.steps})
    seen = set()
    checked = []
    for size in sizes_to_check(algo.proto, algo.nchunksperloop, algo.min_bytes, algo.max_bytes):
        allowed = max_allowed_count(algo.proto, size, algo.nchunksperloop)
        key = (tuple(-(-c // allowed) for c in counts), iterations(algo.proto, size, algo.nchunksperloop))
        if key in seen:
            continue
        seen.add(key)
        check_flow_at(algo, blocks, size, source)
        checked.append(size)
    return checked
