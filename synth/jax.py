"""JAX consumes plans: a ``Mesh`` and the plan's program inside ``shard_map``
(extra ``jax``; the rest of the package never imports jax).

    import synth.jax
    mesh = synth.jax.mesh("plan.json", hierarchical=True)       # axes dp_node, dp_gpu, mp_gpu, ...
    reduce = synth.jax.reducer("plan.json")
    f = jax.shard_map(lambda g: reduce(g), mesh=mesh, in_specs=P(*mesh.axis_names), out_specs=P(*mesh.axis_names))

:func:`mesh` puts device ``d`` of the plan at the plan's mesh position of ``d``
(``jax.devices()[d]`` by default). :func:`reducer` returns a function of one
device's block (any shape; the program runs on its flattened elements, buffer
layout of ``docs/runtime.md``) for use inside ``shard_map`` over
``mesh(plan, hierarchical=True)``. Each step becomes:

* ``psum`` / ``psum_scatter`` / ``all_gather`` over the mesh sub-axes its groups
  vary, when its groups are exactly the sub-axis groups of those sub-axes, in
  member order (AllReduce, ReduceScatter, AllGather with inside and parallel
  forms): XLA's replica groups are then the plan's groups;
* otherwise ``ppermute`` rounds between the plan's group members only: Reduce is
  a binomial tree to the root (non-root buffers keep their data), Broadcast a
  binomial tree from it, ReduceScatter and AllGather ``m - 1`` shifted exchanges
  of one part each (the bytes of a ring), AllReduce a Reduce then a Broadcast
  (``docs/trainers.md`` says where this traffic differs from the library's).

Which pieces a device's group covers differs between groups of a step; each
device looks its pieces up by its mesh position (``axis_index``). Groups of a
step that cover fewer chunks than others are padded with a scratch row, so
every device runs the same shapes. :func:`execute` runs a plan on a
``(devices, n)`` array with the same semantics and results as the MPI runtime.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from .caches import memoised
from .errors import SynthError
from .plan import Plan, PlannedReduction, as_plan
from .runtime.executor import piece_length, schedule
from .runtime.meshes import MeshLayout, mesh_layout
from .synthesis.language import Collective
from .synthesis.lowering import LoweredProgram
from .synthesis.semantics import Goal


def mesh(plan: Plan | str | os.PathLike, hierarchical: bool = False, devices: Sequence[Any] | None = None) -> Mesh:
    """A ``jax.sharding.Mesh`` holding ``devices[d]`` (default ``jax.devices()``)
    at the plan's mesh position of device ``d``, with the plan's axis names, or
    one sub-axis per level each axis spans (:mod:`synth.runtime.meshes`)."""
    layout = mesh_layout(as_plan(plan).placement, hierarchical)
    return _mesh(layout, devices)


def _mesh(layout: MeshLayout, devices: Sequence[Any] | None) -> Mesh:
    devices = list(jax.devices() if devices is None else devices)
    wanted = layout.ids.size
    if len(devices) != wanted:
        raise SynthError(
            f"the plan is for {wanted} devices but {len(devices)} were given (jax.devices()); on CPU set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={wanted} before jax is imported"
        )
    grid = np.empty(layout.shape, dtype=object)
    for position, device_id in np.ndenumerate(layout.ids):
        grid[position] = devices[device_id]
    return Mesh(grid, layout.names)


# ---------------------------------------------------------------- one program as shard_map ops


@dataclass(frozen=True, eq=False)
class _Table:
    """Per mesh position, row indices into the device's ``(k + 1, q)`` work
    array (row ``k`` is scratch): static when every position has the same."""

    rows: np.ndarray  # (positions, width)

    @property
    def uniform(self) -> bool:
        return bool((self.rows == self.rows[0]).all())

    def index(self, position: Any) -> Any:
        if self.uniform:
            first = self.rows[0]
            if (np.diff(first) == 1).all():
                return slice(int(first[0]), int(first[-1]) + 1)
            return first
        return jnp.asarray(self.rows)[position]


def _take(x: Any, table: _Table, position: Any) -> Any:
    return x[table.index(position)]


def _put(x: Any, table: _Table, position: Any, values: Any) -> Any:
    return x.at[table.index(position)].set(values)


@dataclass(frozen=True)
class _SubAxisStep:
    """A step run as one XLA collective over mesh sub-axes."""

    collective: Collective
    axes: tuple[str, ...]
    covered: _Table  # the pieces of the device's group, parts padded to equal width
    own: _Table | None  # ReduceScatter/AllGather: the member's own part

    def __call__(self, x: Any, position: Any) -> Any:
        if self.collective is Collective.ALLREDUCE:
            return _put(x, self.covered, position, jax.lax.psum(_take(x, self.covered, position), self.axes))
        if self.collective is Collective.REDUCESCATTER:
            total = jax.lax.psum_scatter(_take(x, self.covered, position), self.axes, scatter_dimension=0, tiled=True)
            return _put(x, self.own, position, total)
        gathered = jax.lax.all_gather(_take(x, self.own, position), self.axes, axis=0, tiled=True)
        return _put(x, self.covered, position, gathered)


@dataclass(frozen=True)
class _Round:
    """One ``ppermute`` between mesh positions: each source sends its ``send``
    rows of the work array (None: its accumulator); each target writes what it
    receives to its ``recv`` rows (None: adds it into its accumulator). Devices
    that are no target receive zeros, written to the scratch row."""

    pairs: tuple[tuple[int, int], ...]
    send: _Table | None
    recv: _Table | None


@dataclass(frozen=True)
class _PermuteStep:
    """A step run as ``ppermute`` rounds between the members of its groups:
    the accumulator starts as the ``start`` rows, ``rounds`` run, the
    accumulator goes to the ``finish`` rows, then the ``after`` rounds run."""

    axes: tuple[str, ...]  # every mesh axis: ppermute indices are mesh positions
    start: _Table | None
    rounds: tuple[_Round, ...]
    finish: _Table | None
    after: tuple[_Round, ...] = ()

    def __call__(self, x: Any, position: Any) -> Any:
        acc = _take(x, self.start, position) if self.start is not None else None
        for r in self.rounds:
            x, acc = self._round(x, acc, r, position)
        if self.finish is not None:
            x = _put(x, self.finish, position, acc)
        for r in self.after:
            x, acc = self._round(x, acc, r, position)
        return x

    def _round(self, x: Any, acc: Any, r: _Round, position: Any) -> tuple[Any, Any]:
        payload = acc if r.send is None else _take(x, r.send, position)
        received = jax.lax.ppermute(payload, self.axes, perm=list(r.pairs))
        if r.recv is None:
            return x, acc + received
        return _put(x, r.recv, position, received), acc


class _Builder:
    """Tables of one lowered program on a hierarchical mesh layout."""

    def __init__(self, lowered: LoweredProgram, layout: MeshLayout, level_of_dim: Sequence[tuple[int, int]]) -> None:
        self.lowered = lowered
        self.layout = layout
        self.k = lowered.num_chunks
        self.positions = layout.ids.size
        self.position_of = np.empty(self.positions, dtype=np.int64)
        self.position_of[layout.ids.reshape(-1)] = np.arange(self.positions)
        self.coords = np.array(np.unravel_index(self.position_of, layout.shape)).T  # (devices, dims)
        self.order = level_of_dim  # synthesis order key of each dim

    def steps(self) -> list[Callable[[Any, Any], Any]]:
        per_device = [schedule(self.lowered, d) for d in range(self.positions)]
        out = []
        for number, step in enumerate(self.lowered.steps):
            calls = {d: next((c for c in per_device[d] if c.step == number), None) for d in range(self.positions)}
            sizes = {len(g) for g in step.groups}
            if len(sizes) != 1:
                raise SynthError(f"{step.instruction}: groups of different sizes are not supported by synth.jax")
            out.append(self._sub_axis(step, calls) or self._permute(step, calls))
        return out

    def _table(self, rows_of: Callable[[Any], Sequence[int]], calls: dict, width: int) -> _Table:
        """A table of ``width`` rows per position; positions without a call (or
        with fewer rows) get the scratch row ``k``."""
        rows = np.full((self.positions, width), self.k, dtype=np.int32)
        for d, call in calls.items():
            if call is not None:
                picked = list(rows_of(call))
                rows[self.position_of[d], :len(picked)] = picked
        return _Table(rows)

    def _parts(self, calls: dict) -> tuple[int, int]:
        """(members per group, widest part) of a step."""
        m = next(len(c.group) for c in calls.values() if c is not None)
        return m, max(len(c.pieces) // m for c in calls.values() if c is not None)

    def _padded_parts(self, call: Any, m: int, width: int) -> list[int]:
        """The call's pieces, each of its ``m`` parts padded to ``width``."""
        size = len(call.pieces) // m
        out: list[int] = []
        for i in range(m):
            part = list(call.pieces[i * size:(i + 1) * size])
            out += part + [self.k] * (width - len(part))
        return out

    def _part(self, call: Any, i: int, width: int) -> list[int]:
        size = len(call.pieces) // len(call.group)
        part = list(call.pieces[(i % len(call.group)) * size:(i % len(call.group) + 1) * size])
        return part + [self.k] * (width - len(part))

    def _sub_axis(self, step: Any, calls: dict) -> _SubAxisStep | None:
        collective = step.collective
        if collective not in (Collective.ALLREDUCE, Collective.REDUCESCATTER, Collective.ALLGATHER):
            return None
        if any(c is None for c in calls.values()):
            return None  # some devices idle (master forms)
        first = np.array(step.groups[0])
        varying = [i for i in range(len(self.layout.dims)) if len(set(self.coords[first, i])) > 1]
        varying.sort(key=lambda i: self.order[i])
        shape = [self.layout.dims[i].size for i in varying]
        for group in step.groups:
            coords = self.coords[np.array(group)]
            fixed = [i for i in range(len(self.layout.dims)) if i not in varying]
            if (coords[:, fixed] != coords[0, fixed]).any() or len(group) != int(np.prod(shape)):
                return None
            linear = np.ravel_multi_index(tuple(coords[:, varying].T), shape)
            if list(linear) != list(range(len(group))):
                return None  # member order is not the sub-axes' order
        axes = tuple(self.layout.dims[i].name for i in varying)
        m, width = self._parts(calls)
        if collective is Collective.ALLREDUCE:
            width = max(len(c.pieces) for c in calls.values())
            covered = self._table(lambda c: c.pieces, calls, width)
            return _SubAxisStep(collective, axes, covered, None)
        covered = self._table(lambda c: self._padded_parts(c, m, width), calls, m * width)
        own = self._table(lambda c: self._part(c, c.member, width), calls, width)
        return _SubAxisStep(collective, axes, covered, own)

    def _pairs(self, step: Any, member_pairs: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
        return tuple((int(self.position_of[g[a]]), int(self.position_of[g[b]]))
                     for g in step.groups for a, b in member_pairs)

    def _permute(self, step: Any, calls: dict) -> _PermuteStep:
        axes = self.layout.names
        collective = step.collective
        m, part_width = self._parts(calls)
        width = max(len(c.pieces) for c in calls.values() if c is not None)

        def rows(pick: Callable[[Any], Sequence[int]], w: int,
                 members: Callable[[int], bool] = lambda i: True) -> _Table:
            return self._table(pick, {d: c if c is not None and members(c.member) else None
                                      for d, c in calls.items()}, w)

        covered = rows(lambda c: c.pieces, width)
        up, down = self._binomial(m)
        reduce_rounds = tuple(_Round(self._pairs(step, pairs), None, None) for pairs in up)
        bcast_rounds = tuple(_Round(self._pairs(step, pairs), covered,
                                    rows(lambda c: c.pieces, width, lambda i, pairs=pairs: i in {b for _, b in pairs}))
                             for pairs in down)
        roots = rows(lambda c: c.pieces, width, lambda i: i == 0)
        if collective is Collective.REDUCE:
            return _PermuteStep(axes, covered, reduce_rounds, roots)
        if collective is Collective.BROADCAST:
            return _PermuteStep(axes, None, bcast_rounds, None)
        if collective is Collective.ALLREDUCE:
            return _PermuteStep(axes, covered, reduce_rounds, roots, bcast_rounds)
        own = rows(lambda c: self._part(c, c.member, part_width), part_width)
        shifted = [[(i, (i + s) % m) for i in range(m)] for s in range(1, m)]
        if collective is Collective.REDUCESCATTER:  # member i sends part i+s of its data to member i+s
            sends = [rows(lambda c, s=s: self._part(c, c.member + s, part_width), part_width) for s in range(1, m)]
            return _PermuteStep(axes, own, tuple(_Round(self._pairs(step, pairs), send, None)
                                                 for pairs, send in zip(shifted, sends)), own)
        # AllGather: member i sends its own part to member i+s, which writes it as part i
        recvs = [rows(lambda c, s=s: self._part(c, c.member - s, part_width), part_width) for s in range(1, m)]
        return _PermuteStep(axes, None, tuple(_Round(self._pairs(step, pairs), own, recv)
                                              for pairs, recv in zip(shifted, recvs)), None)

    @staticmethod
    def _binomial(m: int) -> tuple[list[list[tuple[int, int]]], list[list[tuple[int, int]]]]:
        """Member pairs per round of a binomial reduce to member 0 and of a
        binomial broadcast from it."""
        up, span = [], 1
        while span < m:
            up.append([(i, i - span) for i in range(span, m, 2 * span)])
            span *= 2
        down = [[(b, a) for a, b in pairs] for pairs in reversed(up)]
        return up, down


# ---------------------------------------------------------------- the API


def _steps(lowered: LoweredProgram, layout: MeshLayout, axis_names: Sequence[str]) -> list[Callable[[Any, Any], Any]]:
    """The shard_map ops of one program. Sub-axes are ordered as the synthesis
    hierarchy orders a group's members: outer level first, then axes in
    declared order (docs/model.md)."""
    order = [(d.level if d.level is not None else len(layout.dims), axis_names.index(d.axis)) for d in layout.dims]
    return _Builder(lowered, layout, order).steps()


@memoised(maxsize=64)
def _compiled(plan: Plan, reduce: str | None, goal: str | None) -> tuple[PlannedReduction, MeshLayout, tuple]:
    planned = plan.find(reduce, goal)
    layout = mesh_layout(plan.placement, hierarchical=True)
    names = plan.placement.axis_names
    return planned, layout, tuple(tuple(_steps(p.lowered, layout, names)) for p in planned.programs)


def _key(reduce: str | Sequence[str] | None, goal: Goal | str | None) -> tuple[str | None, str | None]:
    if reduce is not None and not isinstance(reduce, str):
        reduce = ",".join(reduce)
    return reduce, goal.value if isinstance(goal, Goal) else goal


def reducer(plan: Plan | str | os.PathLike, reduce: str | Sequence[str] | None = None,
            goal: Goal | str | None = None) -> Callable[[Any], Any]:
    """The plan's program as a function of one device's block, for use inside
    ``jax.shard_map`` over ``mesh(plan, hierarchical=True)`` with every mesh
    axis in the block's spec. The block's elements, flattened, are the device's
    buffer (layout of ``docs/runtime.md``); the program is the one whose size
    range holds the block's bytes. ``reduce`` and ``goal`` name the reduction
    when the plan holds several."""
    planned, layout, programs = _compiled(as_plan(plan), *_key(reduce, goal))
    k = planned.programs[0].lowered.num_chunks

    def run(block: Any) -> Any:
        n = block.size
        steps = programs[planned.programs.index(planned.program_for(n * block.dtype.itemsize))]
        q = piece_length(n, k)
        if q == 0:
            return block
        flat = block.reshape(-1)
        x = jnp.concatenate([flat, jnp.zeros((k + 1) * q - n, block.dtype)]).reshape(k + 1, q)  # row k: scratch
        position = jax.lax.axis_index(layout.names)
        for step in steps:
            x = step(x, position)
        return x.reshape(-1)[:n].reshape(block.shape)

    return run


@memoised(maxsize=64)
def _jitted(plan: Plan, reduce: str | None, goal: str | None) -> tuple[Callable[[Any], Any], MeshLayout]:
    layout = mesh_layout(plan.placement, hierarchical=True)
    spec = PartitionSpec(*layout.names, None)
    run = jax.shard_map(reducer(plan, reduce, goal), mesh=_mesh(layout, None), in_specs=spec, out_specs=spec)
    return jax.jit(run), layout


def execute(plan: Plan | str | os.PathLike, buffers: Any, reduce: str | Sequence[str] | None = None,
            goal: Goal | str | None = None) -> np.ndarray:
    """Run the plan on ``buffers`` (shape ``(devices, n)``, row ``d`` = device
    ``d``'s buffer) through :func:`reducer` on ``jax.devices()``; return the
    rows after the program, as the MPI runtime leaves them. 64-bit dtypes need
    JAX's x64 mode (else JAX would silently compute in 32 bits)."""
    plan = as_plan(plan)
    buffers = np.asarray(buffers)
    devices = plan.placement.topology.num_devices
    if buffers.ndim != 2 or buffers.shape[0] != devices:
        raise SynthError(f"buffers: expected shape ({devices}, n), one row per device of the plan, "
                         f"got {buffers.shape}")
    if buffers.dtype.itemsize == 8 and not jax.config.jax_enable_x64:
        raise SynthError(f"buffers: {buffers.dtype} needs 64-bit JAX (jax.config.update('jax_enable_x64', True) "
                         "or `with jax.enable_x64(True)`); JAX would compute in 32 bits")
    run, layout = _jitted(plan, *_key(reduce, goal))
    order = layout.ids.reshape(-1)
    out = np.asarray(run(buffers[order].reshape(*layout.shape, buffers.shape[1])))
    result = np.empty_like(buffers)
    result[order] = out.reshape(devices, -1)
    return result
