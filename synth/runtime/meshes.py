"""Device meshes of a plan for trainers, and the host ("node") of each device.

A plan's mesh (``Placement.mesh``) is an array of shape (axis sizes) holding
device ids; under ``torchrun`` with node rank = the plan's node index and local
rank = the device's index in its node, device id = torch rank, and JAX's
``Mesh`` takes the same array of devices. :func:`mesh_layout` gives it flat
(one dimension per axis, named after the axis) or hierarchical: each axis split
into one dimension per level it spans (``X[a][l] > 1``), named ``{axis}_{level}``
(``dp_node``, ``dp_gpu``), outer level first, in the axis' place; an axis of
size 1 spans no level and keeps one dimension of size 1 named after the axis.
Both follow from the digit convention of :mod:`synth.synthesis.placement` (an axis rank is
the mixed-radix number of its digits over the levels, outer level most
significant), so the hierarchical array is a reshape of the flat one.

:func:`node_of_device` says which host each device needs to share with the
others of its node: the topology level named ``node`` if there is one, else the
level above the innermost; a one-level topology is one host. Devices of one
node are consecutive ids. numpy only, like :mod:`synth.runtime.executor`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import SynthError
from ..synthesis.placement import Placement
from ..topology import Topology


@dataclass(frozen=True)
class MeshDim:
    """One mesh dimension: its name, size, the axis it belongs to and the
    topology level it spans (None for a flat axis or an axis of size 1)."""

    name: str
    size: int
    axis: str
    level: int | None


@dataclass(frozen=True)
class MeshLayout:
    """Device ids in an array of shape ``tuple(d.size for d in dims)``."""

    ids: np.ndarray
    dims: tuple[MeshDim, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dims)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(d.size for d in self.dims)


def mesh_layout(placement: Placement, hierarchical: bool = False) -> MeshLayout:
    """The plan's mesh, flat or with one sub-axis per level (module docstring)."""
    levels = placement.topology.level_names
    dims: list[MeshDim] = []
    for axis, row in zip(placement.axes, placement.matrix):
        spanned = [level for level, split in enumerate(row) if split > 1]
        if not hierarchical or not spanned:
            dims.append(MeshDim(axis.name, axis.size, axis.name, spanned[0] if len(spanned) == 1 else None))
            continue
        dims.extend(MeshDim(f"{axis.name}_{levels[level]}", row[level], axis.name, level) for level in spanned)
    names = [d.name for d in dims]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise SynthError(f"mesh dimension name(s) {', '.join(clash)} occur twice (an axis is named like "
                         "another axis' sub-axis); rename the axis")
    ids = placement.mesh.reshape([d.size for d in dims])
    ids.setflags(write=False)
    return MeshLayout(ids, tuple(dims))


def host_level(topology: Topology) -> int | None:
    """The index of the level whose elements are hosts (see the module
    docstring); None when the whole topology is one host."""
    names = topology.level_names
    if "node" in names:
        return names.index("node")
    return len(names) - 2 if len(names) >= 2 else None


def devices_per_node(topology: Topology) -> int:
    """How many consecutive device ids share one host."""
    level = host_level(topology)
    return math.prod(topology.counts[level + 1:]) if level is not None else topology.num_devices


def node_of_device(topology: Topology) -> np.ndarray:
    """``node[d]``: the index of device ``d``'s host (0 everywhere for one host)."""
    return np.arange(topology.num_devices) // devices_per_node(topology)


def launch_problem(topology: Topology, hosts: list[str], launch: str) -> str | None:
    """Why this launch cannot run a plan on ``topology``, or None: ``hosts[r]``
    is the host name of rank ``r`` (``len(hosts)`` = the world size); the world
    size must be the plan's device count and every plan node's ranks must share
    one host. ``launch`` says how to start the plan's ranks right."""
    devices = topology.num_devices
    per_node = devices_per_node(topology)
    if len(hosts) != devices:
        return (f"the plan is for {devices} ranks ({devices // per_node} node(s) x {per_node}) but {len(hosts)} "
                f"were launched; {launch}")
    node = node_of_device(topology)
    for n in range(devices // per_node):
        ranks = np.flatnonzero(node == n)
        seen: dict[str, list[int]] = {}
        for r in ranks:
            seen.setdefault(hosts[r], []).append(int(r))
        if len(seen) > 1:
            where = "; ".join(f"{','.join(map(str, rs))} on {h}" for h, rs in seen.items())
            return f"ranks {ranks[0]}..{ranks[-1]} of plan node {n} must share one host but run on several " \
                   f"(ranks {where}); {launch}"
    return None


def launch_shape_problem(topology: Topology, environ: dict[str, str] | Any) -> str | None:
    """Why torchrun's launch (``WORLD_SIZE`` ranks, ``LOCAL_WORLD_SIZE`` per
    host) does not have the plan's shape (its nodes x devices per node), or
    None: a plan made for another topology of the same world size is refused
    before anything runs. The same on every rank (torchrun gives every rank
    the same sizes). Every rank on one host (a test of a multi-node plan on
    one machine) and a launch that does not give the sizes pass."""
    try:
        world, local = int(environ["WORLD_SIZE"]), int(environ["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    per_node, devices = devices_per_node(topology), topology.num_devices
    if world == local or (world == devices and local == per_node):
        return None
    return (f"the plan is for {devices // per_node} node(s) x {per_node} devices ({topology.name}) but torchrun "
            f"launched {world // max(local, 1)} node(s) x {local} ranks: plan for this cluster (--topology, "
            f"--scale), or launch with --nproc-per-node {per_node} on {devices // per_node} node(s)")
