"""The rank map: which device each trainer rank runs on, so that a trainer that
forms its groups from rank order (Megatron-LM, torchtitan) gets the plan's.

Megatron-LM numbers ranks by an order of axes, first axis fastest (its default
``tp-cp-ep-dp-pp``): rank ``r`` has coordinate ``(r // stride_a) % size_a`` on
axis ``a``, ``stride_a`` the product of the sizes before ``a`` in the order,
and the group of axis ``a`` holds the ranks that agree on every other
coordinate, in increasing rank. torchtitan's row-major mesh over ``pp,
dp_replicate, dp_shard, cp, tp`` is the same numbering (``tp`` fastest).

A plan's mesh (``Placement.mesh``) holds the device of every coordinate. With
``device_of_rank[r]`` = the mesh entry at rank ``r``'s coordinates, the ranks of
a trainer's axis-``a`` group are launched on the devices of the plan's
axis-``a`` group, member ``i`` (axis coordinate ``i``) on the member of
reduction rank ``i``, for every axis at once, whatever the placement
(interleaved ones included). :func:`rank_map` computes it and checks it
against the plan's reduction groups (:func:`check_rank_map`), so a map that
would not reproduce them is never emitted.

Launch: device ``d`` is torchrun's rank on node ``d // per_node``, local rank
``d % per_node``; the process there takes rank ``rank_of_device[d]`` before
``init_process_group`` (:func:`synth.torch.launch_rank`). numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import SynthError
from ..runtime.meshes import devices_per_node
from ..synthesis.placement import Placement
from ..synthesis.reduction import Reduction
from ..topology import Topology

# Megatron-LM's default order of parallel_state.initialize_model_parallel (first fastest)
MEGATRON_ORDER = ("tp", "cp", "ep", "dp", "pp")


@dataclass(frozen=True)
class RankMap:
    """Ranks of a trainer mapped onto a plan's devices.

    ``order``: the axes, first fastest; ``sizes``: their sizes, in ``order``;
    ``device_of_rank[r]``: the device rank ``r`` must run on;
    ``rank_of_device[d]``: its inverse. Invariant: both are permutations of
    ``range(n)``, inverse to each other, and :meth:`groups` of every axis,
    mapped through ``device_of_rank``, are the plan's groups of that axis."""

    order: tuple[str, ...]
    sizes: tuple[int, ...]
    device_of_rank: tuple[int, ...]
    rank_of_device: tuple[int, ...]

    @property
    def order_text(self) -> str:
        """The order as Megatron-LM spells it: ``tp-cp-dp-pp``."""
        return "-".join(self.order)

    @property
    def is_identity(self) -> bool:
        """Whether the trainer's own numbering already is the plan's."""
        return all(d == r for r, d in enumerate(self.device_of_rank))

    def size(self, axis: str) -> int:
        return self.sizes[self.order.index(axis)] if axis in self.order else 1

    def groups(self, axis: str) -> tuple[tuple[int, ...], ...]:
        """The ranks a trainer groups for ``axis`` (Megatron-style: equal on
        every other axis, increasing), groups ordered by their first rank."""
        if axis not in self.order:
            raise SynthError(f"axis '{axis}' is not in the rank map's order {self.order_text}")
        ranks = np.arange(len(self.device_of_rank)).reshape(tuple(reversed(self.sizes)))
        position = len(self.order) - 1 - self.order.index(axis)
        rows = np.moveaxis(ranks, position, -1).reshape(-1, self.size(axis))
        return tuple(sorted(tuple(int(r) for r in row) for row in rows))

    def device_groups(self, axis: str) -> tuple[tuple[int, ...], ...]:
        """:meth:`groups` of ``axis`` as devices (what the plan must hold)."""
        return tuple(tuple(self.device_of_rank[r] for r in group) for group in self.groups(axis))

    def to_dict(self) -> dict[str, Any]:
        return {"order": list(self.order), "sizes": dict(zip(self.order, self.sizes)),
                "device_of_rank": list(self.device_of_rank), "rank_of_device": list(self.rank_of_device)}


def default_order(names: Sequence[str]) -> tuple[str, ...]:
    """Megatron-LM's order (``tp-cp-ep-dp-pp``) where every axis is one of its
    names; otherwise the plan's own convention, the last declared axis fastest."""
    if all(name in MEGATRON_ORDER for name in names):
        return tuple(sorted(names, key=MEGATRON_ORDER.index))
    return tuple(reversed(names))


def parse_order(text: str, names: Sequence[str]) -> tuple[str, ...]:
    """``tp-dp-pp`` (or ``tp,dp,pp``): a permutation of the plan's axes, first fastest."""
    order = tuple(part.strip() for part in text.replace(",", "-").split("-") if part.strip())
    if sorted(order) != sorted(names) or len(set(order)) != len(order):
        raise SynthError(f"--order {text}: name every axis of the plan once ({'-'.join(names)} in some order), "
                         "first fastest")
    return order


def rank_map(placement: Placement, order: Sequence[str] | None = None) -> RankMap:
    """The rank map of ``placement`` for ``order`` (default :func:`default_order`),
    checked against the placement's groups of every axis."""
    names = [a.name for a in placement.axes]
    order = default_order(names) if order is None else tuple(order)
    if sorted(order) != sorted(names):
        raise SynthError(f"order {'-'.join(order)}: must name the plan's axes {', '.join(names)} once each")
    slowest_first = [names.index(a) for a in reversed(order)]
    device_of_rank = placement.mesh.transpose(slowest_first).ravel()
    rank_of_device = np.empty_like(device_of_rank)
    rank_of_device[device_of_rank] = np.arange(device_of_rank.size)
    sizes = tuple(placement.axes[names.index(a)].size for a in order)
    result = RankMap(tuple(order), sizes, tuple(int(d) for d in device_of_rank),
                     tuple(int(r) for r in rank_of_device))
    check_rank_map(placement, result)
    return result


def check_rank_map(placement: Placement, ranks: RankMap) -> None:
    """SynthError unless ``ranks`` is a permutation with its inverse and, for
    every axis of size > 1, the trainer's groups mapped to devices are exactly
    the placement's reduction groups of that axis, member order included (the
    tables of :class:`~synth.synthesis.reduction.Reduction`, computed apart
    from the mesh)."""
    n = placement.topology.num_devices
    if sorted(ranks.device_of_rank) != list(range(n)):
        raise SynthError("rank map: device_of_rank is not a permutation of the devices")
    if any(ranks.rank_of_device[d] != r for r, d in enumerate(ranks.device_of_rank)):
        raise SynthError("rank map: rank_of_device is not the inverse of device_of_rank")
    for axis in placement.axes:
        if axis.size == 1:
            continue
        want = sorted(tuple(int(d) for d in row) for row in Reduction.of(placement, (axis.name,)).reduction_groups)
        got = sorted(ranks.device_groups(axis.name))
        if got != want:
            raise SynthError(f"rank map: the groups of axis {axis.name} are not the plan's")


def launch_environment(ranks: RankMap, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a process started by torchrun takes before
    ``init_process_group`` so that its rank is its device's trainer rank:
    ``RANK = rank_of_device[device]`` with ``device`` = torchrun's rank (node
    rank x processes per node + local rank, the plan's device id when node
    rank = the plan's node index). ``LOCAL_RANK`` (the GPU in the node) is
    kept: the process stays on its device. ``SYNTH_DEVICE`` says the device;
    ``SYNTH_RENUMBERED`` (torchrun's run id, device, new rank) marks a process
    already renumbered, so that a second call maps the same device again, and a
    marker inherited from another run or rank is ignored. SynthError unless
    torchrun's variables are there and the world is the plan's size."""
    missing = [v for v in ("RANK", "WORLD_SIZE") if v not in environ]
    if missing:
        raise SynthError(f"{', '.join(missing)} not set: run under torchrun (e.g. torchrun --nproc-per-node "
                         f"{len(ranks.device_of_rank)} -m synth.cli launch PLAN -- SCRIPT ...)")
    try:
        rank = int(environ["RANK"])
        world = int(environ["WORLD_SIZE"])
    except ValueError:
        raise SynthError(f"RANK={environ.get('RANK')!r} WORLD_SIZE={environ.get('WORLD_SIZE')!r}: not integers") \
            from None
    n = len(ranks.device_of_rank)
    if world != n:
        raise SynthError(f"the plan is for {n} ranks but WORLD_SIZE is {world}; launch {n} processes")
    run = environ.get("TORCHELASTIC_RUN_ID", "")
    marker = environ.get("SYNTH_RENUMBERED", "").rsplit(":", 2)
    device = rank
    if len(marker) == 3 and marker[0] == run and marker[2] == str(rank) and marker[1].isdigit():
        device = int(marker[1])  # renumbered already, in this run
    if not 0 <= device < n:
        raise SynthError(f"RANK {device} is outside the plan's {n} devices")
    new = ranks.rank_of_device[device]
    return {"RANK": str(new), "SYNTH_DEVICE": str(device), "SYNTH_RENUMBERED": f"{run}:{device}:{new}"}


def launch_command(topology: Topology, plan_path: str, script: str) -> str:
    """The torchrun line that runs ``script`` renumbered by the plan's rank map
    (``synth-reduce launch``): one torchrun per plan node, node rank = the
    plan's node index."""
    per_node = devices_per_node(topology)
    nodes = topology.num_devices // per_node
    node = " --node-rank <this node's index>" if nodes > 1 else ""
    return (f"torchrun --nnodes {nodes} --nproc-per-node {per_node}{node} -m synth.cli launch {plan_path} -- "
            f"{script}")
