"""PyTorch consumes plans: a ``DeviceMesh``, an executor on torch.distributed
process groups, and a DDP communication hook (extra ``torch``; the rest of the
package never imports torch).

    import synth.torch
    mesh = synth.torch.device_mesh("plan.json")                 # dims named after the plan's axes
    ddp = DDP(model, process_group=mesh.get_group("dp"))
    ddp.register_comm_hook(None, synth.torch.comm_hook("plan.json"))

Launch with ``torchrun`` so that torch rank = the plan's device id: node rank =
the plan's node index, local rank = the device's index in its node (on one host
for testing, ``torchrun --nproc-per-node N``). Everything here is collective over
the default process group: every rank calls it, in the same order. A plan is a
path or a loaded :class:`synth.plan.Plan`. A launch whose world size differs from
the plan, or whose ranks of one plan node do not share a host, raises the same
SynthError on every rank before any other collective (never a hang).

:class:`Executor` is :class:`synth.runtime.executor.Executor` on a :class:`TorchWorld`:
the same schedule, buffer layout and semantics as the MPI runtime
(``docs/runtime.md``), with one process group per distinct group of the plan,
created by every rank in the same order (NCCL for CUDA tensors, gloo for CPU
tensors). See ``docs/trainers.md``.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Callable, Sequence

import torch

from .errors import SynthError
from .plan import Plan, as_plan
from .runtime import executor as runtime
from .runtime.meshes import devices_per_node, launch_problem, mesh_layout
from .runtime.torch_world import TorchWorld, init_process_group, world
from .synthesis.semantics import Goal

__all__ = ["Executor", "TorchWorld", "comm_hook", "device_mesh", "init_process_group", "world"]


# ---------------------------------------------------------------- the launch


def _launch_hint(devices: int, per_node: int) -> str:
    nodes = devices // per_node
    if nodes == 1:
        return f"run torchrun --nproc-per-node {devices}"
    return (f"run torchrun --nnodes {nodes} --nproc-per-node {per_node} with --node-rank = the plan's node index "
            f"(on one host: torchrun --nproc-per-node {devices})")


def _checked_world(plan: Plan | None, problem: str | None = None) -> TorchWorld:
    """The world, after every rank agreed that this launch can run the plan
    (world size, hosts) and that ``problem`` (this rank's) is None. ``plan`` is
    None where this rank could not load it (``problem`` says why); every rank
    makes the same collectives either way."""
    w = world()
    hosts = w.allgather(socket.gethostname())
    launch = None
    if plan is not None:
        topology = plan.placement.topology
        launch = launch_problem(topology, hosts, _launch_hint(topology.num_devices, devices_per_node(topology)))
    w.agree(launch or problem)
    return w


def _loaded(plan: Plan | str | os.PathLike, check: Callable[[Plan], Any] = lambda plan: None
            ) -> tuple[Plan | None, str | None]:
    """This rank's plan (a path is loaded) after ``check``, or None and why not:
    what :func:`_checked_world` then agrees on, so a missing or corrupted copy
    on one rank is one error on every rank, never a hang. Not a plan at all is
    an error at once (the caller's, the same on every rank)."""
    if not isinstance(plan, (Plan, str, os.PathLike)):
        as_plan(plan)  # raises
    try:
        loaded = as_plan(plan)
        check(loaded)
        return loaded, None
    except SynthError as exc:
        return None, str(exc)


# ---------------------------------------------------------------- the API


def device_mesh(plan: Plan | str | os.PathLike, device_type: str = "cuda", hierarchical: bool = False) -> Any:
    """A ``DeviceMesh`` holding the plan's mesh (device id = torch rank), its
    dims named after the plan's axes, or with ``hierarchical=True`` one dim per
    level each axis spans (``dp_node``, ``dp_gpu``; :mod:`synth.runtime.meshes`). Built
    with the ``DeviceMesh`` constructor (``init_device_mesh`` is row-major only).
    Collective."""
    from torch.distributed.device_mesh import DeviceMesh

    loaded, problem = _loaded(plan, lambda p: mesh_layout(p.placement, hierarchical))
    _checked_world(loaded, problem)
    layout = mesh_layout(loaded.placement, hierarchical)
    return DeviceMesh(device_type, torch.as_tensor(layout.ids.copy()), mesh_dim_names=layout.names)


class Executor(runtime.Executor):
    """Runs a plan's program in place on a 1-D contiguous tensor (CUDA under
    NCCL, CPU under gloo), like :class:`synth.runtime.executor.Executor` (same layout,
    semantics, size ranges and ``check``) on :func:`world`. ``reduce`` and
    ``goal`` name the reduction when the plan holds several. Building it and
    every call are collective over the default process group."""

    def __init__(self, plan: Plan | str | os.PathLike, reduce: str | Sequence[str] | None = None,
                 goal: Goal | str | None = None) -> None:
        loaded, problem = _loaded(plan, lambda p: p.find(reduce, goal))
        super().__init__(loaded, _checked_world(loaded, problem), reduce, goal)


def comm_hook(plan: Plan | str | os.PathLike, reduce: str | Sequence[str] | None = None) -> Callable[..., Any]:
    """A DDP communication hook that runs the plan's allreduce over ``reduce``
    (default: the plan's only allreduce) on each gradient bucket, averaging like
    DDP's default hook (divide by the reduction group size, then sum). The
    program is picked by bucket size when the plan has several size ranges. Use
    it with DDP on the plan's reduction groups (``device_mesh(plan).get_group(axis)``
    for one axis): ``ddp.register_comm_hook(None, comm_hook(plan))``. Building it
    is collective; so is every bucket (as with any DDP hook)."""
    executor = Executor(plan, reduce, Goal.ALLREDUCE)
    group_size = executor.programs[0].lowered.num_chunks
    w = executor.world

    def hook(state, bucket):  # no annotations: DDP checks them against dist.GradBucket and Future[Tensor]
        tensor = bucket.buffer()
        problem = w.buffer_problem(tensor)
        if problem is not None:
            raise SynthError(problem)
        tensor.div_(group_size)
        executor(tensor, check=False)  # DDP gives every rank of a group the same buckets
        future = torch.futures.Future()
        future.set_result(tensor)
        return future

    return hook
