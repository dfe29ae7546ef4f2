"""PyTorch consumes plans: a ``DeviceMesh``, an executor on torch.distributed
process groups, and a DDP communication hook (extra ``torch``; the rest of the
package never imports torch).

    import synth.torch
    mesh = synth.torch.device_mesh("plan.json")                 # dims named after the plan's axes
    ddp = DDP(model, process_group=mesh.get_group("dp"))
    ddp.register_comm_hook(ddp.process_group, synth.torch.comm_hook("plan.json"))

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

Test hook: ``_BucketQueue`` (the communication hook's queue of buckets, run in
submission order on a thread of its own).
"""

from __future__ import annotations

import gc
import os
import queue
import socket
import threading
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist

from .errors import SynthError
from .export.rank_map import launch_environment, rank_map
from .export.trainer import TRAINER_MESH_DIMS, renamed, trainer_mesh_ids
from .plan import Plan, as_plan
from .runtime import executor as runtime
from .runtime.agreement import agree_on_digest, call_digest, refuse_together
from .runtime.meshes import devices_per_node, launch_problem, launch_shape_problem, mesh_layout
from .runtime.torch_world import TorchWorld, init_process_group, world
from .synthesis.semantics import Goal

__all__ = ["Executor", "TorchWorld", "comm_hook", "device_mesh", "init_process_group", "launch_rank",
           "trainer_mesh", "world"]


# ---------------------------------------------------------------- the launch


def launch_rank(plan: Plan | str | os.PathLike, order: Sequence[str] | None = None) -> int:
    """Renumber this process's torch rank by the plan's rank map
    (:mod:`synth.export.rank_map`) before ``init_process_group``: under
    torchrun, the process on device ``d`` takes ``RANK = rank_of_device[d]``
    (``LOCAL_RANK``, its GPU, is kept), so that groups formed from rank order
    in ``order`` (default: Megatron's ``tp-cp-ep-dp-pp``, first fastest) are
    the plan's. Returns the new rank. Call it once per process, before any
    process group exists; a second call maps the same device again. Not
    collective; ``synth-reduce launch`` does the same for a script it runs."""
    if dist.is_available() and dist.is_initialized():
        raise SynthError("launch_rank() must run before init_process_group(): the rank is fixed once the "
                         "process group exists")
    loaded = as_plan(plan)
    shape = launch_shape_problem(loaded.placement.topology, os.environ)
    if shape is not None:
        raise SynthError(shape)
    updates = launch_environment(rank_map(loaded.placement, order), os.environ)
    os.environ.update(updates)
    return int(updates["RANK"])


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
        launch = (launch_problem(topology, hosts, _launch_hint(topology.num_devices, devices_per_node(topology)))
                  or launch_shape_problem(topology, os.environ))
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
    except (TypeError, ValueError, AttributeError, KeyError) as exc:  # a wrong argument on this rank: agreed too
        return None, f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------- the API


def device_mesh(plan: Plan | str | os.PathLike, device_type: str = "cuda", hierarchical: bool = False) -> Any:
    """A ``DeviceMesh`` holding the plan's mesh (each device as the torch rank
    running it: the device id itself unless the launch renumbered), its
    dims named after the plan's axes, or with ``hierarchical=True`` one dim per
    level each axis spans (``dp_node``, ``dp_gpu``; :mod:`synth.runtime.meshes`). Built
    with the ``DeviceMesh`` constructor (``init_device_mesh`` is row-major only).
    Collective."""
    from torch.distributed.device_mesh import DeviceMesh

    loaded, problem = _loaded(plan, lambda p: mesh_layout(p.placement, hierarchical))
    w = _checked_world(loaded, problem)
    layout = mesh_layout(loaded.placement, hierarchical)
    return DeviceMesh(device_type, _torch_ranks(w, layout.ids), mesh_dim_names=layout.names)


def _torch_ranks(w: TorchWorld, ids: np.ndarray) -> torch.Tensor:
    """An array of device ids as the torch ranks running them (the same array
    unless the launch renumbered the ranks)."""
    return torch.as_tensor(np.asarray(w.rank_of_device)[ids])


def trainer_mesh(plan: Plan | str | os.PathLike, device_type: str = "cuda",
                 axis_names: dict[str, str] | None = None) -> Any:
    """A ``DeviceMesh`` with the same dimension names whatever the placement:
    ``pp, dp_replicate, dp_shard, cp, tp`` (torchtitan's; size 1 where the plan
    has no such axis), plus the flattened ``dp`` (``dp_replicate x dp_shard``),
    so that trainer code says ``mesh["tp"]`` or ``fully_shard(model,
    mesh=mesh["dp_replicate", "dp_shard"])`` (HSDP: shard inside the innermost
    level dp spans, replicate across) for any plan. Device id = torch rank, as
    for :func:`device_mesh`; ``axis_names`` renames the plan's axes
    (``{"mp": "tp"}``). Collective."""
    from torch.distributed.device_mesh import DeviceMesh

    def check(p: Plan) -> None:
        trainer_mesh_ids(renamed(p.placement, axis_names or {}))

    loaded, problem = _loaded(plan, check)
    w = _checked_world(loaded, problem)
    ids = trainer_mesh_ids(renamed(loaded.placement, axis_names or {}))
    mesh = DeviceMesh(device_type, _torch_ranks(w, ids), mesh_dim_names=TRAINER_MESH_DIMS)
    flatten = getattr(mesh["dp_replicate", "dp_shard"], "_flatten", None)  # torch >= 2.4
    if flatten is not None:
        flatten("dp")
    return mesh


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


class _BucketQueue:
    """Runs programs on buckets one after the other in a thread of its own, in
    the order they were submitted, so that a hook returns at once and backward
    goes on. One queue per world (:func:`_queue_of`), shared by every hook of
    the process: hooks share the world's process groups, and one thread
    issuing all their collectives in submission order (the same on every rank,
    since DDP hands every rank its buckets in the same order) keeps the
    collectives of each group in the same order on every rank. Each bucket's
    future completes with the bucket once the program's last step has run on
    it, or with the step's exception."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._work, name="synth-comm-hook", daemon=True)
        self.thread.start()

    def submit(self, run: Callable[[torch.Tensor], None], tensor: torch.Tensor) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future()
        self.queue.put((run, tensor, future))
        return future

    def _work(self) -> None:
        while True:
            run, tensor, future = self.queue.get()
            try:
                run(tensor)
            except BaseException as exc:  # noqa: BLE001 - handed to the future, raised where DDP waits
                future.set_exception(exc)
            else:
                future.set_result(tensor)


_queues: dict[int, tuple[TorchWorld, _BucketQueue]] = {}


def _queue_of(w: TorchWorld) -> _BucketQueue:
    """The bucket queue of world ``w`` (made on first use)."""
    entry = _queues.get(id(w))
    if entry is None or entry[0] is not w:
        entry = _queues[id(w)] = (w, _BucketQueue())
    return entry[1]


def _sparse_executors(executor: Executor) -> dict[int, Any]:
    """The sparse form of each of the executor's plan programs
    (:class:`~synth.runtime.sparse.SparseExecutor`, coo wire format, hashed
    over the program's chunks), by ``id`` of its lowered program; built on
    every rank at once (its communicators are collective)."""
    from .runtime.sparse import SparseExecutor
    from .synthesis.hashing import Encoding, HashPartition

    out = {}
    for planned in executor.programs:
        lowered = planned.lowered
        out[id(lowered)] = SparseExecutor(lowered, executor.world, HashPartition(lowered.num_chunks,
                                                                                 (lowered.num_chunks,)),
                                          Encoding.COO)
    return out


def _group_problem(state: Any, group: Sequence[int]) -> str | None:
    """Why the process group ``state`` (DDP's) is not the plan's reduction
    group ``group`` of this rank, given as torch ranks, or None."""
    if state is None:
        return ("the hook needs DDP's process group as its state, to check that it spans the plan's reduction "
                "group: ddp.register_comm_hook(ddp.process_group, synth.torch.comm_hook(plan))")
    try:
        ranks = sorted(dist.get_process_group_ranks(state))
    except (TypeError, ValueError, RuntimeError, AttributeError):
        return f"the hook's state is {type(state).__name__}, not a process group; register it with " \
               "ddp.register_comm_hook(ddp.process_group, hook)"
    if ranks != sorted(group):
        return (f"DDP's process group spans ranks {ranks} but the plan reduces over {sorted(group)} here; "
                "give DDP the plan's group (synth.torch.device_mesh(plan).get_group(axis)), else replicas "
                "would silently diverge")
    return None


def _ddp_holding(hook: Callable[..., Any]) -> Any:
    """The DistributedDataParallel module this hook is registered on, or None:
    DDP keeps ``(hook, state)`` in its ``_comm_hooks`` list
    (``register_comm_hook``), which leads back to it."""
    from torch.nn.parallel import DistributedDataParallel

    for pair in gc.get_referrers(hook):
        if not (isinstance(pair, tuple) and len(pair) == 2 and pair[0] is hook):
            continue
        for hooks in gc.get_referrers(pair):
            if not isinstance(hooks, list):
                continue
            for owner in gc.get_referrers(hooks):
                if isinstance(owner, dict):  # the module's __dict__ (where the interpreter keeps one)
                    owner = next((o for o in gc.get_referrers(owner) if isinstance(o, DistributedDataParallel)),
                                 None)
                if isinstance(owner, DistributedDataParallel) and getattr(owner, "_comm_hooks", None) is hooks:
                    return owner
    return None


def _agree_on_hook(plan: Any, reduce: Any, process_group: Any, sparse: bool) -> None:
    """Before the hook's first collective: the same refusal on every rank
    when torch.distributed is not initialized (each rank waits for the others
    in torchrun's store, :func:`~synth.runtime.agreement.refuse_together`),
    else every rank agrees on a digest of the call's arguments (the plan is
    compared by its programs when the executor is built: copies at different
    paths are fine)."""
    if not (dist.is_available() and dist.is_initialized()):
        raise refuse_together("torch.distributed is not initialized: call torch.distributed.init_process_group() "
                              "(or synth.torch.init_process_group()) before building the hook, on every rank")
    agree_on_digest(world(), "arguments to comm_hook (reduce, process_group, sparse)",
                    call_digest(reduce, process_group is not None, bool(sparse)))


def comm_hook(plan: Plan | str | os.PathLike, reduce: str | Sequence[str] | None = None,
              process_group: Any = None, sparse: bool = False) -> Callable[..., Any]:
    """A DDP communication hook that runs the plan's allreduce over ``reduce``
    (default: the plan's only allreduce) on each gradient bucket, averaging like
    DDP's default hook (divide by the reduction group size, then sum). The
    program is picked by bucket size when the plan has several size ranges.

    Register it with DDP's process group as its state:
    ``ddp.register_comm_hook(ddp.process_group, comm_hook(plan))``. DDP's own
    process group (``ddp.process_group`` of the DDP the hook is registered on,
    whatever the state says; the state where no DDP holds the hook) must span
    this rank's reduction group of the plan, else the first bucket raises
    SynthError, never silently different replicas; given ``process_group``
    here too, that group is checked at once, collectively. The hook does not stall backward: on CPU tensors (gloo)
    the program runs in one thread per process shared by every hook, bucket
    after bucket, and the hook returns a future that completes with the
    bucket after the last step; on
    CUDA tensors (NCCL) the steps are enqueued on the GPU's streams and the CPU
    goes on at once. Building it is collective; so is every bucket (as with any
    DDP hook).

    ``sparse=True``: a bucket holding a sparse gradient (DDP gives each
    parameter with a sparse gradient, such as ``nn.Embedding(sparse=True)``, a
    bucket of its own) runs the sparse form of the plan's program for that
    gradient's dense size (:mod:`synth.synthesis.sparse`: the rows are hashed
    over the program's chunks, each step moves and sums only the rows present;
    docs/sparse.md), averaged like the dense buckets; the hook returns the
    coalesced sparse sum. Its communicators are built here, so building the
    hook stays the only collective set-up. Without it such a bucket is a
    SynthError naming this option."""
    _agree_on_hook(plan, reduce, process_group, sparse)
    executor = Executor(plan, reduce, Goal.ALLREDUCE)
    lowered = executor.programs[0].lowered
    group_size = lowered.num_chunks
    w = executor.world
    mine = w.torch_ranks(next(tuple(g) for g in lowered.reduction_groups if w.rank in g))
    if process_group is not None:
        w.agree(_group_problem(process_group, mine))
    checked: set[int] = set()
    threaded = _queue_of(w) if w.device.type == "cpu" else None
    sparse_runs = _sparse_executors(executor) if sparse else None
    sized_runs: dict[tuple[int, int], Any] = {}

    def run_sparse(tensor: torch.Tensor) -> torch.Tensor:
        assert sparse_runs is not None
        grad = tensor.coalesce()
        dense_bytes = grad.numel() * grad.element_size()
        key = (id(executor.program_for(dense_bytes)), grad.shape[0])
        run = sized_runs.get(key)
        if run is None:  # the partition tables of this many rows, built once per (program, rows)
            run = sized_runs[key] = sparse_runs[key[0]].for_positions(grad.shape[0])
        rows = grad.indices()[0].cpu().numpy()
        values = (grad.values() / group_size).cpu().numpy()
        out_rows, out_values = run.run(rows, values)
        indices = torch.from_numpy(np.asarray(out_rows, dtype=np.int64)).unsqueeze(0)
        return torch.sparse_coo_tensor(indices, torch.from_numpy(np.ascontiguousarray(out_values)), grad.shape,
                                       device=tensor.device).coalesce()

    def run(tensor: torch.Tensor) -> None:
        executor(tensor, check=False)  # DDP gives every rank of a group the same buckets

    def hook(state, bucket):  # no annotations: DDP checks them against dist.GradBucket and Future[Tensor]
        if id(state) not in checked:
            ddp = _ddp_holding(hook)
            problem = _group_problem(state if ddp is None else ddp.process_group, mine)
            if problem is not None:
                raise SynthError(problem)
            checked.add(id(state))
        tensor = bucket.buffer()
        if tensor.is_sparse:
            if sparse_runs is None:
                raise SynthError("a DDP bucket holds a sparse gradient (nn.Embedding(sparse=True) or the like): "
                                 "build the hook with comm_hook(plan, sparse=True) to run the plan's program in "
                                 "sparse form (docs/sparse.md)")
            future = torch.futures.Future()
            future.set_result(run_sparse(tensor))
            return future
        problem = w.buffer_problem(tensor)
        if problem is not None:
            raise SynthError(problem)
        tensor.div_(group_size)
        if threaded is not None:
            return threaded.submit(run, tensor)
        run(tensor)
        future = torch.futures.Future()
        future.set_result(tensor)
        return future

    return hook
