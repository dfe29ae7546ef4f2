"""Predicted seconds of a step and of a program, for one reduction and model.

A step runs all its groups at once, so a step's cost is the rounds of its
collective's algorithm (:mod:`synth.cost.algorithms`) with every group's flows
in each round contending for the links (:mod:`synth.cost.links`), plus latency:

* NCCL models: the algorithm and protocol NCCL picks for the group's shape and
  the step's bytes (:mod:`synth.cost.nccl`); its transfers spread over the rail
  NICs of the group's GPUs (lanes), at the share of the links the call's
  channels take (a small call runs on fewer channels than the communicator
  has: :func:`synth.cost.nccl.call_channels`); latency = the base latency of the
  (algorithm, protocol) + its steps per level x the level's latency for that
  protocol (:func:`synth.cost.algorithms.nccl_hops`);
* MPI model: OpenMPI's algorithm; each round pays the latency of the levels its
  slowest flow crosses; plus the per-call overhead.

A program's cost is the sum of its steps'.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..caches import memoised, register_table
from ..caches import clear_caches as _clear_registered
from ..synthesis.language import Collective, Form, Instruction, Program
from ..synthesis.lowering import LoweredProgram
from ..synthesis.reduction import Reduction
from ..synthesis.semantics import Goal, Hierarchy, Loads, resolve_rows
from ..topology import Topology
from .algorithms import Round, buckets_at, mpi_algorithm, nccl_hops, nccl_rounds, rail_lanes, rounds_of
from .links import Links, RoundGeometry, canonical_devices, group_scales, links_of, round_cost, round_geometry
from .model import Algorithm, Model
from .nccl import PROTOCOLS, call_channels, choose, comm_of, kernel_ctas, node_level, streaming_multiprocessors
from .profile import NetworkProfile
from .terms import Features


@dataclass(frozen=True)
class StepPricing:
    """What prices a step besides its groups and bytes: the topology and its
    profile, the model's algorithm, the collective, and what NCCL's choice reads
    (``nvls_enabled`` False = ``NCCL_NVLS_ENABLE=0``; ``nccl_version`` the release
    whose rules choose, None = the newest transcribed; ``dtype`` and ``op``;
    ``allowed`` the algorithms ``NCCL_ALGO`` lets NCCL choose from, None = the
    model's algorithm decides; ``protocols`` those of ``NCCL_PROTO``, None = all)."""

    topology: Topology
    profile: NetworkProfile
    algorithm: Algorithm
    collective: Collective
    nvls_enabled: bool = True
    nccl_version: str | None = None
    dtype: str = "float32"
    op: str = "sum"
    allowed: tuple[str, ...] | None = None
    protocols: tuple[str, ...] | None = None


def step_cost(
    topology: Topology,
    profile: NetworkProfile,
    algorithm: Algorithm,
    collective: Collective,
    groups: np.ndarray,
    nbytes: np.ndarray,
    nvls_enabled: bool = True,
    nccl_version: str | None = None,
    dtype: str = "float32",
    op: str = "sum",
    allowed: tuple[str, ...] | None = None,
    protocols: tuple[str, ...] | None = None,
) -> tuple[float, Features]:
    """Seconds of one step and its critical-path features. ``groups`` is an
    (n, m) array of device ids (n groups of m members, all at once) and
    ``nbytes`` the bytes each group's collective moves. The NCCL models run what
    :func:`synth.cost.nccl.choose` picks for group 0 at the largest ``nbytes``
    (the other arguments: :class:`StepPricing`)."""
    groups = np.sort(np.asarray(groups), axis=1)  # ring and tree order: device ids
    pricing = StepPricing(topology, profile, algorithm, collective, nvls_enabled, nccl_version, dtype, op, allowed,
                          protocols)
    return ordered_step_cost(pricing, groups, nbytes)


def ordered_step_cost(pricing: StepPricing, groups: np.ndarray, nbytes: np.ndarray) -> tuple[float, Features]:
    """:func:`step_cost` of ``groups`` whose rows are already in ring and tree
    order: sorted by device id, or the image of sorted rows under a symmetry of
    the topology (:func:`~synth.cost.links.canonical_devices`; the cost is the
    same, to the bit, as that of the sorted rows).

    NCCL's ring all-reduce is a reduce-scatter and an all-gather of the same
    buffer run as one call, so it is priced no dearer than with the protocol
    NCCL picks for either phase as a call of its own: NCCL picks each
    collective's protocol from its own table, whose per-collective factors
    (LL's quarter of the bus for an all-reduce against a third for the other
    two, the per-collective LL128 caps) are how it chooses, not what a
    protocol costs (:mod:`synth.cost.priors`); without this, the pick and the
    model's costs of the protocols could make one all-reduce dearer than the
    two calls it is made of."""
    topology, profile, algorithm, collective = pricing.topology, pricing.profile, pricing.algorithm, pricing.collective
    links = links_of(topology)
    nbytes = np.asarray(nbytes, dtype=float)
    scales = group_scales(topology, groups) if links.graph_level is not None else None
    if algorithm is Algorithm.MPI:
        return _mpi_step(links, profile, collective, groups, nbytes, scales)
    features = Features.zero(len(topology.levels))
    if groups.shape[1] < 2:
        return 0.0, features
    forced = algorithm.forced if pricing.allowed is None else pricing.allowed
    plan = _nccl_plan(topology, tuple(groups[0].tolist()), collective, float(nbytes.max()), forced,
                      pricing.nvls_enabled, pricing.nccl_version, pricing.dtype, pricing.op, pricing.protocols)
    moved = _add_rounds(links, profile, plan.key, plan.pattern, groups, nbytes, features, plan.lanes, nccl=True,
                        scales=scales)
    load = features.load.pop(plan.key)  # bytes over rate at the chosen key's efficiency, every channel
    total, protocol, key, factor = min(
        (moved * profile.efficiency_of(plan.key) / profile.efficiency_of(k) * f
         + float(profile.protocol_latency_s[:, p] @ plan.hops) + profile.base_us(k) * 1e-6, p, k, f)
        for p, k, f in plan.protocols)
    features.load[key] = load * factor  # a small call runs on fewer channels: its bytes move that much slower
    features.steps[:, protocol] = plan.hops
    features.base_count[key] = 1.0
    return total, features


@dataclass(frozen=True)
class _NcclPlan:
    """What NCCL runs for one group and size: the ``algorithm.protocol`` key NCCL
    picks, the rounds, the lanes per level, the latency steps per level, and
    ``protocols``: the protocols the call is priced with, the least of them
    (NCCL's pick; for a ring all-reduce also those NCCL picks for a ring
    reduce-scatter and a ring all-gather of the same buffer, its two phases:
    see :func:`ordered_step_cost`), as (protocol index, key, the
    communicator's channels / the call's: :func:`synth.cost.nccl.call_channels`)."""

    key: str
    pattern: tuple[Round, ...]
    lanes: np.ndarray
    hops: np.ndarray
    protocols: tuple[tuple[int, str, float], ...]


@memoised(maxsize=16384)
def _nccl_plan(topology: Topology, members: tuple[int, ...], collective: Collective, nbytes: float,
               forced: tuple[str, ...] | None, nvls_enabled: bool, nccl_version: str | None = None,
               dtype: str = "float32", op: str = "sum", protocols: tuple[str, ...] | None = None) -> _NcclPlan:
    comm = comm_of(topology, members, nvls_enabled, nccl_version)
    choice = choose(comm, collective, nbytes, forced, dtype, op, protocols)
    pattern, lanes, hops = _nccl_shape(topology, members, choice.algorithm, collective)
    names = [choice.protocol]
    if choice.algorithm == "ring" and collective is Collective.ALLREDUCE:  # its two phases' own protocols
        names += [choose(comm, phase, nbytes, ("ring",), dtype, op, protocols).protocol
                  for phase in (Collective.REDUCESCATTER, Collective.ALLGATHER)]
    names = [p for p in PROTOCOLS if p in names]
    alternatives = []
    for p in names:
        used, full = call_channels(comm, choice.algorithm, p, nbytes)
        alternatives.append((PROTOCOLS.index(p), f"{choice.algorithm}.{p}", full / used))
    return _NcclPlan(choice.key, pattern, lanes, hops, tuple(alternatives))


@memoised(maxsize=4096)
def _nccl_shape(
    topology: Topology, members: tuple[int, ...], algorithm: str, collective: Collective
) -> tuple[tuple[Round, ...], np.ndarray, np.ndarray]:
    """The rounds, the lanes per level and the latency steps per level of NCCL's
    ``algorithm`` over one group (see :mod:`synth.cost.algorithms`)."""
    links = links_of(topology)
    buckets = buckets_at(links, members, node_level(topology))
    pattern = nccl_rounds(algorithm, collective, len(members), buckets)
    lanes = rail_lanes(links, members, rails=algorithm not in ("nvlstree", "pat"))
    return pattern, lanes, nccl_hops(links, members, algorithm, collective, buckets)


def clear_caches() -> None:
    """Forget every memo of the cost stage (NCCL choices, link graphs, group
    shapes, synthesis groups, round geometries, the step costs shared between
    predictors: everything registered in :mod:`synth.caches` by a module of
    ``synth.cost``), for timing cold predictions."""
    _clear_registered("synth.cost")


def _mpi_step(links: Links, profile: NetworkProfile, collective: Collective, groups: np.ndarray,
              nbytes: np.ndarray, scales: np.ndarray | None = None) -> tuple[float, Features]:
    """A step of the MPI model: OpenMPI's algorithm for the group size and the
    largest message, latency per level crossed and round, a call overhead."""
    features = Features.zero(len(links.counts))
    m = groups.shape[1]
    pattern = rounds_of(mpi_algorithm(collective, m, float(nbytes.max())), collective, m)
    total = _add_rounds(links, profile, collective.value, pattern, groups, nbytes, features, scales=scales)
    features.calls = 1.0
    return total + profile.call_overhead_us * 1e-6, features


def _add_rounds(links: Links, profile: NetworkProfile, key: str, pattern: tuple[Round, ...], groups: np.ndarray,
                nbytes: np.ndarray, features: Features, lanes: np.ndarray | None = None,
                nccl: bool = False, scales: np.ndarray | None = None) -> float:
    """Seconds of ``pattern`` run by every group at once; adds its features.
    ``nccl``: transfer times only (latency is counted per step), GPUDirect RDMA.
    ``scales``: per group, its share of the link-graph level (links.group_scales)."""
    total = 0.0
    groups_key = content_key(groups)  # one digest for every round of the step
    for rnd in pattern:
        if not rnd.src:
            continue
        src_i, _, fraction = rnd.arrays
        flow_bytes = (nbytes[:, None] * fraction[None, :]).ravel()
        flow_scale = None if scales is None else np.repeat(scales, len(src_i))
        geometry = _geometry(links, profile, rnd, groups, groups_key, lanes, nccl, flow_scale)
        seconds, f = round_cost(links, profile, key, None, None, flow_bytes, lanes, latency=not nccl, rdma=nccl,
                                geometry=geometry)
        total += rnd.repeat * seconds
        features.add(f, rnd.repeat)
        if rnd.extra and not nccl:
            hop = f.latency_count
            total += rnd.extra * float(profile.latency_s @ hop)
            features.latency_count = features.latency_count + rnd.extra * hop
    return total


# Round geometries shared by the steps that send the same flows, whatever their
# bytes (the ring of an AllReduce, a ReduceScatter and an AllGather over the same
# groups; the same groups at other sizes): (links' identity, bandwidths, groups'
# content key, round, lanes, rdma) -> (links, geometry); emptied past
# _GEOMETRIES_LIMIT and by clear_caches
_GEOMETRIES: dict[tuple, tuple[Links, RoundGeometry]] = register_table({}, __name__, "_GEOMETRIES")
_GEOMETRIES_LIMIT = 1 << 14


def content_key(array: np.ndarray) -> tuple:
    """A hashable key of ``array``'s value: dtype, shape and the SHA-256 digest
    of its bytes (32 bytes, where the bytes themselves are up to a megabyte per
    step at 131,072 devices and were kept by every memo entry; a collision
    would need two distinct arrays with one SHA-256 digest)."""
    data = np.ascontiguousarray(array)
    return array.dtype.str, array.shape, hashlib.sha256(data.data).digest()


def _geometry(links: Links, profile: NetworkProfile, rnd: Round, groups: np.ndarray, groups_key: tuple,
              lanes: np.ndarray | None, rdma: bool, scale: np.ndarray | None = None) -> RoundGeometry:
    """:func:`~synth.cost.links.round_geometry` of a round of ``groups`` (its
    flows, group-major: every group's ``rnd.src[i] -> rnd.dst[i]``), memoised."""
    key = (id(links), profile.bandwidth_GBps, groups_key, rnd.src, rnd.dst,
           None if lanes is None else lanes.tobytes(), rdma)
    found = _GEOMETRIES.get(key)
    if found is not None and found[0] is links:
        return found[1]
    if len(_GEOMETRIES) >= _GEOMETRIES_LIMIT:
        _GEOMETRIES.clear()
    src_i, dst_i, _ = rnd.arrays
    src = np.take(groups, src_i, axis=1).ravel()  # take: several times faster than groups[:, src_i]
    dst = np.take(groups, dst_i, axis=1).ravel()
    geometry = round_geometry(links, profile.bandwidth_Bps, src, dst, lanes, rdma, scale)
    _GEOMETRIES[key] = (links, geometry)
    return geometry


def step_channels(topology: Topology, algorithm: Algorithm, collective: Collective, groups: np.ndarray,
                  nbytes: np.ndarray, nccl_version: str | None = None) -> int:
    """The channels, hence thread blocks (CTAs), each device's kernel of one
    step runs on (0 under the MPI model: no kernel): those of the call
    :func:`ordered_step_cost` prices (NCCL's pick for group 0 at the largest
    ``nbytes``, :func:`synth.cost.nccl.kernel_ctas`), each CTA held on one SM
    for the kernel's life."""
    if algorithm is Algorithm.MPI or groups.shape[1] < 2 or not len(nbytes):
        return 0
    comm = comm_of(topology, tuple(int(d) for d in groups[0]), True, nccl_version)
    choice = choose(comm, collective, float(np.max(nbytes)), algorithm.forced)
    return kernel_ctas(comm, choice.algorithm, choice.protocol, float(np.max(nbytes)))


def default_program(goal: Goal) -> Program:
    """The library's one-call collective over each whole reduction group."""
    return Program((Instruction(goal.collective, "root", Form.INSIDE),))


@memoised(maxsize=4096)
def _synthesis_groups(instruction: Instruction, hierarchy: Hierarchy) -> np.ndarray:
    """The (groups, members) synthesis indices of ``instruction`` on ``hierarchy``
    (:func:`synth.synthesis.semantics.resolve`), read-only: a pure function of the
    hierarchy's sizes, shared by the predictors of every placement."""
    groups = resolve_rows(instruction, hierarchy)
    groups.setflags(write=False)
    return groups


def group_members(instruction: Instruction, hierarchy: Hierarchy) -> int:
    """Members of each group ``instruction`` forms on ``hierarchy`` (all its
    groups have the same size)."""
    return int(_synthesis_groups(instruction, hierarchy).shape[1])


# Step costs shared between predictors (the placements of one configuration often
# run the same groups, or groups placed alike on other devices): (topology,
# profile, algorithm, collective, canonical groups' dtype, shape and bytes,
# nbytes' bytes) -> step_cost's result, whose Features nobody mutates. Emptied
# when it reaches _SHARED_STEPS_LIMIT entries and by clear_caches.
_SHARED_STEPS: dict[tuple, tuple[float, Features]] = register_table({}, __name__, "_SHARED_STEPS")
_SHARED_STEPS_LIMIT = 1 << 16
# step_channels' results, keyed as _SHARED_STEPS (Predictor._channels); emptied with it
_SHARED_CHANNELS: dict[tuple, int] = register_table({}, __name__, "_SHARED_CHANNELS")


# (topology, profile, algorithm, NCCL version) -> id, never reused
_MODEL_IDS: dict[tuple, int] = register_table({}, __name__, "_MODEL_IDS")
_NEXT_MODEL_ID = itertools.count()


def model_id(topology: Topology, profile: NetworkProfile, algorithm: Algorithm, nccl_version: str | None) -> int:
    """A small id for what prices a step besides its groups and bytes, so
    that a key need not hash the topology and profile (frozen dataclasses
    hash every field each time). Ids are never reused, so forgetting the
    table (clear_caches) cannot make two models share shared-step entries."""
    key = (topology, profile, algorithm, nccl_version)
    found = _MODEL_IDS.get(key)
    if found is None:
        found = _MODEL_IDS[key] = next(_NEXT_MODEL_ID)
    return found


def shared_step_cost(topology: Topology, profile: NetworkProfile, algorithm: Algorithm, collective: Collective,
                      groups: np.ndarray, nbytes: np.ndarray, nccl_version: str | None = None,
                      key: tuple | None = None) -> tuple[float, Features]:
    """:func:`ordered_step_cost` (rows in ring and tree order) memoised on the
    values of its arguments in ``_SHARED_STEPS``. Callers pass the canonical image
    of their groups (:func:`~synth.cost.links.canonical_devices`), so that steps
    over groups placed alike on other devices share one entry. ``key``: a
    caller's own key that determines every argument (it starts with
    :func:`model_id`'s id and the collective; :meth:`Predictor.step`'s)."""
    if key is None:
        key = (topology, profile, algorithm, collective, content_key(groups), nbytes.dtype.str, nbytes.tobytes(),
               nccl_version)
    cost = _SHARED_STEPS.get(key)
    if cost is None:
        if len(_SHARED_STEPS) >= _SHARED_STEPS_LIMIT:
            _SHARED_STEPS.clear()
        cost = _SHARED_STEPS[key] = ordered_step_cost(
            StepPricing(topology, profile, algorithm, collective, nccl_version=nccl_version), groups, nbytes)
    return cost


class Predictor:
    """Predictions for the programs of one reduction under one model.

    Step costs are memoised on (instruction, loads, size), so predicting every
    program of a search costs one evaluation per distinct step (and predictors
    of the same topology and model share steps over the same devices and bytes).
    The returned :class:`Features` are shared: add them, do not mutate them."""

    def __init__(self, reduction: Reduction, model: Model | None = None) -> None:
        self.reduction = reduction
        self.model = model or Model()
        self.profile = self.model.profile_for(reduction.topology)
        self._memo: dict[tuple[Instruction, Loads, float], tuple[float, Features]] = {}
        self._groups: dict[Instruction, np.ndarray] = {}
        self._encoded_table: np.ndarray | None = None  # device id x devices + its canonical image
        self._links = links_of(reduction.topology)
        self._group_keys: dict[Instruction, tuple] = {}
        self._model_id = model_id(reduction.topology, self.profile, self.model.algorithm, self.model.rules_version)

    def global_groups(self, instruction: Instruction) -> np.ndarray:
        """(synthesis groups x reduction groups, members): the global device ids
        of each group sorted (ring and tree order), mapped by the symmetry
        :func:`~synth.cost.links.canonical_devices` picks for the reduction's
        whole table (so every step of this predictor uses one symmetry, and a
        step's cost is that of the sorted device ids)."""
        groups = self._groups.get(instruction)
        if groups is None:
            devices = len(self._links.ancestors[0])
            if self._encoded_table is None:
                table = self.reduction.synthesis_groups.astype(np.int64)
                self._encoded_table = table * devices + canonical_devices(self._links, table)
            synthesis = _synthesis_groups(instruction, self.reduction.hierarchy)  # (s, m)
            encoded = self._encoded_table[:, synthesis].transpose(1, 0, 2).reshape(-1, synthesis.shape[1])
            # sorting the encoded ids sorts by device id (distinct in a group); the remainder is the image
            groups = self._groups[instruction] = np.sort(encoded, axis=1) % devices
        return groups

    def step(self, instruction: Instruction, loads: Loads, size_bytes: float) -> tuple[float, Features]:
        key = (instruction, loads, size_bytes)
        cost = self._memo.get(key)
        if cost is None:
            groups = self.global_groups(instruction)
            chunk_bytes = size_bytes / self.reduction.k
            repeat = len(self.reduction.synthesis_groups)
            # the step's groups and bytes follow from these (the groups' content key is kept per instruction,
            # so its digest is computed once): placements whose groups have the same canonical image share it
            shared = (self._model_id, instruction.collective, self._group_key(instruction, groups), loads,
                      chunk_bytes, repeat)
            nbytes = np.repeat(np.asarray(loads, dtype=float) * chunk_bytes, repeat)
            if not nbytes.all():  # groups that move nothing (an AllGather of empty members) are idle
                groups, nbytes = groups[nbytes > 0], nbytes[nbytes > 0]
            cost = self._memo[key] = shared_step_cost(
                self.reduction.topology, self.profile, self.model.algorithm, instruction.collective, groups, nbytes,
                self.model.rules_version, key=shared,
            )
        return cost

    def sm_share(self, program: Program, loads: Sequence[Loads], size_bytes: float) -> float:
        """The share of each device's SMs ``program`` holds while it runs:
        its steps' channels (:func:`step_channels`, one CTA on one SM each)
        over the device's SMs
        (:func:`~synth.cost.nccl.streaming_multiprocessors`), weighted by each
        step's seconds (0 for a program that takes none)."""
        total_s = held = 0.0
        for instruction, step_loads in zip(program.instructions, loads):
            seconds = self.step(instruction, step_loads, size_bytes)[0]
            if seconds > 0:
                total_s += seconds
                held += seconds * self._channels(instruction, step_loads, size_bytes)
        if total_s <= 0:
            return 0.0
        return held / total_s / streaming_multiprocessors(self.reduction.topology)

    def _channels(self, instruction: Instruction, loads: Loads, size_bytes: float) -> int:
        """:func:`step_channels` of one step, shared like :meth:`step`'s costs
        (``_SHARED_CHANNELS``)."""
        groups = self.global_groups(instruction)
        chunk_bytes = size_bytes / self.reduction.k
        key = (self._model_id, instruction.collective, self._group_key(instruction, groups), loads, chunk_bytes)
        found = _SHARED_CHANNELS.get(key)
        if found is None:
            nbytes = np.repeat(np.asarray(loads, dtype=float) * chunk_bytes, len(self.reduction.synthesis_groups))
            groups, nbytes = groups[nbytes > 0], nbytes[nbytes > 0]
            if len(_SHARED_CHANNELS) >= _SHARED_STEPS_LIMIT:
                _SHARED_CHANNELS.clear()
            found = _SHARED_CHANNELS[key] = step_channels(self.reduction.topology, self.model.algorithm,
                                                          instruction.collective, groups, nbytes,
                                                          self.model.rules_version)
        return found

    def _group_key(self, instruction: Instruction, groups: np.ndarray) -> tuple:
        """The value of :meth:`global_groups` as a hashable key
        (:func:`content_key`), one object per instruction."""
        found = self._group_keys.get(instruction)
        if found is None:
            found = self._group_keys[instruction] = content_key(groups)
        return found

    def default(self, goal: Goal, size_bytes: float) -> float:
        """Predicted seconds of the library's one-call collective for ``goal``
        (:func:`default_program`): one synthesis group of every device, moving
        all ``k`` chunks."""
        return self.program(default_program(goal), ((self.reduction.k,),), size_bytes)

    def program(self, program: Program, loads: Sequence[Loads], size_bytes: float) -> float:
        """Predicted seconds of ``program`` whose steps move ``loads`` chunks: the
        ``sum`` of its steps' seconds in program order."""
        return sum(self.step(i, l, size_bytes)[0] for i, l in zip(program.instructions, loads))

    def features(self, program: Program, loads: Sequence[Loads], size_bytes: float) -> Features:
        total = Features.zero(len(self.reduction.topology.levels))
        for i, l in zip(program.instructions, loads):
            total.add(self.step(i, l, size_bytes)[1])
        return total


def lowered_loads(lowered: LoweredProgram) -> list[Loads]:
    """Per step, the chunks each group moves, from a lowered program (one value
    per synthesis group, taken from reduction group 0's groups)."""
    first = set(lowered.reduction_groups[0])
    return [tuple(len(c) for g, c in zip(s.groups, s.chunks) if g[0] in first) for s in lowered.steps]


def predict_program(
    lowered: LoweredProgram, reduction: Reduction, size_bytes: float, model: Model | None = None
) -> float:
    """Predicted seconds of a lowered program at ``size_bytes`` per device."""
    return Predictor(reduction, model).program(lowered.program, lowered_loads(lowered), size_bytes)
