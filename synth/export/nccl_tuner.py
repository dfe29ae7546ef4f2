"""NCCL tuner rules from a plan: the CSV of NCCL's example tuner plugin
(``NCCL_TUNER_CONFIG_FILE``) and the coarser ``NCCL_ALGO``/``NCCL_PROTO``
strings, for the collectives a plan's reductions call as single library calls.

Format followed: NVIDIA/nccl at commit 5067397c (2026-06-11),
``plugins/tuner/example/plugin.c``: one rule per line (lines of at most 255
characters; ``#`` at the start of a line comments it out), 8 to 10
comma-separated fields ``collective_type,min_bytes,max_bytes,algorithm,
protocol,channels,nNodes,nRanks[,numPipeOps[,regBuff]]`` with surrounding
blanks trimmed; collective ``broadcast|reduce|allgather|reducescatter|
allreduce``, algorithm ``tree|ring|collnet_direct|collnet_chain|nvls|
nvls_tree|pat``, protocol ``ll|ll128|simple`` (exact case: an unknown name is
silently read as allreduce, ring or simple); sizes in bytes, both bounds
inclusive, compared with the call's bytes (count x type size, x ranks for
allgather and reducescatter: ``ncclFuncMaxSendRecvCount`` in
``src/include/enqueue.h``); ``-1`` matches any node count, rank count,
pipeline-op count or buffer registration, and keeps NCCL's channel count. The
first matching rule applies. ``NCCL_ALGO``/``NCCL_PROTO`` take
``collective:list`` entries separated by ``;`` (``src/graph/tuning.cc``
``parseList``, names case-insensitive) and cannot depend on size.

Choice. For each reduction group shape (nodes, ranks) of the plan, and for
each of the collectives a trainer calls on such a group (all-reduce,
reduce-scatter, all-gather: the plan's goal and the other two), and each
power-of-two size from 1 B to 8 GiB, every algorithm NCCL has for the group is
priced by the project's cost model forced to it (``synth.cost``: NCCL's
protocol and channel choice within the algorithm, the calibrated link
parameters); the fastest names the rule for the sizes from that power of two
to just below the next, and equal neighbours are merged.

Channels. Every rule states the channels NCCL itself would run the call on
(:func:`synth.cost.nccl.kernel_ctas`: for ring and tree the communicator's
channels, fewer for small calls, ``src/enqueue.cc:2070-2097`` at the commit
above; for NVLS and NVLS Tree the communicator's ``nvlsChannels``, 16 on an
H100, ``src/enqueue.cc:1845-1847`` at v2.27.7-1, not the NVLS graph's heads
the cost model prices the bandwidth with), and a
range is cut where that count changes. The example plugin never keeps
NCCL's count: it sets ``*nChannels = 1`` before matching
(``plugins/tuner/example/plugin.c:361``) and a rule's ``-1`` leaves that 1
(``:406-408``); NCCL then runs the call on the plugin's count
(``src/enqueue.cc:2178``). A call that matches no rule gets 1 channel too,
which is why every collective of every group shape gets rules for every size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..cost import Model
from ..cost.model import Algorithm
from ..cost.nccl import choose, comm_of, kernel_ctas
from ..cost.predict import Predictor, default_program, lowered_loads
from ..errors import SynthError
from ..synthesis.lowering import lower
from ..synthesis.reduction import Reduction
from ..synthesis.semantics import Goal

MAX_BYTES = 2**64 - 1  # size_t: every size
LARGEST_PRICED_BYTES = 2**33
MAX_LINE = 255
COLLECTIVES = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce")
ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
PROTOCOLS = ("ll", "ll128", "simple")
HEADER = "collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff"
_PLUGIN_ALGO = {"nvlstree": "nvls_tree"}
_ENV_ALGO = {"tree": "Tree", "ring": "Ring", "nvls": "NVLS", "nvls_tree": "NVLSTree", "pat": "PAT",
             "collnet_direct": "CollNetDirect", "collnet_chain": "CollNetChain"}
_ENV_PROTO = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}
_ENV_FUNC = {"allreduce": "AllReduce", "reducescatter": "ReduceScatter", "allgather": "AllGather",
             "broadcast": "Broadcast", "reduce": "Reduce"}


@dataclass(frozen=True)
class TunerRule:
    """One line of the plugin's CSV; ``reduce`` says which reduction it is for."""

    collective: str
    min_bytes: int
    max_bytes: int
    algorithm: str
    protocol: str
    channels: int
    nodes: int
    ranks: int
    reduce: tuple[str, ...] = ()

    def line(self) -> str:
        return (f"{self.collective},{self.min_bytes},{self.max_bytes},{self.algorithm},{self.protocol},"
                f"{self.channels},{self.nodes},{self.ranks},-1,-1")

    def to_dict(self) -> dict:
        return {"collective": self.collective, "min_bytes": self.min_bytes, "max_bytes": self.max_bytes,
                "algorithm": self.algorithm, "protocol": self.protocol, "channels": self.channels,
                "nNodes": self.nodes, "nRanks": self.ranks, "reduce": list(self.reduce)}


FORCED = (Algorithm.RING, Algorithm.TREE, Algorithm.NVLS, Algorithm.NVLS_TREE, Algorithm.PAT)


class _Pricer:
    """One library call of a reduction's goal priced under each algorithm NCCL
    has for the group; built once per reduction, asked at every size."""

    def __init__(self, reduction, model: Model) -> None:
        self.program = default_program(reduction.goal)
        self.loads = lowered_loads(lower(self.program, reduction))
        self.comm = comm_of(reduction.topology, tuple(int(d) for d in reduction.reduction_groups[0]),
                            version=model.rules_version)
        self.collective = reduction.goal.collective
        self.predictors = {a: Predictor(reduction, model.with_algorithm(a)) for a in FORCED}

    def best(self, size: int) -> tuple[str, str]:
        """The (NCCL algorithm, protocol) priced fastest at ``size`` bytes per device."""
        best: tuple[float, tuple[str, str]] | None = None
        for algorithm, predictor in self.predictors.items():
            choice = choose(self.comm, self.collective, float(size), algorithm.forced)
            if choice.algorithm != algorithm.value:
                continue  # NCCL has no such algorithm for this group: it would run its ring
            seconds = predictor.program(self.program, self.loads, float(size))
            if best is None or seconds < best[0]:
                best = (seconds, (choice.algorithm, choice.protocol))
        assert best is not None  # the ring always exists
        return best[1]

    def channels(self, algorithm: str, protocol: str, size: int) -> int:
        """The channels NCCL runs the call on (module docstring)."""
        return kernel_ctas(self.comm, algorithm, protocol, float(size))

    def rules(self, low: int, high: int, algorithm: str, protocol: str) -> list[tuple[int, int, str, str, int]]:
        """``low..high`` (inclusive) cut where the channel count changes (it
        only grows with the size): ``(low, high, algorithm, protocol, channels)``."""
        out = []
        while low <= high:
            channels = self.channels(algorithm, protocol, low)
            a, b = low, high  # the last size with this count: the count is monotone, so bisect
            if self.channels(algorithm, protocol, min(high, LARGEST_PRICED_BYTES)) == channels:
                a = high
            else:
                b = min(high, LARGEST_PRICED_BYTES)
                while b - a > 1:
                    middle = (a + b) // 2
                    if self.channels(algorithm, protocol, middle) == channels:
                        a = middle
                    else:
                        b = middle
            out.append((low, a, _PLUGIN_ALGO.get(algorithm, algorithm), protocol.lower(), channels))
            low = a + 1
        return out


def plan_rules(plan, model: Model | None = None) -> list[TunerRule]:
    """Rules for every group shape (nodes, ranks) of ``plan``'s reductions and
    every collective a trainer calls on it (the reduction's goal first, then
    the other goals), each shape and collective once (the first reduction's),
    covering every size with explicit channels (module docstring)."""
    model = model or Model()
    rules: list[TunerRule] = []
    seen: set[tuple[str, int, int]] = set()
    for planned in plan.reductions:
        first = planned.reduction
        comm = comm_of(first.topology, tuple(int(d) for d in first.reduction_groups[0]), version=model.rules_version)
        if comm.ranks < 2:
            continue
        for goal in [first.goal] + [g for g in Goal if g is not first.goal]:
            key = (goal.value, comm.nodes, comm.ranks)
            if key in seen:
                continue
            seen.add(key)
            reduction = first if goal is first.goal else Reduction.of(first.placement, first.axes, goal)
            pricer = _Pricer(reduction, model)
            ranges: list[tuple[int, int, tuple[str, str]]] = []
            for power in range(LARGEST_PRICED_BYTES.bit_length()):
                choice = pricer.best(1 << power)
                low = 0 if power == 0 else 1 << power
                if ranges and ranges[-1][2] == choice:
                    ranges[-1] = (ranges[-1][0], low, choice)
                else:
                    ranges.append((low, low, choice))
            ranges[-1] = (ranges[-1][0], MAX_BYTES, ranges[-1][2])
            bounds = [(a, (ranges[n + 1][0] - 1) if n + 1 < len(ranges) else MAX_BYTES, c)
                      for n, (a, _, c) in enumerate(ranges)]
            for low, high, (algorithm, protocol) in bounds:
                for a, b, name, proto, channels in pricer.rules(low, high, algorithm, protocol):
                    rules.append(TunerRule(key[0], a, b, name, proto, channels, comm.nodes, comm.ranks,
                                           first.axes))
    return rules


def tuner_csv(rules: Sequence[TunerRule], source: str) -> str:
    lines = [f"# NCCL example tuner plugin rules (NCCL_TUNER_CONFIG_FILE) for {source}",
             "# written by synth-reduce export --format nccl-tuner; first matching line applies", f"# {HEADER}"]
    lines += [f"# reduce {','.join(r.reduce)}\n{r.line()}" if i == 0 or rules[i - 1].reduce != r.reduce else r.line()
              for i, r in enumerate(rules)]
    return "\n".join(lines) + "\n"


def nccl_env(rules: Sequence[TunerRule]) -> dict[str, str]:
    """``NCCL_ALGO`` and ``NCCL_PROTO``: per collective, every algorithm and
    protocol its rules use (NCCL then picks among them by its own tuning)."""
    algos: dict[str, list[str]] = {}
    protos: dict[str, list[str]] = {}
    for r in rules:
        for table, value in ((algos, _ENV_ALGO[r.algorithm]), (protos, _ENV_PROTO[r.protocol])):
            names = table.setdefault(_ENV_FUNC[r.collective], [])
            if value not in names:
                names.append(value)
    return {"NCCL_ALGO": ";".join(f"{f}:{','.join(v)}" for f, v in algos.items()),
            "NCCL_PROTO": ";".join(f"{f}:{','.join(v)}" for f, v in protos.items())}


# ---------------------------------------------------------------- the plugin's reading, checked


def check_tuner_csv(text: str, source: str = "CSV") -> list[TunerRule]:
    """Read a rules file as the example plugin does and refuse what it would
    misread silently: lines over 255 characters (cut), other than 8 to 10
    fields, unknown collective, algorithm or protocol names (read as
    allreduce, ring, simple), numbers that are not integers, empty ranges,
    and rules that an earlier one hides (same collective, nodes, ranks,
    pipeline ops and registration over overlapping sizes, so the later one
    never applies)."""
    rules: list[tuple[TunerRule, int, int, int]] = []
    for number, line in enumerate(text.split("\n"), 1):
        where = f"{source}:{number}"
        if not line or line.startswith("#"):
            continue
        if len(line) > MAX_LINE - 1:
            raise SynthError(f"{where}: {len(line)} characters; the plugin reads at most {MAX_LINE - 1} per line")
        fields = [f.strip(" \t") for f in line.split(",") if f]  # strtok skips empty fields
        if not 8 <= len(fields) <= 10:
            raise SynthError(f"{where}: {len(fields)} fields; the plugin needs 8 to 10 ({HEADER})")
        collective, algorithm, protocol = fields[0], fields[3], fields[4]
        for value, known, what in ((collective, COLLECTIVES, "collective"), (algorithm, ALGORITHMS, "algorithm"),
                                   (protocol, PROTOCOLS, "protocol")):
            if value not in known:
                raise SynthError(f"{where}: {what} '{value}' is not one the plugin knows ({', '.join(known)}); it "
                                 "would silently use its default")
        numbers = []
        for i in (1, 2, 5, 6, 7, 8, 9):
            if i >= len(fields):
                numbers.append(-1)
                continue
            if not (fields[i].isdigit() or (fields[i].startswith("-") and fields[i][1:].isdigit())):
                raise SynthError(f"{where}: field {i + 1} '{fields[i]}' is not an integer")
            numbers.append(int(fields[i]))
        low, high, channels, nodes, ranks, pipe_ops, reg = numbers
        if low < 0 or high > MAX_BYTES or low > high:
            raise SynthError(f"{where}: sizes {low}..{high}: need 0 <= min_bytes <= max_bytes <= {MAX_BYTES}")
        for value, name in ((channels, "channels"), (nodes, "nNodes"), (ranks, "nRanks"), (pipe_ops, "numPipeOps")):
            if value == 0 or value < -1:
                raise SynthError(f"{where}: {name} {value}: -1 (any / NCCL's default) or a positive count")
        if reg not in (-1, 0, 1):
            raise SynthError(f"{where}: regBuff {reg}: -1, 0 or 1")
        rule = TunerRule(collective, low, high, algorithm, protocol, channels, nodes, ranks)
        shape = (collective, nodes, ranks, pipe_ops, reg)
        for earlier, line_no, ops, rb in rules:
            if (earlier.collective, earlier.nodes, earlier.ranks, ops, rb) == shape \
                    and earlier.min_bytes <= high and low <= earlier.max_bytes:
                raise SynthError(f"{where}: sizes {low}..{high} overlap line {line_no}'s {earlier.min_bytes}.."
                                 f"{earlier.max_bytes} for the same {collective} shape; the first matching line "
                                 "applies, so this one is hidden there")
        rules.append((rule, number, pipe_ops, reg))
    return [r for r, _, _, _ in rules]
