"""Check an MSCCL algorithm XML by running it chunk by chunk on symbolic data.

Independent of the compiler (:mod:`synth.export.msccl` is not imported): it
reads any file, hand-written or third-party, as the executor's reader does
(msccl-executor-nccl c6f6b36d, ``src/misc/msccl/msccl_parser.cc``: no XML
declaration, ``<algo>`` first, one start tag per line, double-quoted values,
no tabs before a tag; every attribute the executor reads present), checks what
the executor checks at load (protocol, collective, thread block ids contiguous,
peers, channels, step numbering, types, counts, buffers, offsets, the
dependency-chain rule, limits) and what it does not check but needs (one
thread block per (channel, peer, direction), offsets + count inside the
buffer, dependencies on steps whose thread block raises a flag at or after
them, no cycles; every declared count bounded by the executor's reader before
anything is allocated for it), then executes it:

* every chunk of every buffer holds a multiset of contributions ``(rank,
  input chunk)``; inputs start as their own contribution, outputs and scratch
  as "uninitialised" (runs use one number per chunk, a sum of pseudo-random
  weights, and a failing run of a small file is repeated with multisets to
  describe it);
* a thread block runs its steps in order; a step waits for its dependencies
  (``depid``/``deps``, and those of the ``nop`` steps before it) as the
  kernel's flags do: released once the thread block waited on has finished a
  step with ``hasdep="1"`` at or after the one named (flags only rise); to
  receive, it waits for the next message on its connection (sender,
  receiver, channel), which carries messages in order;
* a receive must take as many chunks as were sent;
* when no thread block can move and some have steps left, the run deadlocks:
  the error lists the stuck steps and what each waits for;
* the connections' capacity (slots, pieces per step at each size of the
  file's range) is interpreted by :mod:`synth.export.msccl_flow` after the
  data run: a file that holds its data right may still deadlock at some size;
* the run is repeated with the ready thread blocks taken in other orders
  (reversed, shuffled): a step that lacks a dependency then reads or
  overwrites memory too early in some order, and the result shows it.

At the end the collective's postcondition must hold on every rank, out of
place and, where the file says ``inplace="1"``, with the executor's aliases
(allreduce: ``o`` is ``i``; reducescatter: ``o`` is ``i`` from chunk ``rank x
nchunksperloop / ngpus``; allgather: ``i`` is ``o`` from there): allreduce,
every output chunk holds every rank's same input chunk exactly once;
reducescatter, rank r's output chunk j the sum of input chunk ``r x n / ngpus
+ j``; allgather, rank r's output chunk ``q x n / ngpus + j`` rank q's input
chunk j.
"""

from __future__ import annotations

import random
import re
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path

from ..documents import read_limited
from ..errors import SynthError
from .msccl_flow import check_flow

MAX_XML_BYTES = 64 * 2**20
# the executor's XML reader (msccl-executor-nccl c6f6b36d, src/include/msccl/msccl_parser.h:20-23): a rank keeps
# <algo>, every <gpu> and its own gpu's <tb> and <step> elements, fewer than 4096 in all (msccl_parser.cc:169-171
# and 193-198: the check runs before each element read, the closing tags included), 1024 children per element (its
# subs array), 16 attributes per element, values of at most 254 characters (msccl_parser.cc:69-71). Every declared
# count is bounded by these before anything is allocated for it.
MAX_NODES = 4096
MAX_ELEMENTS = 2**18  # this checker's cap on the elements of a whole file (every rank's), to bound its memory
MAX_SUBS = 1024
MAX_ATTRIBUTES = 16
MAX_VALUE_CHARS = 254
MAX_GPUS = MAX_SUBS  # one <gpu> element per rank, all children of <algo>
MAX_OFFSET = 2**15 - 1  # srcOffset/dstOffset are int16_t in the kernel's step (msccl_struct.h:44-45)
# no step reaches a chunk past the largest offset plus the largest count: the most chunks a buffer can use
MAX_CHUNKS = MAX_OFFSET + 71
# this checker's own cap on its symbolic run: ngpus x nchunksperloop contributions (a rank's every input chunk); the
# run holds a few values per chunk of every rank's buffers, so memory and time stay bounded
MAX_CONTRIBUTIONS = 2**16
MAX_DESCRIBED = 2**12  # a failing run is repeated with multisets (to list what a wrong chunk holds) up to this size
MAX_STEPS = 64  # MSCCL_MAX_NUM_STEPS (build default)
MAX_COUNT = 72  # cnt < MSCCL_MAX_COUNT
MAX_CHANNELS = 32
MAX_TBS_PER_CHANNEL = 32
MAX_TBS = 1024
MAX_DEPID = 127
# orders in which ready thread blocks run (by id, reversed, two shuffles): a missing dependency shows in some
SCHEDULES = 4
PROTOCOLS = ("Simple", "LL", "LL128")
COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce", "send", "recv",
               "gather", "scatter", "alltoallv")
CHECKED = ("allreduce", "reducescatter", "allgather")
ALGO_ATTRS = ("proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace", "outofplace", "minBytes",
              "maxBytes")
TB_ATTRS = ("id", "send", "recv", "chan")
STEP_ATTRS = ("s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep")
STEP_TYPES = ("s", "r", "rcs", "rrs", "rrc", "rrcs", "cpy", "re", "nop")
SENDS = ("s", "rcs", "rrs", "rrcs")
RECEIVES = ("r", "rcs", "rrs", "rrc", "rrcs")
UNSET = ("uninitialised",)
# what execute does with each step type: which read their source, which write their destination, how values combine
_READS_SOURCE = frozenset(("rrs", "rrc", "rrcs", "re", "s", "cpy"))
_WRITES = frozenset(("r", "rcs", "rrc", "rrcs", "cpy", "re"))
_ADD_RECEIVED, _TAKE_RECEIVED, _ADD_DESTINATION = 1, 2, 3
_COMBINE = {"rrs": _ADD_RECEIVED, "rrc": _ADD_RECEIVED, "rrcs": _ADD_RECEIVED, "r": _TAKE_RECEIVED,
            "rcs": _TAKE_RECEIVED, "re": _ADD_DESTINATION}

_TAG = re.compile(r"<(/?)([A-Za-z_][\w-]*)((?:\s+[\w-]+=\"[^\"\n]*\")*)\s*(/?)>")
_ATTR = re.compile(r"([\w-]+)=\"([^\"\n]*)\"")


@dataclass
class Step:
    s: int
    type: str
    srcbuf: str
    srcoff: int
    dstbuf: str
    dstoff: int
    cnt: int
    depid: int
    deps: int
    hasdep: int
    line: int
    waits: list[tuple[int, int]] = field(default_factory=list)  # its own and its nops' dependencies


@dataclass
class Block:
    id: int
    send: int
    recv: int
    chan: int
    line: int
    steps: list[Step] = field(default_factory=list)
    next_flag: list[int] | None = None  # per step, the first step at or after it with hasdep (_flagged_from)


@dataclass
class Gpu:
    id: int
    i_chunks: int
    o_chunks: int
    s_chunks: int
    line: int
    blocks: list[Block] = field(default_factory=list)


@dataclass
class Algorithm:
    attrs: dict[str, str]
    proto: str
    nchannels: int
    nchunksperloop: int
    ngpus: int
    coll: str
    inplace: bool
    outofplace: bool
    min_bytes: int
    max_bytes: int
    gpus: list[Gpu]


@dataclass(frozen=True)
class CheckResult:
    """What a checked file is: its collective, ranks, chunks, protocol, byte
    range, the modes checked, and its size in thread blocks and steps."""

    coll: str
    ngpus: int
    nchunksperloop: int
    proto: str
    nchannels: int
    min_bytes: int
    max_bytes: int
    modes: tuple[str, ...]
    thread_blocks: int
    steps: int
    flow_sizes: tuple[int, ...] = ()  # the sizes (bytes) the flow control was interpreted at


    def to_dict(self) -> dict:
        return {"coll": self.coll, "ngpus": self.ngpus, "nchunksperloop": self.nchunksperloop, "proto": self.proto,
                "nchannels": self.nchannels, "minBytes": self.min_bytes, "maxBytes": self.max_bytes,
                "modes": list(self.modes), "thread_blocks": self.thread_blocks, "steps": self.steps,
                "flow_sizes": list(self.flow_sizes)}


# ---------------------------------------------------------------- reading


def _integer(attrs: dict[str, str], key: str, where: str) -> int:
    text = attrs[key]
    if not re.fullmatch(r"-?\d+", text):
        read_as = "its leading digits" if re.match(r"-?\d", text) else "0"
        raise SynthError(f"{where}: {key}=\"{text}\" is not an integer (the executor would read it as {read_as})")
    if len(text.lstrip("-")) > 18:
        raise SynthError(f"{where}: {key}=\"{text}\" is too large")
    return int(text)


def _attrs(tag: str, body: str, required: tuple[str, ...], where: str) -> dict[str, str]:
    attrs: dict[str, str] = {}
    for key, value in _ATTR.findall(body):
        if key in attrs:
            raise SynthError(f"{where}: <{tag}> gives {key} twice")
        if len(attrs) == MAX_ATTRIBUTES:
            raise SynthError(f"{where}: <{tag}> has more than {MAX_ATTRIBUTES} attributes: the executor's reader "
                             "ignores the rest")
        if len(value) > MAX_VALUE_CHARS or len(key) > MAX_VALUE_CHARS:
            raise SynthError(f"{where}: <{tag}> {key[:20]}: a name or value over {MAX_VALUE_CHARS} characters (the "
                             "executor's reader limit)")
        attrs[key] = value
    missing = [k for k in required if k not in attrs]
    if missing:
        raise SynthError(f"{where}: <{tag}> lacks {', '.join(missing)} (the executor requires "
                         f"{', '.join(required)})")
    return attrs


def parse(text: str, source: str = "XML") -> Algorithm:
    """The algorithm in ``text``; SynthError naming ``source:line`` and the
    attribute for everything the executor's reader or loader would refuse."""
    if text.lstrip().startswith("<?"):
        raise SynthError(f"{source}:1: an XML declaration (<?xml ...?>): the executor's reader refuses it; "
                         "start the file with <algo")
    algo: Algorithm | None = None
    gpu: Gpu | None = None
    block: Block | None = None
    closed_algo = False
    step_open = False
    nodes = 0
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{source}:{number}"
        stripped = line.strip(" \r")
        if not stripped:
            continue
        if stripped.startswith("<!--"):
            if not stripped.endswith("-->") or "-->" in stripped[4:-3]:
                raise SynthError(f"{where}: a comment must close with --> at the end of its line (the executor's "
                                 "reader skips everything up to the first -->)")
            continue
        if "\t" in line.split("<", 1)[0]:
            raise SynthError(f"{where}: a tab before the tag: the executor's reader takes only spaces and newlines "
                             "between elements")
        match = _TAG.fullmatch(stripped)
        if not match:
            raise SynthError(f"{where}: not one whole tag with double-quoted attributes on its line: {stripped[:60]!r}")
        closing, tag, body, selfclose = match.groups()
        if not closing:
            nodes += 1
            if nodes > MAX_ELEMENTS:
                raise SynthError(f"{where}: more than {MAX_ELEMENTS} elements: over this checker's limit")
            siblings = (block.steps if block is not None else gpu.blocks if gpu is not None
                        else algo.gpus if algo is not None else ())
            if len(siblings) >= MAX_SUBS:
                raise SynthError(f"{where}: more than {MAX_SUBS} children in one element: the executor's reader "
                                 f"holds at most {MAX_SUBS}")
        if closed_algo:
            raise SynthError(f"{where}: <{tag}> after </algo>")
        if algo is None:
            if closing or tag != "algo":
                raise SynthError(f"{where}: the first element must be <algo> (the executor reads its attributes "
                                 f"from the first element), got <{closing}{tag}>")
            a = _attrs("algo", body, ALGO_ATTRS, where)
            algo = _algo(a, where)
            continue
        if step_open:
            if not (closing and tag == "step"):
                raise SynthError(f"{where}: <step> is not closed (write <step .../> or <step ...></step>)")
            step_open = False
            continue
        if closing:
            expected = "tb" if block else "gpu" if gpu else "algo"
            if tag != expected:
                raise SynthError(f"{where}: </{tag}> closes <{expected}>")
            if tag == "tb":
                block = None
            elif tag == "gpu":
                gpu = None
            else:
                closed_algo = True
            continue
        if tag == "gpu":
            if gpu is not None:
                raise SynthError(f"{where}: <gpu> inside <gpu>")
            a = _attrs("gpu", body, ("id", "i_chunks", "o_chunks", "s_chunks"), where)
            gpu = Gpu(*(_integer(a, k, where) for k in ("id", "i_chunks", "o_chunks", "s_chunks")), number)
            algo.gpus.append(gpu)
            if selfclose:
                gpu = None
        elif tag == "tb":
            if gpu is None or block is not None:
                raise SynthError(f"{where}: <tb> outside a <gpu>")
            a = _attrs("tb", body, TB_ATTRS, where)
            block = Block(*(_integer(a, k, where) for k in TB_ATTRS), number)
            gpu.blocks.append(block)
            if selfclose:
                block = None
        elif tag == "step":
            if block is None:
                raise SynthError(f"{where}: <step> outside a <tb>")
            a = _attrs("step", body, STEP_ATTRS, where)
            ints = {k: _integer(a, k, where) for k in STEP_ATTRS if k not in ("type", "srcbuf", "dstbuf")}
            block.steps.append(Step(ints["s"], a["type"], a["srcbuf"], ints["srcoff"], a["dstbuf"], ints["dstoff"],
                                    ints["cnt"], ints["depid"], ints["deps"], ints["hasdep"], number))
            step_open = not selfclose
        else:
            raise SynthError(f"{where}: unknown element <{tag}> (the executor skips it: a typo?)")
    if algo is None:
        raise SynthError(f"{source}: no <algo> element")
    if not closed_algo:
        raise SynthError(f"{source}: the file ends before </algo>")
    for g in algo.gpus:
        kept = 1 + len(algo.gpus) + len(g.blocks) + sum(len(b.steps) for b in g.blocks)
        if kept >= MAX_NODES:
            raise SynthError(f"{source}:{g.line}: gpu {g.id} reads {kept} elements (<algo>, every <gpu>, its own <tb> "
                             f"and <step>): the executor's XML reader holds fewer than {MAX_NODES}")
    return algo


def _algo(a: dict[str, str], where: str) -> Algorithm:
    if a["proto"] not in PROTOCOLS:
        raise SynthError(f"{where}: proto=\"{a['proto']}\": the executor knows {', '.join(PROTOCOLS)} (exact case)")
    if a["coll"] not in COLLECTIVES:
        hint = " (write reducescatter)" if a["coll"] == "reduce_scatter" else ""
        raise SynthError(f"{where}: coll=\"{a['coll']}\" is not a collective the executor loads{hint}")
    numbers = {k: _integer(a, k, where) for k in ("nchannels", "nchunksperloop", "ngpus", "inplace", "outofplace",
                                                   "minBytes", "maxBytes")}
    if not 1 <= numbers["nchannels"] <= MAX_CHANNELS:
        raise SynthError(f"{where}: nchannels={numbers['nchannels']}: must be 1..{MAX_CHANNELS}")
    for key, most, why in (("ngpus", MAX_GPUS, "one <gpu> per rank and the executor's reader holds at most "
                            f"{MAX_SUBS} children of <algo>"),
                           ("nchunksperloop", MAX_CHUNKS, f"step offsets are 16-bit (at most {MAX_OFFSET}) and "
                            "counts at most 71, so no step reaches a chunk beyond")):
        if not 1 <= numbers[key] <= most:
            raise SynthError(f"{where}: {key}={numbers[key]}: must be 1..{most} ({why})")
    if numbers["ngpus"] * numbers["nchunksperloop"] > MAX_CONTRIBUTIONS:
        raise SynthError(f"{where}: ngpus x nchunksperloop = {numbers['ngpus'] * numbers['nchunksperloop']}: over "
                         f"this checker's limit of {MAX_CONTRIBUTIONS} (the size of its symbolic run)")
    for key in ("inplace", "outofplace"):
        if numbers[key] not in (0, 1):
            raise SynthError(f"{where}: {key}={numbers[key]}: must be 0 or 1")
    if numbers["minBytes"] < 0 or numbers["maxBytes"] < 0 or (
            numbers["maxBytes"] and numbers["maxBytes"] < numbers["minBytes"]):
        raise SynthError(f"{where}: minBytes={numbers['minBytes']} maxBytes={numbers['maxBytes']}: no size selects "
                         "this algorithm (maxBytes 0 means unbounded)")
    return Algorithm(a, a["proto"], numbers["nchannels"], numbers["nchunksperloop"], numbers["ngpus"], a["coll"],
                     bool(numbers["inplace"]), bool(numbers["outofplace"]), numbers["minBytes"], numbers["maxBytes"],
                     [])


# ---------------------------------------------------------------- structure


def _extents(algo: Algorithm) -> dict[str, int]:
    """Chunks each buffer really has (i, o) for the collective."""
    n, g = algo.nchunksperloop, algo.ngpus
    if algo.coll == "allgather":
        return {"i": n // g, "o": n}
    if algo.coll == "reducescatter":
        return {"i": n, "o": n // g}
    return {"i": n, "o": n}


def check_structure(algo: Algorithm, source: str) -> None:
    """Everything the executor checks at load, and what it needs but does not check."""
    ids = sorted(g.id for g in algo.gpus)
    if ids != list(range(algo.ngpus)):
        more = "..." if len(ids) > 8 else ""
        raise SynthError(f"{source}: gpu ids {ids[:8]}{more}: need exactly 0..{algo.ngpus - 1} (ngpus={algo.ngpus})")
    if algo.coll in ("allgather", "reducescatter") and algo.nchunksperloop % algo.ngpus:
        raise SynthError(f"{source}: nchunksperloop={algo.nchunksperloop} is not a multiple of ngpus={algo.ngpus} "
                         f"for {algo.coll}")
    extents = _extents(algo)
    for gpu in algo.gpus:
        where = f"{source}:{gpu.line}: gpu {gpu.id}"
        for name, count in (("i_chunks", gpu.i_chunks), ("o_chunks", gpu.o_chunks), ("s_chunks", gpu.s_chunks)):
            if not 0 <= count <= MAX_CHUNKS:
                raise SynthError(f"{where}: {name}={count}: must be 0..{MAX_CHUNKS} (step offsets are 16-bit, at most "
                                 f"{MAX_OFFSET}, and counts at most 71)")
        if gpu.s_chunks * algo.ngpus > MAX_CONTRIBUTIONS * 2:
            raise SynthError(f"{where}: s_chunks={gpu.s_chunks} on {algo.ngpus} gpus: over this checker's limit of "
                             f"{MAX_CONTRIBUTIONS * 2} scratch chunks in all")
        sizes = {"i": gpu.i_chunks, "o": gpu.o_chunks, "s": gpu.s_chunks}
        for buf in ("i", "o"):
            if sizes[buf] > extents[buf]:
                raise SynthError(f"{where}: {buf}_chunks={sizes[buf]} but a {algo.coll} of nchunksperloop="
                                 f"{algo.nchunksperloop} on {algo.ngpus} gpus has {extents[buf]} {buf} chunks")
        blocks = sorted(b.id for b in gpu.blocks)
        if blocks != list(range(len(blocks))) or len(blocks) > MAX_TBS:
            raise SynthError(f"{where}: thread block ids {blocks[:8]}: must be 0, 1, ... without gaps or repeats "
                             f"(at most {MAX_TBS})")
        per_channel: Counter = Counter()
        connections: dict[tuple[str, int, int], int] = {}
        for b in gpu.blocks:
            bw = f"{source}:{b.line}: gpu {gpu.id} tb {b.id}"
            for role, peer in (("send", b.send), ("recv", b.recv)):
                if peer < -1 or peer == gpu.id or peer >= algo.ngpus:
                    raise SynthError(f"{bw}: {role}={peer}: must be -1 or another gpu 0..{algo.ngpus - 1}")
                if peer >= 0:
                    key = (role, b.chan, peer)
                    if key in connections:
                        raise SynthError(f"{bw}: {role}={peer} on chan {b.chan} is also tb {connections[key]}'s: "
                                         "NCCL has one connection per (peer, channel, direction)")
                    connections[key] = b.id
                    per_channel[(role, b.chan)] += 1
                    if per_channel[(role, b.chan)] > MAX_TBS_PER_CHANNEL:
                        raise SynthError(f"{bw}: more than {MAX_TBS_PER_CHANNEL} {role} thread blocks on chan "
                                         f"{b.chan}")
            if not 0 <= b.chan < algo.nchannels:
                raise SynthError(f"{bw}: chan={b.chan}: must be 0..nchannels-1 ({algo.nchannels - 1}); the executor "
                                 "connects only those channels")
            if len(b.steps) > MAX_STEPS:
                raise SynthError(f"{bw}: {len(b.steps)} steps; the executor allows {MAX_STEPS} per thread block")
            _check_steps(algo, gpu, b, sizes, source)
    for gpu in algo.gpus:
        for b in gpu.blocks:
            for st in b.steps:
                for depid, deps in st.waits:
                    target = next((t for t in gpu.blocks if t.id == depid), None)
                    where = f"{source}:{st.line}: gpu {gpu.id} tb {b.id} step {st.s}"
                    if target is None or not 0 <= deps < len(target.steps):
                        raise SynthError(f"{where}: depends on tb {depid} step {deps}, which does not exist")
                    if depid == b.id:
                        raise SynthError(f"{where}: depends on its own thread block (steps run in order anyway)")
                    if not any(t.hasdep for t in target.steps[deps:]):
                        raise SynthError(f"{where}: depends on tb {depid} step {deps}, but neither it nor a later step "
                                         "of that thread block has hasdep=\"1\": the executor never raises a flag that "
                                         "high and this step would wait forever")


def _check_steps(algo: Algorithm, gpu: Gpu, b: Block, sizes: dict[str, int], source: str) -> None:
    pending: list[tuple[int, int]] = []
    for n, st in enumerate(b.steps):
        where = f"{source}:{st.line}: gpu {gpu.id} tb {b.id} step {st.s}"
        if st.s != n:
            raise SynthError(f"{where}: s=\"{st.s}\" but it is step {n} of its thread block (number steps 0, 1, ... "
                             "in order: the executor counts them so)")
        if st.type not in STEP_TYPES:
            raise SynthError(f"{where}: type=\"{st.type}\" is not a step type ({', '.join(STEP_TYPES)})")
        for name in ("srcbuf", "dstbuf"):
            if getattr(st, name) not in ("i", "o", "s"):
                raise SynthError(f"{where}: {name}=\"{getattr(st, name)}\": must be i, o or s")
        if st.hasdep not in (0, 1):
            raise SynthError(f"{where}: hasdep={st.hasdep}: must be 0 or 1")
        if st.depid > MAX_DEPID or st.depid < -1:
            raise SynthError(f"{where}: depid={st.depid}: must be -1 or a thread block id up to {MAX_DEPID}")
        if st.depid >= 0 and st.deps < 0:
            raise SynthError(f"{where}: depid={st.depid} with deps={st.deps}: name the step waited for")
        if st.type == "nop":
            if st.depid < 0:
                raise SynthError(f"{where}: a nop without depid: the executor drops it and its step numbering "
                                 "shifts")
            pending.append((st.depid, st.deps))
            continue
        if pending and st.depid < 0:
            raise SynthError(f"{where}: follows nop dependencies but has no depid of its own (the executor refuses "
                             "this chain)")
        st.waits = pending + ([(st.depid, st.deps)] if st.depid >= 0 else [])
        pending = []
        if not 0 <= st.cnt < MAX_COUNT:
            raise SynthError(f"{where}: cnt={st.cnt}: must be 0..{MAX_COUNT - 1}")
        if st.type in SENDS and b.send < 0:
            raise SynthError(f"{where}: type {st.type} sends but the thread block has send=-1")
        if st.type in RECEIVES and b.recv < 0:
            raise SynthError(f"{where}: type {st.type} receives but the thread block has recv=-1")
        reads = st.type in ("s", "rrs", "rrc", "rrcs", "cpy", "re")
        writes = st.type in ("r", "rcs", "rrc", "rrcs", "cpy", "re")
        for used, buf, off in ((reads, st.srcbuf, st.srcoff), (writes, st.dstbuf, st.dstoff)):
            if used and off > MAX_OFFSET:
                raise SynthError(f"{where}: offset {off} in {buf}: the executor stores offsets in 16 bits (at most "
                                 f"{MAX_OFFSET})")
            if used and not (0 <= off and off + st.cnt <= sizes[buf]):
                raise SynthError(f"{where}: {buf}[{off}:{off + st.cnt}] is outside {buf}'s {sizes[buf]} chunks")
    if pending:
        raise SynthError(f"{source}:{b.line}: gpu {gpu.id} tb {b.id}: ends with nop steps (the executor drops them "
                         "with their dependencies)")


# ---------------------------------------------------------------- execution


class _Multisets:
    """Chunk values as multisets of (rank, input chunk): exact, and what
    failure messages describe (x2 for a contribution counted twice)."""

    def __init__(self, algo: Algorithm) -> None:
        pass

    @staticmethod
    def unit(rank: int, chunk: int) -> Counter:
        return Counter({(rank, chunk): 1})

    @staticmethod
    def add(a, b):
        if a is UNSET or b is UNSET:
            return UNSET
        return a + b

    @staticmethod
    def of(contributions) -> Counter:
        return Counter({c: 1 for c in contributions})

    def wanted(self, algo: Algorithm, rank: int, j: int) -> Counter:
        return self.of(_wanted(algo, rank, j))


class _Sums:
    """Chunk values as sums modulo the prime 2^61 - 1 of a fixed pseudo-random
    weight per (rank, input chunk): one integer per chunk whatever the file's
    size, and two values differ unless their multisets do, but for a chance
    of about 2^-61 per comparison (a nonzero linear form in random weights).
    The verdict of a run; a failure is run again with multisets to describe it."""

    PRIME = 2**61 - 1

    def __init__(self, algo: Algorithm) -> None:
        self.width = algo.nchunksperloop
        self._wanted: dict[tuple[int, int], int] = {}
        # the weights of every (rank, input chunk), at most MAX_CONTRIBUTIONS of them
        self._weights = [self._weight(key) for key in range(algo.ngpus * algo.nchunksperloop)]
        self._per_chunk_only = algo.coll == "allreduce"  # every rank wants the same sum of chunk j

    @staticmethod
    def _weight(key: int) -> int:
        """SplitMix64 of ``key``, reduced modulo the prime: a fixed pseudo-random weight."""
        z = (key + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        return (z ^ (z >> 31)) % _Sums.PRIME

    def unit(self, rank: int, chunk: int) -> int:
        return self._weights[rank * self.width + chunk]

    @staticmethod
    def add(a, b):
        if a is UNSET or b is UNSET:
            return UNSET
        return (a + b) % _Sums.PRIME

    def of(self, contributions) -> int:
        return sum(self._weights[q * self.width + c] for q, c in contributions) % self.PRIME

    def wanted(self, algo: Algorithm, rank: int, j: int) -> int:
        """:func:`_wanted` as a sum, computed once per chunk for every run."""
        key = (0 if self._per_chunk_only else rank, j)
        if key not in self._wanted:
            self._wanted[key] = self.of(_wanted(algo, rank, j))
        return self._wanted[key]




def _initial(algo: Algorithm, in_place: bool, values) -> list[dict[str, list]]:
    """Per gpu, its buffers as lists of chunk values (in place: views sharing
    the aliased chunks, as lists of one-element cells)."""
    n, g = algo.nchunksperloop, algo.ngpus
    out = []
    for gpu in sorted(algo.gpus, key=lambda x: x.id):
        r = gpu.id
        ext = _extents(algo)
        i_cells = [[values.unit(r, x)] for x in range(ext["i"])]
        o_cells = [[UNSET] for _ in range(ext["o"])]
        if in_place:
            if algo.coll == "allreduce":
                o_cells = i_cells
            elif algo.coll == "reducescatter":
                o_cells = i_cells[r * (n // g):(r + 1) * (n // g)]
            elif algo.coll == "allgather":
                o_cells = [[UNSET] for _ in range(n)]
                for x in range(n // g):
                    o_cells[r * (n // g) + x] = i_cells[x]
        out.append({"i": i_cells, "o": o_cells, "s": [[UNSET] for _ in range(max(0, gpu.s_chunks))]})
    return out


def execute(algo: Algorithm, in_place: bool, source: str, order: int = 0, values=None) -> list[dict[str, list]]:
    """Run the algorithm (see the module docstring); SynthError on a count
    mismatch or a deadlock. ``order`` picks which thread blocks run first
    when several can (0: by id, 1: reverse, more: seeded shuffles): a step
    whose dependencies are missing reads or overwrites memory too early in
    some order, which the postcondition then shows."""
    values = values or _Multisets(algo)
    add = values.add
    gpus = sorted(algo.gpus, key=lambda x: x.id)
    buffers = _initial(algo, in_place, values)
    keys = [(g.id, b.id) for g in gpus for b in g.blocks]
    if order == 1:
        keys.reverse()
    elif order > 1:
        random.Random(order).shuffle(keys)
    blocks = {key: b for key in keys for b in [next(x for x in gpus[key[0]].blocks if x.id == key[1])]}
    slot = {key: i for i, key in enumerate(keys)}  # a thread block's place in pc and in the schedule
    pc = [0] * len(keys)
    wires: dict[tuple[int, int, int], deque] = {}
    # each thread block's steps with what the loop asks of them, the buffers and connections bound once
    compiled = []
    for (gid, bid), b in blocks.items():
        mine = buffers[gid]
        inbox = wires.setdefault((b.recv, gid, b.chan), deque())
        outbox = wires.setdefault((gid, b.send, b.chan), deque())
        steps = []
        for st in b.steps:
            # a wait on (d, s) is released when tb d finishes its first step >= s with hasdep (flags only rise)
            waits = tuple((slot[(gid, d)], _flagged_from(blocks[(gid, d)], s)) for d, s in st.waits)
            t = st.type
            src = mine[st.srcbuf] if t in _READS_SOURCE else None
            dst = mine[st.dstbuf] if t in _WRITES else None
            steps.append((st, t == "nop", waits, t in RECEIVES, t in SENDS, _COMBINE.get(t, 0), src, st.srcoff,
                          dst, st.dstoff, st.cnt, t in _WRITES))
        compiled.append((gid, bid, b, steps, inbox, outbox, (gid, b.send, b.chan)))
    opened: dict[tuple[int, int, int], None] = {}  # connections in the order a send first reached them

    moved = True
    while moved:
        moved = False
        for i, (gid, bid, b, steps, inbox, outbox, send_key) in enumerate(compiled):
            at = pc[i]
            while at < len(steps):
                st, nop, waits, receives, sends, combine, src, srcoff, dst, dstoff, cnt, writes = steps[at]
                if nop:
                    at += 1
                    pc[i] = at
                    continue
                if waits and any(pc[d] - 1 < s for d, s in waits):
                    break
                if receives and not inbox:
                    break
                if sends:
                    opened[send_key] = None
                received = None
                if receives:
                    received = inbox.popleft()
                    if len(received) != cnt:
                        raise SynthError(f"{source}:{st.line}: gpu {gid} tb {bid} step {st.s} ({st.type}) receives "
                                         f"{cnt} chunk(s) but gpu {b.recv} sent {len(received)} on chan {b.chan}")
                local = [src[srcoff + j][0] for j in range(cnt)] if src is not None else None
                if combine == _ADD_RECEIVED:
                    value = [add(x, y) for x, y in zip(received, local)]
                elif combine == _TAKE_RECEIVED:
                    value = list(received)
                elif combine == _ADD_DESTINATION:
                    value = [add(dst[dstoff + j][0], y) for j, y in enumerate(local)]
                else:
                    value = local
                if writes:
                    for j, v in enumerate(value):
                        dst[dstoff + j][0] = v
                if sends:
                    outbox.append(value)
                at += 1
                pc[i] = at
                moved = True

    def done_through(gpu: int, tb: int) -> int:
        return pc[slot[(gpu, tb)]] - 1

    stuck = [(gid, b, b.steps[pc[slot[(gid, b.id)]]]) for (gid, _), b in blocks.items()
             if pc[slot[(gid, b.id)]] < len(b.steps)]
    if stuck:
        described = []
        for gid, b, st in stuck[:6]:
            reason = []
            late = [(d, s) for d, s in st.waits if done_through(gid, d) < _flagged_from(blocks[(gid, d)], s)]
            if late:
                reason.append("waits for " + ", ".join(f"tb {d} step {s}" for d, s in late))
            if st.type in RECEIVES and not wires.get((b.recv, gid, b.chan)):
                reason.append(f"a message from gpu {b.recv} on chan {b.chan}")
            described.append(f"gpu {gid} tb {b.id} step {st.s} ({st.type}, line {st.line}): {'; '.join(reason)}")
        raise SynthError(f"{source}: deadlock ({len(stuck)} thread block(s) stuck): " + " | ".join(described)
                         + (" | ..." if len(stuck) > 6 else ""))
    leftover = [(k, len(wires[k])) for k in opened if wires[k]]
    if leftover:
        (src, dst, chan), count = leftover[0]
        raise SynthError(f"{source}: gpu {src} sent {count} message(s) to gpu {dst} on chan {chan} that no step "
                         "receives")
    return buffers


def _flagged_from(block: Block, s: int) -> int:
    """The first step at or after ``s`` of ``block`` that raises its flag
    (check_structure makes sure there is one); computed once per block."""
    if block.next_flag is None:
        following, nxt = [0] * len(block.steps), len(block.steps)
        for n in range(len(block.steps) - 1, -1, -1):
            if block.steps[n].hasdep:
                nxt = n
            following[n] = nxt
        block.next_flag = following
    return block.next_flag[s]


def _wanted(algo: Algorithm, rank: int, j: int) -> list[tuple[int, int]]:
    """The contributions output chunk ``j`` of ``rank`` must hold, once each."""
    g = algo.ngpus
    shard = algo.nchunksperloop // g
    if algo.coll == "allreduce":
        return [(q, j) for q in range(g)]
    if algo.coll == "reducescatter":
        return [(q, rank * shard + j) for q in range(g)]
    return [(j // shard, j % shard)]


def _first_wrong(algo: Algorithm, buffers: list[dict[str, list]], values) -> tuple[int, int, object] | None:
    """(rank, output chunk, expected value) of the first output chunk that is
    not the collective's result, or None."""
    for r, mine in enumerate(buffers):
        out = mine["o"]
        for j in range(len(out)):
            want = values.wanted(algo, r, j)
            if out[j][0] != want:
                return r, j, want
    return None


def _postcondition(algo: Algorithm, in_place: bool, order: int, mode: str, source: str, sums: _Sums) -> None:
    """Run in one mode and schedule and check the result: with ``sums``,
    and with multisets again only to describe a wrong chunk (on files small
    enough: a multiset per chunk can hold every rank's contribution)."""
    wrong = _first_wrong(algo, execute(algo, in_place, source, order, sums), sums)
    if wrong is None:
        return
    if algo.ngpus * algo.nchunksperloop > MAX_DESCRIBED:
        r, j, _ = wrong
        raise SynthError(f"{source}: {algo.coll} {mode}: gpu {r} output chunk {j} does not hold "
                         f"{_describe(_Multisets.of(_wanted(algo, r, j)))}")
    exact = _Multisets(algo)
    buffers = execute(algo, in_place, source, order, exact)
    r, j, want = _first_wrong(algo, buffers, exact)
    got = buffers[r]["o"][j][0]
    raise SynthError(f"{source}: {algo.coll} {mode}: gpu {r} output chunk {j} holds {_describe(got)}, "
                     f"expected {_describe(want)}")


def _describe(value) -> str:
    if value is UNSET:
        return "uninitialised data"
    items = sorted(value.items())
    text = ", ".join(f"rank {q} chunk {c}" + (f" x{m}" if m != 1 else "") for (q, c), m in items[:4])
    return "{" + text + (", ..." if len(items) > 4 else "") + "}"


def check_algorithm(text: str, source: str = "XML") -> CheckResult:
    """Read, check and run an MSCCL XML in every mode it declares;
    SynthError naming the first problem."""
    algo = parse(text, source)
    check_structure(algo, source)
    if algo.coll not in CHECKED:
        raise SynthError(f"{source}: coll=\"{algo.coll}\" loads, but this checker runs allreduce, reducescatter and "
                         "allgather only")
    modes = []
    if algo.outofplace:
        modes.append("out-of-place")
    if algo.inplace:
        modes.append("in-place")
    if not modes:
        raise SynthError(f"{source}: inplace=\"0\" and outofplace=\"0\": no call ever selects this algorithm")
    sums = _Sums(algo)
    for mode in modes:
        for order in range(SCHEDULES):
            _postcondition(algo, mode == "in-place", order, mode + ("" if order == 0 else f", schedule {order}"),
                           source, sums)
    sizes = check_flow(algo, source)
    blocks = sum(len(g.blocks) for g in algo.gpus)
    steps = sum(len(b.steps) for g in algo.gpus for b in g.blocks)
    return CheckResult(algo.coll, algo.ngpus, algo.nchunksperloop, algo.proto, algo.nchannels, algo.min_bytes,
                       algo.max_bytes, tuple(modes), blocks, steps, tuple(sizes))


def check_file(path: str | Path) -> CheckResult:
    try:
        text = read_limited(path, "MSCCL XML", MAX_XML_BYTES)
    except FileNotFoundError:
        raise SynthError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SynthError(f"{path}: cannot read MSCCL XML ({exc})") from None
    return check_algorithm(text, str(path))
