"""The all-to-all of expert parallelism: what it costs on the links.

NCCL has no all-to-all algorithm of its own: an all-to-all is a group of
point-to-point sends, every member sending its ``1 / n`` share of the buffer to
each of the ``n - 1`` others at once (``ncclGroupStart``, one ``ncclSend`` and
one ``ncclRecv`` per peer, ``ncclGroupEnd``). It is priced as one round of those
``n (n - 1)`` flows per group, every group of the step at the same time
(:func:`~synth.cost.links.round_cost`): flows that leave a node share its NICs,
and those that stay inside share the node's NVLink ports, so an expert group
spread over nodes pays the network for ``(n - n_node) / n`` of its bytes. A flow
leaving through a network level goes GPU to NIC directly (GPUDirect RDMA), as
in the NCCL models. Latency: the latencies of the levels the slowest flow
crosses, once (the sends are issued together). Transfers use the
point-to-point efficiency of the profile's ``Broadcast`` key (a pipeline send
is a Broadcast over two devices in this project, the same sends).

Per peer. NCCL's kernels work through a group's peers in rounds (its
``p2pSchedule``, at most ``NCCL_MAX_DEV_WORK_P2P_PER_BATCH`` = 8 peers per batch
and channel), so a small all-to-all takes longer the more peers it has even
when every flow is tiny: NCCL's own measurement of ``ncclAlltoAll`` inside one
GB200 NVLink domain (NVIDIA/nccl ``contrib/custom_algos/alltoall/README.md``,
the "NCCL_baseline" column at 16 B per pair, transcribed in
``data/nccl/nvidia-contrib-gb200-{8,32}-alltoall.jsonl``) is 11.75 us over 8 GPUs and
28.20 us over 32: :data:`NCCL_PEER_S` = (28.20 - 11.75) / (32 - 8) us per peer
beyond the first. The source's 64-GPU plot (about 48.5 us) lies on the same
line. Each member pays it for its ``n - 1`` peers, in every NCCL model (the
MPI model, the CPU testbed's, has no measurement of it and takes 0). This
term is what a hierarchical all-to-all (inside the node, then across:
:mod:`synth.synthesis.alltoall`) saves: the same NIC bytes with ``g - 1 +
nodes - 1`` peers instead of ``g x nodes - 1``, for an extra step inside the
node.

Programs. :func:`program_alltoalls` lowers an all-to-all program (one
all-to-all of the whole buffer per step over its groups) to the system's
device ids through the groups' :class:`~synth.synthesis.reduction.Reduction`
tables; its time is the sum of its steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SynthError
from ..synthesis.alltoall import AllToAllProgram, resolve_exchange
from ..synthesis.language import Collective
from ..synthesis.reduction import Reduction
from ..topology import Topology
from .links import links_of, round_geometry
from .model import Algorithm
from .profile import NetworkProfile

P2P_EFFICIENCY_KEY = Collective.BROADCAST.value

#: NCCL's all-to-all at 16 B per pair over 8 and over 32 GPUs of one GB200 NVLink
#: domain, seconds (module docstring)
NCCL_ALLTOALL_SMALL_S = {8: 11.75e-6, 32: 28.20e-6}
#: seconds per peer of an NCCL all-to-all, beyond the first (module docstring)
NCCL_PEER_S = (NCCL_ALLTOALL_SMALL_S[32] - NCCL_ALLTOALL_SMALL_S[8]) / (32 - 8)


#: flows (sender, receiver pairs over all groups) one all-to-all step may price;
#: more is refused before the arrays are built (2,048 devices in one group)
FLOWS_LIMIT = 2048 * 2047


def peer_seconds(algorithm: Algorithm) -> float:
    """Seconds per peer of an all-to-all under ``algorithm``: :data:`NCCL_PEER_S`
    for the NCCL models, 0 for the MPI model (no measurement)."""
    return 0.0 if algorithm is Algorithm.MPI else NCCL_PEER_S


@dataclass(frozen=True, eq=False)  # holds arrays: compared by identity
class AllToAll:
    """An all-to-all's cost on some groups, for any size: per set of levels
    a flow crosses (which sets its latency), the latency and the seconds per
    byte of its slowest flow, and the seconds per peer. Every flow carries
    ``size / n`` bytes, so the all-to-all takes ``(n - 1) x peer_s + max(latency +
    size / n x seconds per byte)``."""

    members: int
    latency_s: np.ndarray
    seconds_per_byte: np.ndarray
    peer_s: float = 0.0

    def seconds(self, size_bytes: float) -> float:
        if self.members < 2 or size_bytes <= 0:
            return 0.0
        return (self.members - 1) * self.peer_s + float(
            np.max(self.latency_s + float(size_bytes) / self.members * self.seconds_per_byte))


def alltoall_of(topology: Topology, profile: NetworkProfile, groups: np.ndarray, peer_s: float = NCCL_PEER_S) -> AllToAll:
    """The :class:`AllToAll` of every row of ``groups`` ((groups, members)
    device ids) at once (module docstring); ``peer_s``: :func:`peer_seconds`."""
    groups = np.asarray(groups)
    n = groups.shape[1]
    if n < 2:
        return AllToAll(n, np.zeros(1), np.zeros(1), peer_s)
    flows = groups.shape[0] * n * (n - 1)
    if flows > FLOWS_LIMIT:
        raise SynthError(f"an all-to-all over {groups.shape[0]} group(s) of {n} devices is {flows:,} flows, over the "
                         f"cost model's limit of {FLOWS_LIMIT:,}; give the axis fewer devices")
    senders, receivers = np.nonzero(~np.eye(n, dtype=bool))
    links = links_of(topology)
    geometry = round_geometry(links, profile.bandwidth_Bps, groups[:, senders].ravel(), groups[:, receivers].ravel(),
                              rdma=True)
    # flows that cross the same levels have the same latency: keep the slowest of each crossing pattern
    pattern = (geometry.crossing.astype(np.int64) << np.arange(len(links.counts))[:, None]).sum(axis=0)
    slowest = np.zeros(1 << len(links.counts))
    np.maximum.at(slowest, pattern, 1.0 / (geometry.rate * profile.efficiency_of(P2P_EFFICIENCY_KEY)))
    used = np.flatnonzero(np.bincount(pattern, minlength=len(slowest)))
    crossing = (used[None, :] >> np.arange(len(links.counts))[:, None]) & 1
    return AllToAll(n, profile.latency_s @ crossing, slowest[used], peer_s)


def alltoall_s(topology: Topology, profile: NetworkProfile, groups: np.ndarray, size_bytes: float,
               peer_s: float = NCCL_PEER_S) -> float:
    """Seconds of an all-to-all of ``size_bytes`` per member in every row of
    ``groups`` ((groups, members) device ids), all groups at once (module
    docstring). 0 for groups of one member or an empty buffer."""
    return alltoall_of(topology, profile, groups, peer_s).seconds(size_bytes)


def exchange_device_groups(groups: Reduction, program: AllToAllProgram) -> tuple[np.ndarray, ...]:
    """Per step of ``program``, the (groups, members) device ids it runs on:
    its synthesis groups (:func:`~synth.synthesis.alltoall.resolve_exchange`)
    in every row of ``groups.synthesis_groups`` (the all-to-all groups of a
    placement, written as a :class:`Reduction` over the all-to-all's axes: only
    its hierarchy and tables are read, not its goal)."""
    out = []
    for step in program.steps:
        synthesis = np.asarray(resolve_exchange(step, groups.hierarchy).groups)
        out.append(groups.synthesis_groups[:, synthesis].reshape(-1, synthesis.shape[1]))
    return tuple(out)


def program_alltoalls(topology: Topology, profile: NetworkProfile, groups: Reduction, program: AllToAllProgram,
                      peer_s: float = NCCL_PEER_S) -> tuple[AllToAll, ...]:
    """The :class:`AllToAll` of every step of ``program`` on the groups of
    ``groups`` (:func:`exchange_device_groups`); the program's time at a size
    is the sum of their ``seconds(size)``: every step moves the whole buffer."""
    return tuple(alltoall_of(topology, profile, g, peer_s) for g in exchange_device_groups(groups, program))


def program_seconds(steps: tuple[AllToAll, ...], size_bytes: float) -> float:
    """Seconds of a program priced by :func:`program_alltoalls`, at ``size_bytes`` per device."""
    return sum(step.seconds(size_bytes) for step in steps)
