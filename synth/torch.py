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

:class:`Executor` is :class:`synth.runtime.Executor` on a :class:`TorchWorld`:
the same schedule, buffer layout and semantics as the MPI runtime
(``docs/runtime.md``), with one process group per distinct group of the plan,
created by every rank in the same order (NCCL for CUDA tensors, gloo for CPU
tensors). See ``docs/trainers.md``.
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import time
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist

from . import runtime
from .backends import GPU_DTYPES
from .errors import SynthError
from .meshes import devices_per_node, launch_problem, mesh_layout
from .plan import Plan, as_plan
from .runtime import Group, World
from .semantics import Goal

# torch 2.13 renamed the single-tensor collectives; older versions have the old names only
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


# ---------------------------------------------------------------- the world


class _Tensors:
    """What :mod:`synth.runtime` and :mod:`synth.bench` use of an array module,
    for torch tensors on one device."""

    __name__ = "torch"
    ndarray = torch.Tensor

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def empty(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(n, dtype=dtype, device=self.device)

    def zeros(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(n, dtype=dtype, device=self.device)

    def empty_like(self, a: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(a)

    def asarray(self, a: np.ndarray) -> torch.Tensor:
        """A copy of a numpy array (bfloat16 from ml_dtypes too) on the device,
        as ``cupy.asarray`` copies to the GPU: the two never share memory."""
        if a.dtype.name == "bfloat16":
            return torch.from_numpy(a.astype(np.float32)).to(self.device, torch.bfloat16)
        return torch.from_numpy(np.ascontiguousarray(a)).to(self.device, copy=True)


class _TorchComm:
    """The five collectives of :mod:`synth.runtime` on one process group whose
    rank ``i`` is ``group[i]`` (root = member 0), in place, sum."""

    def __init__(self, group: Group, pg: Any, member: int) -> None:
        self.group, self.pg, self.member = group, pg, member
        self.root = group[0]

    def allreduce(self, a: torch.Tensor) -> None:
        dist.all_reduce(a, group=self.pg)

    def reduce_scatter(self, a: torch.Tensor, out: torch.Tensor) -> None:
        _reduce_scatter(out, a, group=self.pg)

    def allgather(self, a: torch.Tensor) -> None:
        n = a.shape[0] // len(self.group)
        _all_gather(a, a[self.member * n:(self.member + 1) * n], group=self.pg)

    def reduce(self, a: torch.Tensor) -> None:
        # gloo's reduce overwrites the input of non-root members; the language's
        # Reduce leaves it as it was, so they send a copy
        dist.reduce(a if self.member == 0 else a.clone(), dst=self.root, group=self.pg)

    def bcast(self, a: torch.Tensor) -> None:
        dist.broadcast(a, src=self.root, group=self.pg)


def _new_group(ranks: Group) -> Any:
    """A process group whose rank ``i`` is ``ranks[i]`` (``new_group`` sorts
    ranks unless told not to; plans list groups in ascending order anyway)."""
    if list(ranks) == sorted(ranks):
        return dist.new_group(list(ranks))
    return dist.new_group(list(ranks), sort_ranks=False)


class TorchWorld(World):
    """This process's rank of torch.distributed's default process group. Its
    collectives run on CUDA tensors of the current device when the group has
    NCCL and CUDA is available, else on CPU tensors (gloo)."""

    name = "torch"
    launcher = "torchrun --nproc-per-node {ranks}"
    dtypes = GPU_DTYPES  # gloo sums all six on CPU tensors too (tests/test_gpu_check.py)

    def __init__(self, owns_group: bool = False) -> None:
        super().__init__()
        self.owns_group = owns_group  # created by init_process_group(): close() destroys it
        if not (dist.is_available() and dist.is_initialized()):
            raise SynthError("torch.distributed is not initialized: call torch.distributed.init_process_group() "
                             "(or synth.torch.init_process_group()) first, in a process started by torchrun")
        self.pg = dist.group.WORLD
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        backend = str(dist.get_backend()).lower()
        self.library = "nccl" if "nccl" in backend and torch.cuda.is_available() else backend.split(":")[-1]
        if self.library == "nccl":
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
        self.xp = _Tensors(self.device)

    @property
    def nccl_version(self) -> str | None:
        """The version of the NCCL that torch loaded, when the world uses NCCL."""
        if self.library != "nccl":
            return None
        version = torch.cuda.nccl.version()
        return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)

    def allgather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def split(self, groups: Sequence[Group]) -> _TorchComm | None:
        mine = None
        for group in groups:  # every rank creates every group, in the same order
            pg = _new_group(group)
            if self.rank in group:
                mine = _TorchComm(group, pg, group.index(self.rank))
        return mine

    def barrier(self) -> None:
        dist.barrier()

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def wtime(self) -> float:
        return time.perf_counter()

    def dtype_name(self, buffer: Any) -> str:
        return str(buffer.dtype).removeprefix("torch.")

    def buffer_problem(self, buffer: Any) -> str | None:
        if not isinstance(buffer, torch.Tensor):
            return f"the torch backend takes torch tensors, not {type(buffer).__name__}"
        if buffer.dim() != 1 or not buffer.is_contiguous():
            return "the buffer must be a 1-D contiguous tensor (use tensor.reshape(-1) on a contiguous tensor)"
        if buffer.device.type != self.device.type:
            return (f"the buffer is on {buffer.device} but this world's {self.library} collectives take "
                    f"{self.device.type} tensors; move it with tensor.to({str(self.device)!r})")
        name = self.dtype_name(buffer)
        if name not in self.dtypes:
            return f"dtype {name} is not supported by the torch backend; use one of {', '.join(sorted(self.dtypes))}"
        return None

    def close(self) -> None:
        """Destroy the default process group if :func:`init_process_group` made it."""
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()
        _world_cache.clear()

    def abort(self, code: int = 1) -> None:
        """End this process at once; torchrun then stops every other rank."""
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


_world_cache: list[TorchWorld] = []
# Dropped before the interpreter tears modules down: a world holds its process
# groups, and a gloo group destroyed during that teardown (after the trainer's
# destroy_process_group) can abort the process ("terminate called without an
# active exception"), seen under torchrun on a loaded machine.
atexit.register(_world_cache.clear)


def world() -> TorchWorld:
    """The world of the current default process group, created once, so that
    executors share their process groups."""
    if not _world_cache or _world_cache[0].pg is not dist.group.WORLD:
        _world_cache[:] = [TorchWorld()]
    return _world_cache[0]


def init_process_group() -> TorchWorld:
    """Initialize torch.distributed from torchrun's environment unless it is
    already: NCCL on CUDA tensors when GPUs are visible (rank on GPU ``LOCAL_RANK``
    modulo their count) with gloo for CPU objects, else gloo. A world made here
    destroys the process group on ``close()``."""
    if dist.is_initialized():
        return world()
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise SynthError(f"the torch backend runs under torchrun ({', '.join(missing)} not set); e.g. "
                         "torchrun --nproc-per-node 8 -m synth.cli bench --backend torch ...")
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        dist.init_process_group("cpu:gloo,cuda:nccl")
    else:
        dist.init_process_group("gloo")
    _world_cache[:] = [TorchWorld(owns_group=True)]
    return _world_cache[0]


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
    level each axis spans (``dp_node``, ``dp_gpu``; :mod:`synth.meshes`). Built
    with the ``DeviceMesh`` constructor (``init_device_mesh`` is row-major only).
    Collective."""
    from torch.distributed.device_mesh import DeviceMesh

    loaded, problem = _loaded(plan, lambda p: mesh_layout(p.placement, hierarchical))
    _checked_world(loaded, problem)
    layout = mesh_layout(loaded.placement, hierarchical)
    return DeviceMesh(device_type, torch.as_tensor(layout.ids.copy()), mesh_dim_names=layout.names)


class Executor(runtime.Executor):
    """Runs a plan's program in place on a 1-D contiguous tensor (CUDA under
    NCCL, CPU under gloo), like :class:`synth.runtime.Executor` (same layout,
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
