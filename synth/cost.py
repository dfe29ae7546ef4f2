"""Contention-aware cost model: predicted seconds of a lowered program.

Links. A flow from device ``s`` to device ``t`` that are in different elements
of level ``l`` uses the uplink of ``s``'s level-``l`` element (up) and the
downlink of ``t``'s (down), for every such level: it climbs to the lowest common
ancestor and back. Each uplink carries ``bandwidth_GBps x ports`` per direction,
one flow at most ``bandwidth_GBps`` (one port); flows crossing it at the same time
share it equally. A ``ring`` fabric level connects siblings in a ring: a flow
between siblings at ring distance ``h`` loads the ``h`` ring links on its
shortest way, and the busiest of them decides its share. Latency: the sum of
``latency_us`` of the levels a flow crosses.

Steps and rounds. A step runs all its groups at once. A collective is a
sequence of rounds; in a round every member sends its flows, and the round takes
as long as its slowest flow: ``latency + bytes / (bandwidth x share x
efficiency[collective])``, shares counted over the flows of ALL groups of the
step (this is where 16 GPUs sharing one NIC show up). Algorithms
(``members`` in device-id order, ``S`` = bytes the group's step moves, ``m`` members):

* ``ring`` (NCCL ring): AllReduce ``2(m-1)`` rounds of ``S/m`` to the next member
  on the ring; ReduceScatter and AllGather ``m-1`` such rounds; Reduce and
  Broadcast a pipelined chain: one round of ``S`` along the chain plus ``m-2``
  extra latencies.
* ``tree`` (NCCL tree, AllReduce only; other collectives use ``ring`` as NCCL
  does): members are bucketed by their element at the outermost level where
  they differ (their nodes); a chain inside each bucket carries ``S`` to its
  first member, and a double binary tree over those first members (the second
  tree over them rotated by one) carries ``S/2`` per tree; the reduce up and the
  broadcast down are pipelined on opposite link directions: one round plus
  ``2 depth - 1`` extra latencies.
* ``mpi`` (OpenMPI 5.0's ``coll/tuned`` decisions, :func:`mpi_algorithm`, see
  docs/simulator.md): per collective, group size and bytes one of recursive
  doubling (``ceil(log2 m)`` rounds of ``S``; AllGather: doubling pieces),
  Rabenseifner (recursive halving at distance 1, 2, 4, ... moving ``S/2, S/4,
  ...``, then the mirror image), ring, a pipelined chain, a binomial tree
  (``ceil(log2 m)`` rounds of ``S``) or linear (everyone to or from member 0 at
  once; the linear ReduceScatter reduces to member 0, then scatters ``S/m``).

Linear form. Given the critical (slowest) flow of every round, a prediction is
``sum_l latency_us[l] * L[l] + call_overhead_us * calls + sum_c sum_l X[c][l] /
(bandwidth_GBps[l] * efficiency[c])`` (``calls``: the program's steps):
:class:`Features` records ``L``, ``calls`` and ``X`` so that :mod:`synth.fit`
can fit the parameters by least squares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Sequence

import numpy as np

from .errors import SynthError
from .language import Collective, Form, Instruction, Program
from .lowering import LoweredProgram
from .placement import Placement
from .search import Loads, PlacementPrograms
from .semantics import Goal, hierarchy_of, resolve
from .topology import Topology

ALGORITHMS = ("ring", "tree", "mpi")


@dataclass(frozen=True)
class Profile:
    """Effective parameters per level (outermost first) and per collective.

    The prior comes from the topology file (no call overhead); :mod:`synth.fit`
    learns one from measurements. ``efficiency`` divides the bandwidth terms of a
    collective; ``call_overhead_us`` is added once per step (a library call's
    software cost: a kernel launch, or MPI's bookkeeping on the CPU testbed)."""

    topology: str
    level_names: tuple[str, ...]
    bandwidth_GBps: tuple[float, ...]
    latency_us: tuple[float, ...]
    efficiency: tuple[tuple[str, float], ...] = tuple((c.value, 1.0) for c in Collective)
    call_overhead_us: float = 0.0  # per collective call (step), whatever it moves

    @classmethod
    def prior(cls, topology: Topology) -> "Profile":
        return cls(
            topology=topology.name,
            level_names=topology.level_names,
            bandwidth_GBps=tuple(lv.bandwidth_GBps for lv in topology.levels),
            latency_us=tuple(lv.latency_us for lv in topology.levels),
        )

    def efficiency_of(self, collective: Collective) -> float:
        return self._efficiency[collective.value]

    @cached_property
    def _efficiency(self) -> dict[str, float]:
        return dict(self.efficiency)

    @cached_property
    def latency_s(self) -> np.ndarray:
        return np.asarray(self.latency_us) * 1e-6

    @cached_property
    def bandwidth_Bps(self) -> np.ndarray:
        return np.asarray(self.bandwidth_GBps) * 1e9

    def check_matches(self, topology: Topology, source: str = "profile") -> None:
        if self.topology != topology.name or self.level_names != topology.level_names:
            raise SynthError(
                f"{source} was fitted for topology '{self.topology}' with levels "
                f"{', '.join(self.level_names)}, not '{topology.name}' with levels "
                f"{', '.join(topology.level_names)}; fit a profile for this topology"
            )


@dataclass
class Features:
    """Critical-path terms of a prediction (see the module docstring)."""

    latency_count: np.ndarray  # (levels,)
    load: dict[Collective, np.ndarray] = field(default_factory=dict)  # bytes/share, (levels,)
    calls: float = 0.0  # collective calls (steps)

    def add(self, other: "Features", times: float = 1.0) -> None:
        self.latency_count += times * other.latency_count
        self.calls += times * other.calls
        for c, x in other.load.items():
            self.load[c] = self.load.get(c, 0) + times * x

    def seconds(self, profile: Profile) -> float:
        total = float(profile.latency_s @ self.latency_count) + self.calls * profile.call_overhead_us * 1e-6
        for c, x in self.load.items():
            total += float((x / profile.bandwidth_Bps).sum()) / profile.efficiency_of(c)
        return total


def _zero(levels: int) -> Features:
    return Features(np.zeros(levels))


# ---------------------------------------------------------------- links


@dataclass(frozen=True)
class _Links:
    """Per level: the element id of each device's ancestor, and the level data."""

    ancestors: tuple[np.ndarray, ...]  # (levels,) arrays of (devices,)
    ports: tuple[int, ...]
    ring: tuple[bool, ...]
    counts: tuple[int, ...]


@lru_cache(maxsize=64)
def _links(topology: Topology) -> _Links:
    counts = topology.counts
    devices = np.arange(topology.num_devices)
    ancestors = tuple(devices // math.prod(counts[l + 1 :]) for l in range(len(counts)))
    return _Links(
        ancestors,
        tuple(lv.ports for lv in topology.levels),
        tuple(lv.fabric == "ring" for lv in topology.levels),
        counts,
    )


def _round(
    links: _Links, profile: Profile, collective: Collective, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray
) -> tuple[float, Features]:
    """Time of one round of concurrent flows and the features of its slowest flow."""
    levels = len(links.counts)
    if len(src) == 0:
        return 0.0, _zero(levels)
    eff = profile.efficiency_of(collective)
    lat, bw = profile.latency_s, profile.bandwidth_Bps
    crossing = np.zeros((levels, len(src)), dtype=bool)
    share = np.ones((levels, len(src)))
    for l in range(levels):
        a_src, a_dst = links.ancestors[l][src], links.ancestors[l][dst]
        cross = a_src != a_dst
        crossing[l] = cross
        if not cross.any():
            continue
        siblings = cross & (links.ancestors[l - 1][src] == links.ancestors[l - 1][dst]) if l else cross
        if links.ring[l]:
            load = _ring_load(a_src, a_dst, siblings, links.counts[l])
            share[l] = np.where(siblings, 1.0 / np.maximum(load, 1), share[l])
            outward = cross & ~siblings
        else:
            outward = cross
        if outward.any():
            up = np.bincount(a_src[outward], minlength=int(links.ancestors[l].max()) + 1)
            down = np.bincount(a_dst[outward], minlength=int(links.ancestors[l].max()) + 1)
            busiest = np.maximum(up[a_src], down[a_dst])
            share[l] = np.where(outward, np.minimum(1.0, links.ports[l] / np.maximum(busiest, 1)), share[l])
    latency = lat @ crossing
    # bottleneck level of each flow: smallest bandwidth x share among crossed levels
    rate = np.where(crossing, bw[:, None] * share, np.inf)
    bottleneck = rate.argmin(axis=0)
    seconds = latency + nbytes / (rate.min(axis=0) * eff)
    worst = int(seconds.argmax())
    features = _zero(levels)
    features.latency_count = crossing[:, worst].astype(float)
    load = np.zeros(levels)
    load[bottleneck[worst]] = nbytes[worst] / share[bottleneck[worst], worst]
    features.load[collective] = load
    return float(seconds[worst]), features


def _ring_load(a_src: np.ndarray, a_dst: np.ndarray, siblings: np.ndarray, count: int) -> np.ndarray:
    """Per flow, the number of sibling flows on the busiest ring link of its path."""
    pos_s, pos_d = a_src % count, a_dst % count
    parent = a_src // count
    forward = (pos_d - pos_s) % count
    clockwise = forward <= count - forward
    hops = np.where(clockwise, forward, count - forward)
    step = np.where(clockwise, 1, -1)
    # link (parent, position, direction) ids; count flows on each
    load: dict[tuple[int, int, int], int] = {}
    paths = []
    for f in np.flatnonzero(siblings):
        path = [(int(parent[f]), int((pos_s[f] + step[f] * h + (0 if step[f] > 0 else -1)) % count), int(step[f]))
                for h in range(int(hops[f]))]
        paths.append((f, path))
        for link in path:
            load[link] = load.get(link, 0) + 1
    out = np.ones(len(a_src))
    for f, path in paths:
        out[f] = max(load[link] for link in path)
    return out


# ---------------------------------------------------------------- algorithms


@dataclass(frozen=True)
class _Round:
    """One round of a collective over ``m`` members in device-id order: member
    ``src[i]`` sends ``fraction[i] x S`` bytes to member ``dst[i]``; the round runs
    ``repeat`` times and a pipeline adds ``extra`` latencies of its slowest flow."""

    src: tuple[int, ...]
    dst: tuple[int, ...]
    fraction: tuple[float, ...]
    repeat: int = 1
    extra: int = 0


def _uniform(src: tuple[int, ...], dst: tuple[int, ...], fraction: float, repeat: int = 1, extra: int = 0) -> _Round:
    return _Round(src, dst, (fraction,) * len(src), repeat, extra)


@lru_cache(maxsize=1024)
def _tree(buckets: tuple[int, ...]) -> tuple[_Round, ...]:
    """NCCL's tree AllReduce over members grouped in consecutive buckets (nodes)
    of the given sizes: a chain inside each bucket towards its first member, and a
    double binary tree over the buckets' first members (the second tree over them
    rotated by one), ``S/2`` per tree. Pipelined: the broadcast down runs while the
    reduce goes up, on the other direction of each link, so both are one round
    plus ``2 x depth - 1`` latencies."""
    starts = [sum(buckets[:i]) for i in range(len(buckets))]
    chain = [(s + j + 1, s + j) for s, size in zip(starts, buckets) for j in range(size - 1)]
    n = len(starts)
    tree = [
        (starts[(i + shift) % n], starts[((i - 1) // 2 + shift) % n]) for shift in (0, 1) for i in range(1, n)
    ] if n > 1 else []
    up = chain + tree
    both = up + [(b, a) for a, b in up]  # the broadcast down overlaps the reduce up
    fractions = ((1.0,) * len(chain) + (0.5,) * len(tree)) * 2
    depth = max(buckets) - 1 + (max(1, math.ceil(math.log2(n + 1)) - 1) if n > 1 else 0)
    return (_Round(tuple(a for a, _ in both), tuple(b for _, b in both), fractions, 1, max(0, 2 * depth - 1)),)


def mpi_algorithm(collective: Collective, m: int, nbytes: float) -> str:
    """The algorithm OpenMPI 5.0's ``coll/tuned`` fixed decision picks for a sum
    over ``m`` ranks of ``nbytes`` (the whole buffer), reduced to the families the
    model has: ``recursive_doubling``, ``rabenseifner``, ``ring``, ``linear``,
    ``chain``, ``binomial``. Thresholds are tuned's (ompi/mca/coll/tuned/
    coll_tuned_decision_fixed.c, v5.0) with its many small-size alternations
    merged; algorithms that need a power of two fall back to ``ring`` on other
    sizes (tuned folds the extra ranks instead)."""
    power_of_two = m & (m - 1) == 0
    if collective is Collective.ALLREDUCE:
        small = 16384 if m < 4 else 8192 if m < 16 else 4096
        if nbytes < small:
            return "recursive_doubling"
        if m < 4 and nbytes < 262144:
            return "ring"  # ring and segmented ring
        return "rabenseifner" if power_of_two else "ring"
    if collective is Collective.ALLGATHER:  # two_proc for m = 2 is one exchange: doubling
        return "recursive_doubling" if m < 32 and power_of_two else "ring"
    if collective is Collective.REDUCESCATTER:  # Reduce_scatter_block: by the block size
        block = nbytes / m
        linear = ((m < 4 and block >= 131072) or (4 <= m < 8 and block >= 1048576)
                  or (8 <= m < 16 and 524288 <= block < 4194304) or (16 <= m < 32 and 524288 <= block < 2097152))
        return "linear" if linear else "ring"  # recursive halving and butterfly as ring
    if collective is Collective.REDUCE:
        if m < 4:
            return "linear" if nbytes < 262144 else "chain"  # pipeline and chain
        if m < 8:
            if nbytes < 65536:
                return "chain"
            return "linear" if nbytes >= 1048576 or 262144 <= nbytes < 524288 else "binomial"
        return "binomial"
    # Broadcast
    if m < 8:
        return "chain" if 4 <= m and nbytes >= 1048576 else "linear" if nbytes >= 8192 else "binomial"
    return "linear" if m < 16 and nbytes >= 32768 else "binomial"


@lru_cache(maxsize=1024)
def _pattern(name: str, collective: Collective, m: int) -> tuple[_Round, ...]:
    """The rounds of ``collective`` over ``m`` members by algorithm ``name``
    (see the module docstring). The tree AllReduce depends on the node
    structure: see :func:`_tree`."""
    ring = tuple(range(m))
    nxt = tuple((i + 1) % m for i in range(m))
    steps = range(math.ceil(math.log2(m)))
    if name == "tree":
        name = "ring"  # NCCL runs all but AllReduce as rings
    if name == "linear":  # everyone <-> member 0 at once
        others = ring[1:]
        if collective is Collective.REDUCE:
            return (_uniform(others, (0,) * (m - 1), 1.0),)
        if collective is Collective.REDUCESCATTER:  # reduce to member 0, then scatter the pieces
            return (_uniform(others, (0,) * (m - 1), 1.0), _uniform((0,) * (m - 1), others, 1.0 / m))
        return (_uniform((0,) * (m - 1), others, 1.0),)  # Broadcast
    if name in ("ring", "chain"):
        if collective in (Collective.REDUCE, Collective.BROADCAST):  # pipelined chain
            a, b = ring[:-1], ring[1:]
            src, dst = (b, a) if collective is Collective.REDUCE else (a, b)
            return (_uniform(src, dst, 1.0, 1, m - 2),)
        repeat = 2 * (m - 1) if collective is Collective.ALLREDUCE else m - 1
        return (_uniform(ring, nxt, 1.0 / m, repeat),)
    if name == "rabenseifner":  # recursive halving, distance doubling; then the mirror image
        halving = [_uniform(ring, tuple(r ^ (1 << i) for r in ring), 1.0 / (2 << i)) for i in steps]
        return tuple(halving + halving[::-1])
    rounds = []  # recursive doubling and binomial trees, ceil(log2 m) rounds
    for i in steps:
        d = 1 << i
        if collective in (Collective.ALLREDUCE, Collective.ALLGATHER):
            pairs = [(r, r ^ d) for r in range(m) if (r ^ d) < m]
            fraction = 1.0 if collective is Collective.ALLREDUCE else d / m
        else:
            pairs = [(r, r + d) for r in range(0, m, 2 * d) if r + d < m]
            fraction = 1.0
            if collective is Collective.REDUCE:  # children send partial sums to rank 0
                pairs = [(b, a) for a, b in pairs]
        rounds.append(_uniform(tuple(a for a, _ in pairs), tuple(b for _, b in pairs), fraction))
    if collective is Collective.REDUCE:
        rounds.reverse()
    return tuple(rounds)


def _buckets(links: _Links, members: np.ndarray) -> tuple[int, ...]:
    """Sizes of the runs of consecutive (sorted) members that share their element
    at the outermost level where the members differ; one bucket if they differ
    only at the leaf level (a group inside one node is a single chain)."""
    for l in range(len(links.counts) - 1):
        ancestors = links.ancestors[l][members]
        if (ancestors != ancestors[0]).any():
            cuts = np.flatnonzero(np.diff(ancestors)) + 1
            return tuple(np.diff(np.concatenate([[0], cuts, [len(members)]])).tolist())
    return (len(members),)


def step_cost(
    topology: Topology,
    profile: Profile,
    algo: str,
    collective: Collective,
    groups: np.ndarray,
    nbytes: np.ndarray,
) -> tuple[float, Features]:
    """Seconds of one step and its critical-path features. ``groups`` is an
    (n, m) array of device ids (n groups of m members, all at once) and
    ``nbytes`` the bytes each group's collective moves."""
    links = _links(topology)
    groups = np.sort(np.asarray(groups), axis=1)  # ring and tree order: device ids
    nbytes = np.asarray(nbytes, dtype=float)
    total, features = 0.0, _zero(len(topology.levels))
    if algo == "tree" and collective is Collective.ALLREDUCE:
        pattern = _tree(_buckets(links, groups[0]))
    else:
        m = groups.shape[1]
        pattern = _pattern(mpi_algorithm(collective, m, float(nbytes.max())) if algo == "mpi" else algo, collective, m)
    for rnd in pattern:
        if not rnd.src:
            continue
        src = groups[:, list(rnd.src)].ravel()
        dst = groups[:, list(rnd.dst)].ravel()
        flow_bytes = (nbytes[:, None] * np.asarray(rnd.fraction)[None, :]).ravel()
        seconds, f = _round(links, profile, collective, src, dst, flow_bytes)
        total += rnd.repeat * seconds
        features.add(f, rnd.repeat)
        if rnd.extra:
            hop = f.latency_count
            total += rnd.extra * float(profile.latency_s @ hop)
            features.latency_count = features.latency_count + rnd.extra * hop
    features.calls = 1.0
    return total + profile.call_overhead_us * 1e-6, features


# ---------------------------------------------------------------- programs


def default_program(goal: Goal) -> Program:
    """The library's one-call collective over each whole reduction group."""
    collective = {
        Goal.ALLREDUCE: Collective.ALLREDUCE,
        Goal.REDUCESCATTER: Collective.REDUCESCATTER,
        Goal.ALLGATHER: Collective.ALLGATHER,
    }[goal]
    return Program((Instruction(collective, "root", Form.INSIDE),))


class Predictor:
    """Predictions for the programs of one placement and reduction.

    Step costs are memoised on (instruction, loads, size), so predicting every
    program of a search costs one evaluation per distinct step."""

    def __init__(
        self,
        placement: Placement,
        reduce_axes: Sequence[str],
        algo: str = "ring",
        profile: Profile | None = None,
    ) -> None:
        if algo not in ALGORITHMS:
            raise SynthError(f"--algo {algo}: choose one of {', '.join(ALGORITHMS)}")
        self.profile = profile or Profile.prior(placement.topology)
        self.profile.check_matches(placement.topology)
        self.placement = placement
        self.algo = algo
        self._table = placement.synthesis_groups(reduce_axes)
        self._hierarchy = hierarchy_of(placement, reduce_axes)
        self._memo: dict[tuple[Instruction, Loads, float], tuple[float, Features]] = {}
        self._groups: dict[Instruction, np.ndarray] = {}

    def _global_groups(self, instruction: Instruction) -> np.ndarray:
        """(synthesis groups x reduction groups, members) global device ids."""
        if instruction not in self._groups:
            synthesis = np.asarray(resolve(instruction, self._hierarchy).groups)  # (s, m)
            self._groups[instruction] = self._table[:, synthesis].transpose(1, 0, 2).reshape(-1, synthesis.shape[1])
        return self._groups[instruction]

    def step(self, instruction: Instruction, loads: Loads, size_bytes: float) -> tuple[float, Features]:
        key = (instruction, loads, size_bytes)
        if key not in self._memo:
            groups = self._global_groups(instruction)
            chunk_bytes = size_bytes / self._hierarchy.k
            nbytes = np.repeat(np.asarray(loads, dtype=float) * chunk_bytes, len(self._table))
            self._memo[key] = step_cost(
                self.placement.topology, self.profile, self.algo, instruction.collective, groups, nbytes
            )
        return self._memo[key]

    def program(self, program: Program, loads: Sequence[Loads], size_bytes: float) -> float:
        """Predicted seconds of ``program`` whose steps move ``loads`` chunks."""
        return sum(self.step(i, l, size_bytes)[0] for i, l in zip(program.instructions, loads))

    def features(self, program: Program, loads: Sequence[Loads], size_bytes: float) -> Features:
        total = _zero(len(self.placement.topology.levels))
        for i, l in zip(program.instructions, loads):
            total.add(self.step(i, l, size_bytes)[1])
        return total


def lowered_loads(lowered: LoweredProgram) -> list[Loads]:
    """Per step, the chunks each group moves, from a lowered program (one value
    per synthesis group, taken from reduction group 0's groups)."""
    first = set(lowered.reduction_groups[0])
    return [tuple(len(c) for g, c in zip(s.groups, s.chunks) if g[0] in first) for s in lowered.steps]


def predict_program(
    lowered: LoweredProgram,
    placement: Placement,
    reduce_axes: Sequence[str],
    size_bytes: float,
    algo: str = "ring",
    profile: Profile | None = None,
) -> float:
    """Predicted seconds of a lowered program at ``size_bytes`` per device."""
    predictor = Predictor(placement, tuple(reduce_axes), algo, profile)
    return predictor.program(lowered.program, lowered_loads(lowered), size_bytes)


@dataclass(frozen=True)
class Ranked:
    """A placement's programs sorted fastest first, with the default all-reduce."""

    result: PlacementPrograms
    order: tuple[int, ...]  # program indices, fastest first
    predicted_s: tuple[float, ...]  # aligned with ``order``
    default_s: float
    default_index: int | None  # index of the default program among the programs

    @property
    def best_s(self) -> float:
        return self.predicted_s[0] if self.order else math.inf

    @property
    def speedup(self) -> float:
        """Default time over best time; 1 when there is nothing to do (k = 1)."""
        if not self.order:
            return 0.0
        return self.default_s / self.best_s if self.best_s > 0 else 1.0


def rank(result: PlacementPrograms, reduce_axes: Sequence[str], goal: Goal, size_bytes: float,
         algo: str = "ring", profile: Profile | None = None) -> Ranked:
    """Predict every program of a placement and sort them, fastest first."""
    predictor = Predictor(result.placement, tuple(reduce_axes), algo, profile)
    times = [predictor.program(p, l, size_bytes) for p, l in zip(result.programs, result.loads)]
    order = tuple(sorted(range(len(times)), key=lambda i: (times[i], i)))
    default = default_program(goal)
    default_index = next((i for i, p in enumerate(result.programs) if p == default), None)
    default_s = times[default_index] if default_index is not None else 0.0  # k = 1: nothing to do
    return Ranked(result, order, tuple(times[i] for i in order), default_s, default_index)
