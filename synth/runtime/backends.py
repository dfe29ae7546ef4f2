"""Backends of the runtime: worlds and their communicators (see synth.runtime.executor).

* ``numpy``: every rank is a thread of one process (:func:`run_local`), numpy
  buffers, collectives computed in member order; the in-process reference of the
  executor, used by the tests.
* ``mpi``: one process per rank under ``mpiexec``, mpi4py on numpy buffers.
* ``nccl``: one process per rank and GPU under ``mpiexec``, CuPy buffers and
  ``cupy.cuda.nccl`` communicators, bootstrapped over MPI (the unique id of each
  group travels on an MPI sub-communicator). Untested on a GPU so far
  (``scripts/gpu_check.sh`` runs the checks that need one).
* ``torch``: one process per rank under ``torchrun``, torch.distributed process
  groups (NCCL on GPUs, gloo on CPUs): :class:`synth.runtime.torch_world.TorchWorld`.

mpi4py, CuPy and torch are imported only when their backend is chosen; a
missing one is a SynthError that says what to install.
"""

from __future__ import annotations

import threading
import time
from functools import partial, reduce
from operator import add
from typing import Any, Callable, Sequence

import numpy as np

from ..cost.nccl_log import version_text
from ..errors import SynthError
from .executor import GPU_DTYPES, HOST_DTYPES, Group, World

BACKENDS = ("mpi", "nccl", "torch")  # mpi and nccl under mpiexec, torch under torchrun


def make_world(name: str) -> World:
    """The world of this process for a backend launched under mpiexec (mpi,
    nccl) or torchrun (torch)."""
    if name == "mpi":
        return MPIWorld()
    if name == "nccl":
        return NCCLWorld()
    if name == "torch":
        try:
            from .torch_world import init_process_group
        except ImportError as exc:
            raise SynthError(f"the torch backend needs PyTorch ({exc}); install it with "
                             "pip install '.[torch]' torch==2.13.0 (in a checkout)") from None
        return init_process_group()
    raise SynthError(f"unknown backend '{name}'; use one of {', '.join(BACKENDS)}")


# ---------------------------------------------------------------- numpy (threads)


class _Rendezvous:
    """Members of one group (or the world) exchange arrays through slots."""

    def __init__(self, size: int, timeout_s: float) -> None:
        self.slots: list[Any] = [None] * size
        self.barrier = threading.Barrier(size, timeout=timeout_s)

    def exchange(self, member: int, value: Any) -> list[Any]:
        """Post ``value``, wait for all members, return every member's value. The
        caller must call ``done()`` before changing what it posted."""
        self.slots[member] = value
        self.barrier.wait()
        return list(self.slots)

    def done(self) -> None:
        self.barrier.wait()


class _LocalComm:
    def __init__(self, rendezvous: _Rendezvous, member: int) -> None:
        self.r = rendezvous
        self.rank = member

    def _collect(self, a: np.ndarray, result: Callable[[list[np.ndarray]], Any]) -> Any:
        value = result(self.r.exchange(self.rank, a))
        self.r.done()
        return value

    def allreduce(self, a: np.ndarray) -> None:
        a[...] = self._collect(a, lambda xs: reduce(add, xs))

    def reduce_scatter(self, a: np.ndarray, out: np.ndarray) -> None:
        n = out.shape[0]
        part = slice(self.rank * n, (self.rank + 1) * n)
        out[...] = self._collect(a, lambda xs: reduce(add, (x[part] for x in xs)))

    def allgather(self, a: np.ndarray) -> None:
        n = a.shape[0] // len(self.r.slots)
        a[...] = self._collect(a, lambda xs: np.concatenate([x[i * n : (i + 1) * n] for i, x in enumerate(xs)]))

    def reduce(self, a: np.ndarray) -> None:
        total = self._collect(a, lambda xs: reduce(add, xs) if self.rank == 0 else None)
        if self.rank == 0:
            a[...] = total

    def bcast(self, a: np.ndarray) -> None:
        a[...] = self._collect(a, lambda xs: xs[0].copy())

    def alltoall(self, send: np.ndarray, recv: np.ndarray) -> None:
        """Equal parts: part ``j`` of ``send`` to member ``j``; part ``i`` of ``recv`` from member ``i``."""
        n = recv.shape[0] // len(self.r.slots)
        me = slice(self.rank * n, (self.rank + 1) * n)
        recv[...] = self._collect(send, lambda xs: np.concatenate([x[me] for x in xs]))


class _LocalShared:
    def __init__(self, size: int, timeout_s: float) -> None:
        self.size = size
        self.timeout_s = timeout_s
        self.world = _Rendezvous(size, timeout_s)
        self.groups: dict[Group, _Rendezvous] = {}
        self.lock = threading.Lock()

    def group(self, group: Group) -> _Rendezvous:
        with self.lock:
            if group not in self.groups:
                self.groups[group] = _Rendezvous(len(group), self.timeout_s)
            return self.groups[group]

    def abort(self) -> None:
        with self.lock:
            for r in [self.world, *self.groups.values()]:
                r.barrier.abort()


class LocalWorld(World):
    """Rank ``rank`` of ``size`` threads of this process (see :func:`run_local`)."""

    name = "numpy"
    xp = np
    dtypes = HOST_DTYPES | {"float16"}

    def __init__(self, shared: _LocalShared, rank: int) -> None:
        super().__init__()
        self.shared = shared
        self.rank = rank
        self.size = shared.size

    def allgather(self, obj: Any) -> list[Any]:
        values = self.shared.world.exchange(self.rank, obj)
        self.shared.world.done()
        return values

    def split(self, groups: Sequence[Group]) -> _LocalComm | None:
        mine = [g for g in groups if self.rank in g]
        return _LocalComm(self.shared.group(mine[0]), mine[0].index(self.rank)) if mine else None

    def barrier(self) -> None:
        self.shared.world.done()

    def wtime(self) -> float:
        return time.perf_counter()


def run_local(size: int, fn: Callable[[LocalWorld], Any], timeout_s: float = 60.0) -> list[Any]:
    """Run ``fn(world)`` on ``size`` thread ranks; return the results in rank
    order. An exception on any rank breaks every rendezvous (no hang) and the
    first one, by rank, is raised."""
    shared = _LocalShared(size, timeout_s)
    results: list[Any] = [None] * size
    errors: list[BaseException | None] = [None] * size

    def body(rank: int) -> None:
        try:
            results[rank] = fn(LocalWorld(shared, rank))
        except BaseException as exc:  # re-raised below, in the caller's thread
            errors[rank] = exc
            shared.abort()

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    raised = [e for e in errors if e is not None]
    if raised:
        raise next((e for e in raised if not isinstance(e, threading.BrokenBarrierError)), raised[0])
    return results


# ---------------------------------------------------------------- MPI


def _import_mpi() -> Any:
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise SynthError(
            f"the mpi backend needs mpi4py and an MPI library ({exc}); "
            "install them with pip install '.[mpi]' (in a checkout)"
        ) from None
    return MPI


class _MPIComm:
    """The five collectives on an MPI communicator, as C-level partials (the
    executor's hot path has no Python frame of its own here)."""

    def __init__(self, comm: Any, MPI: Any) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.allreduce = partial(comm.Allreduce, MPI.IN_PLACE, op=MPI.SUM)
        self.reduce_scatter = partial(comm.Reduce_scatter_block, op=MPI.SUM)  # (a, out)
        self.allgather = partial(comm.Allgather, MPI.IN_PLACE)
        if self.rank == 0:
            self.reduce = partial(comm.Reduce, MPI.IN_PLACE, op=MPI.SUM, root=0)
        else:
            self.reduce = lambda a: comm.Reduce(a, None, op=MPI.SUM, root=0)
        self.bcast = partial(comm.Bcast, root=0)
        self.alltoall = comm.Alltoall  # (send, recv): equal parts in member order


class MPIWorld(World):
    """This process's rank of an MPI communicator (default ``COMM_WORLD``)."""

    name = "mpi"
    xp = np
    dtypes = HOST_DTYPES

    def __init__(self, comm: Any = None) -> None:
        super().__init__()
        self.MPI = _import_mpi()
        self.comm = self.MPI.COMM_WORLD if comm is None else comm
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()

    def allgather(self, obj: Any) -> list[Any]:
        return self.comm.allgather(obj)

    def mpi_split(self, groups: Sequence[Group]) -> Any:
        """The MPI communicator of this rank's group (member order = group order)."""
        color, key = self.MPI.UNDEFINED, 0
        for index, group in enumerate(groups):
            if self.rank in group:
                color, key = index, group.index(self.rank)
        comm = self.comm.Split(color, key)
        return None if comm == self.MPI.COMM_NULL else comm

    def split(self, groups: Sequence[Group]) -> _MPIComm | None:
        comm = self.mpi_split(groups)
        return None if comm is None else _MPIComm(comm, self.MPI)

    def barrier(self) -> None:
        self.comm.Barrier()

    def wtime(self) -> float:
        return self.MPI.Wtime()

    def abort(self, code: int = 1) -> None:
        """Kill every rank (after an unexpected error on one; never hang)."""
        self.comm.Abort(code)


# ---------------------------------------------------------------- NCCL


def import_cupy_nccl() -> tuple[Any, Any]:
    """cupy and cupy.cuda.nccl, or a SynthError naming what is missing."""
    try:
        import cupy
    except ImportError as exc:
        raise SynthError(
            f"the nccl backend needs CuPy ({exc}); install the wheel for your CUDA, "
            "e.g. pip install cupy-cuda12x, or use --backend mpi"
        ) from None
    try:
        from cupy.cuda import nccl
    except ImportError as exc:
        raise SynthError(f"the nccl backend needs CuPy built with NCCL ({exc}); or use --backend mpi") from None
    if not getattr(nccl, "available", True):
        raise SynthError("the nccl backend needs NCCL, which this CuPy cannot load; or use --backend mpi")
    return cupy, nccl


class _NCCLComm:
    def __init__(self, comm: Any, member: int, size: int, cupy: Any, nccl: Any) -> None:
        self.comm = comm
        self.rank = member
        self.size = size
        self.cupy = cupy
        self.nccl = nccl

    def _args(self, a: Any) -> tuple[int, int, int]:
        name = "NCCL_" + a.dtype.name.upper()
        if not hasattr(self.nccl, name):
            raise SynthError(f"this CuPy's NCCL bindings have no {name}; use another dtype")
        return a.data.ptr, getattr(self.nccl, name), self.cupy.cuda.get_current_stream().ptr

    def allreduce(self, a: Any) -> None:
        ptr, dtype, stream = self._args(a)
        self.comm.allReduce(ptr, ptr, a.size, dtype, self.nccl.NCCL_SUM, stream)

    def reduce_scatter(self, a: Any, out: Any) -> None:
        ptr, dtype, stream = self._args(a)
        self.comm.reduceScatter(ptr, out.data.ptr, out.size, dtype, self.nccl.NCCL_SUM, stream)

    def allgather(self, a: Any) -> None:  # in place: send = recv + rank * count
        ptr, dtype, stream = self._args(a)
        count = a.size // self.size
        self.comm.allGather(ptr + self.rank * count * a.itemsize, ptr, count, dtype, stream)

    def reduce(self, a: Any) -> None:
        ptr, dtype, stream = self._args(a)
        self.comm.reduce(ptr, ptr, a.size, dtype, self.nccl.NCCL_SUM, 0, stream)

    def bcast(self, a: Any) -> None:
        ptr, dtype, stream = self._args(a)
        self.comm.bcast(ptr, a.size, dtype, 0, stream)


class NCCLWorld(World):
    """This process's rank with a GPU (local rank modulo the visible GPUs), NCCL
    sub-communicators bootstrapped over MPI ``COMM_WORLD``."""

    name = "nccl"
    dtypes = GPU_DTYPES

    def __init__(self, comm: Any = None) -> None:
        super().__init__()
        self.mpi = MPIWorld(comm)
        self.rank, self.size = self.mpi.rank, self.mpi.size
        problem = None
        try:
            self.xp, self.nccl = import_cupy_nccl()
            devices = self.xp.cuda.runtime.getDeviceCount()
            if devices < 1:
                raise SynthError("the nccl backend needs a CUDA GPU and this machine shows none")
            local_rank = self.mpi.comm.Split_type(self.mpi.MPI.COMM_TYPE_SHARED).Get_rank()
            self.xp.cuda.Device(local_rank % devices).use()
        except SynthError as exc:
            problem = str(exc)
        except Exception as exc:  # CUDA runtime errors: no driver, no device
            problem = f"the nccl backend needs a working CUDA GPU ({type(exc).__name__}: {exc})"
        self.mpi.agree(problem)

    @property
    def nccl_version(self) -> str:
        """The version of the NCCL that CuPy loaded."""
        return version_text(self.nccl.get_version())

    def allgather(self, obj: Any) -> list[Any]:
        return self.mpi.allgather(obj)

    def split(self, groups: Sequence[Group]) -> _NCCLComm | None:
        comm = self.mpi.mpi_split(groups)
        if comm is None:
            return None
        uid = comm.bcast(self.nccl.get_unique_id() if comm.Get_rank() == 0 else None, root=0)
        member, size = comm.Get_rank(), comm.Get_size()
        return _NCCLComm(self.nccl.NcclCommunicator(size, uid, member), member, size, self.xp, self.nccl)

    def barrier(self) -> None:
        self.mpi.barrier()

    def synchronize(self) -> None:
        self.xp.cuda.get_current_stream().synchronize()

    def wtime(self) -> float:
        return self.mpi.wtime()

    def abort(self, code: int = 1) -> None:
        self.mpi.abort(code)
