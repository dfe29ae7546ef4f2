"""The price of an MSCCL file as written: its protocol, its channels per step
and its pieces, and the choices of those that the export makes with it.

Protocol. For each step's group, NCCL's ring protocol at a size
(:func:`synth.cost.nccl.choose` restricted to the ring), except that LL128 is
never written for a group that crosses nodes unless the topology states a
GPU-NIC path on which NCCL enables it (:func:`synth.cost.nccl.ll128_over_network`
with a stated ``nic_path``): NCCL enables LL128 off NVLink only where it was
tested, because elsewhere it may corrupt data silently (msccl-executor-nccl
c6f6b36d ``src/graph/tuning.cc:323-337``, the same rule as NVIDIA's NCCL).
A refused LL128 becomes the cheaper of LL and Simple in NCCL's own table.

Channels. NCCL runs a ring on the channels of its ring graph (``C``, each a
thread block moving its share); an MSCCL step runs on the channels the file
gives it (``instances``, piece ``p`` on the ``p mod instances``-th). A step
written with ``c`` channels gets ``min(c, C) / C`` of the ring's bandwidth,
each channel ``1 / c`` of that; its latency term is the ring's.

Price. Each program step's time for one piece is the project's ring model at
``size / pieces`` (:class:`synth.cost.predict.Predictor`, NCCL's protocol and
channels), split into its latency (the time at one byte) and the rest; the
latency is scaled by the ratio of the written protocol's ring latency to
NCCL's choice, the rest by the ratio of their bandwidths and by the channel
share (NCCL's table, :func:`synth.cost.nccl.cost_table`). The steps are then
pipelined as :func:`synth.cost.pipeline.pipelined_seconds` does, each channel
taking ``pieces / instances`` pieces, all channels at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..cost import Model
from ..cost.model import Algorithm
from ..cost.nccl import Comm, choose, comm_of, cost_table, ll128_over_network, ring_graph
from ..cost.pipeline import crossed_level, pipelined_seconds
from ..cost.predict import Predictor, lowered_loads
from ..synthesis.lowering import LoweredProgram
from ..synthesis.reduction import Reduction

LARGEST_PRICED_BYTES = 2**34  # protocols are compared at powers of two up to here; Simple beyond
PROTOCOL_NAMES = ("LL", "LL128", "Simple")


def ll128_allowed(comm: Comm) -> bool:
    """LL128 on ``comm``: within a node as NCCL decides (its table leaves
    LL128 out where NCCL disables it); across nodes only on a stated GPU-NIC
    path where NCCL enables it (module docstring)."""
    return comm.nodes == 1 or (comm.nic_path is not None and ll128_over_network(comm))


def ring_protocol(comm: Comm, collective, size_bytes: float) -> str:
    """The protocol of a ring of ``collective`` on ``comm`` at ``size_bytes``
    that the export writes (module docstring)."""
    protocol = choose(comm, collective, float(max(1, size_bytes)), ("ring",)).protocol
    if protocol != "LL128" or ll128_allowed(comm):
        return protocol
    table = cost_table(comm, collective)
    best = None
    for p in ("LL", "Simple"):
        entry = table.get(("ring", p))
        if entry is None:
            continue
        seconds = entry[0] + size_bytes / (1000 * entry[1])
        if best is None or seconds < best[0]:
            best = (seconds, p)
    return best[1] if best else "Simple"


def group_comm(reduction: Reduction, model: Model | None = None) -> Comm:
    """The communicator of one reduction group (every group is placed alike)."""
    version = model.rules_version if model is not None else None
    members = tuple(int(d) for d in reduction.reduction_groups[0])
    return comm_of(reduction.topology, members) if version is None else comm_of(reduction.topology, members,
                                                                                 version=version)


def protocol_ranges(reduction: Reduction, min_bytes: int, max_bytes: int | None,
                    model: Model | None = None) -> list[tuple[int, int | None, str]]:
    """``min_bytes..max_bytes`` (exclusive; None: unbounded) cut where the
    written protocol of the reduction group's ring changes, compared at the
    range's start and at every power of two inside it: ``(low, high, protocol)``."""
    comm = group_comm(reduction, model)
    collective = reduction.goal.collective
    points = [min_bytes] + [1 << k for k in range(LARGEST_PRICED_BYTES.bit_length())
                            if min_bytes < (1 << k) and (max_bytes is None or (1 << k) < max_bytes)]
    out: list[tuple[int, int | None, str]] = []
    for point in points:
        protocol = ring_protocol(comm, collective, point)
        if out and out[-1][2] == protocol:
            continue
        if out:
            out[-1] = (out[-1][0], point, out[-1][2])
        out.append((point, max_bytes, protocol))
    return out


@dataclass(frozen=True)
class FilePrice:
    """A file's price as written at one size, and what it is made of."""

    seconds: float
    protocol: str
    pieces: int
    instances: int
    piece_step_s: tuple[float, ...]
    step_levels: tuple[int, ...]
    ring_channels: tuple[int, ...]  # NCCL's ring channels of each step's group


class FilePricer:
    """Prices of one program on one reduction as files of several protocols,
    pieces and channels per step; the per-step model is built once."""

    def __init__(self, lowered: LoweredProgram, reduction: Reduction, model: Model | None = None) -> None:
        model = model or Model()
        self.lowered, self.reduction = lowered, reduction
        ring = Model(Algorithm.RING, model.profile, model.profile_path, model.nccl_version)
        self.predictor = Predictor(reduction, ring)
        self.loads = lowered_loads(lowered)
        first = set(lowered.reduction_groups[0])
        self.comms = []
        self.levels = []
        for step in lowered.steps:
            group = next((g for g in step.groups if g[0] in first), step.groups[0])
            self.comms.append(comm_of(reduction.topology, tuple(int(d) for d in group)))
            self.levels.append(min((crossed_level(reduction.topology, g) for g in step.groups if g[0] in first),
                                   default=0))

    def _step_seconds(self, i: int, piece_bytes: float, protocol: str, channels: int) -> tuple[float, int]:
        instruction, load = self.lowered.program.instructions[i], self.loads[i]
        comm = self.comms[i]
        collective = instruction.collective
        whole = self.predictor.step(instruction, load, piece_bytes)[0]
        latency = self.predictor.step(instruction, load, 1.0)[0]
        table = cost_table(comm, collective)
        graph = ring_graph(comm).channels if comm.ranks > 1 else 1
        nccl = choose(comm, collective, float(max(1.0, piece_bytes)), ("ring",)).protocol
        mine, theirs = table.get(("ring", protocol)), table.get(("ring", nccl))
        lat_ratio = bw_ratio = 1.0
        if mine and theirs:
            lat_ratio, bw_ratio = mine[0] / theirs[0], theirs[1] / mine[1]
        # the step's channels move a piece each at once, each with 1/channels of their share of the ring's bandwidth
        share = min(channels, graph) / graph
        return latency * lat_ratio + max(0.0, whole - latency) * bw_ratio * channels / share, graph

    def price(self, size_bytes: float, protocol: str, pieces: int, instances: int) -> FilePrice:
        """The file's time at ``size_bytes`` (module docstring)."""
        used = min(instances, pieces)
        per_channel = -(-pieces // used)
        steps = [self._step_seconds(i, float(size_bytes) / pieces, protocol, used)
                 for i in range(len(self.lowered.steps))]
        per_piece = tuple(t for t, _ in steps)
        seconds = pipelined_seconds(per_piece, self.levels, per_channel)
        return FilePrice(seconds, protocol, pieces, used, per_piece, tuple(self.levels), tuple(g for _, g in steps))


def layouts(pieces_tried: Sequence[int], instances_tried: Sequence[int]) -> list[tuple[int, int]]:
    """(pieces, instances) pairs where the channels divide the pieces."""
    return [(p, c) for p in pieces_tried for c in instances_tried if c <= p and p % c == 0]
