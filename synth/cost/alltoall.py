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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..synthesis.language import Collective
from ..topology import Topology
from .links import links_of, round_geometry
from .profile import Profile

P2P_EFFICIENCY_KEY = Collective.BROADCAST.value


@dataclass(frozen=True, eq=False)  # holds arrays: compared by identity
class AllToAll:
    """An all-to-all's cost on some groups, for any size: per set of levels
    a flow crosses (which sets its latency), the latency and the seconds per
    byte of its slowest flow. Every flow carries ``size / n`` bytes, so the
    all-to-all takes ``max(latency + size / n x seconds per byte)``."""

    members: int
    latency_s: np.ndarray
    seconds_per_byte: np.ndarray

    def seconds(self, size_bytes: float) -> float:
        if self.members < 2 or size_bytes <= 0:
            return 0.0
        return float(np.max(self.latency_s + float(size_bytes) / self.members * self.seconds_per_byte))


def alltoall_of(topology: Topology, profile: Profile, groups: np.ndarray) -> AllToAll:
    """The :class:`AllToAll` of every row of ``groups`` ((groups, members)
    device ids) at once (module docstring)."""
    groups = np.asarray(groups)
    n = groups.shape[1]
    if n < 2:
        return AllToAll(n, np.zeros(1), np.zeros(1))
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
    return AllToAll(n, profile.latency_s @ crossing, slowest[used])


def alltoall_s(topology: Topology, profile: Profile, groups: np.ndarray, size_bytes: float) -> float:
    """Seconds of an all-to-all of ``size_bytes`` per member in every row of
    ``groups`` ((groups, members) device ids), all groups at once (module
    docstring). 0 for groups of one member or an empty buffer."""
    return alltoall_of(topology, profile, groups).seconds(size_bytes)
