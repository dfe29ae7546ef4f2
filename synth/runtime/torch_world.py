"""The torch backend's world: this rank of torch.distributed's default process
group, with one process group per distinct group of a plan (NCCL on CUDA
tensors, gloo on CPU tensors).

Imported only when the torch backend is chosen (``make_world("torch")``) or by
the adapter :mod:`synth.torch`; it imports torch at once. :func:`world` is the
world of the current default process group, made once and shared by every
executor; :func:`init_process_group` initializes torch.distributed from
torchrun's environment.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist

from ..errors import SynthError
from .executor import GPU_DTYPES, Group, World

# torch 2.13 renamed the single-tensor collectives; older versions have the old names only
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class _Tensors:
    """What :mod:`synth.runtime.executor` and :mod:`synth.runtime.bench` use of an array module,
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
    """The five collectives of :mod:`synth.runtime.executor` on one process group whose
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

    def alltoall(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        """Equal parts: part ``j`` of ``send`` to member ``j``; part ``i`` of ``recv`` from member ``i``."""
        dist.all_to_all_single(recv, send, group=self.pg)


class TorchSparseComm:
    """The byte-message collectives of the sparse executor
    (:mod:`synth.runtime.sparse`) on one process group: uint8 numpy messages in
    and out, moved as uint8 tensors on the world's device. Variable lengths are
    exchanged first: ``all_to_all_single`` with split sizes for alltoallv;
    all_gather, gather and broadcast of messages padded to the longest."""

    def __init__(self, comm: _TorchComm, device: torch.device) -> None:
        self.pg, self.group, self.member = comm.pg, comm.group, comm.member
        self.size, self.device = len(comm.group), device

    def _tensor(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.uint8)).to(self.device)

    @staticmethod
    def _array(t: torch.Tensor) -> np.ndarray:
        return t.cpu().numpy()

    def _lengths(self, n: int) -> list[int]:
        lengths = [torch.zeros(1, dtype=torch.int64, device=self.device) for _ in range(self.size)]
        dist.all_gather(lengths, torch.tensor([n], dtype=torch.int64, device=self.device), group=self.pg)
        return [int(t.item()) for t in lengths]

    def _padded(self, message: np.ndarray, longest: int) -> torch.Tensor:
        padded = np.zeros(longest, dtype=np.uint8)
        padded[:len(message)] = message
        return self._tensor(padded)

    def alltoallv(self, messages: list[np.ndarray]) -> list[np.ndarray]:
        send_counts = [len(m) for m in messages]
        counts = torch.tensor(send_counts, dtype=torch.int64, device=self.device)
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts, group=self.pg)
        recv_counts = [int(x) for x in received.tolist()]
        send = self._tensor(np.concatenate(messages) if messages else np.zeros(0, np.uint8))
        recv = torch.empty(sum(recv_counts), dtype=torch.uint8, device=self.device)
        dist.all_to_all_single(recv, send, output_split_sizes=recv_counts, input_split_sizes=send_counts,
                               group=self.pg)
        return np.split(self._array(recv), np.cumsum(recv_counts)[:-1])

    def allgatherv(self, message: np.ndarray) -> list[np.ndarray]:
        lengths = self._lengths(len(message))
        longest = max(lengths)
        if longest == 0:
            return [np.zeros(0, np.uint8) for _ in lengths]
        out = [torch.empty(longest, dtype=torch.uint8, device=self.device) for _ in lengths]
        dist.all_gather(out, self._padded(message, longest), group=self.pg)
        return [self._array(t)[:n] for t, n in zip(out, lengths)]

    def gatherv(self, message: np.ndarray) -> list[np.ndarray] | None:
        lengths = self._lengths(len(message))
        longest = max(lengths)
        if longest == 0:
            return [np.zeros(0, np.uint8) for _ in lengths] if self.member == 0 else None
        out = ([torch.empty(longest, dtype=torch.uint8, device=self.device) for _ in lengths]
               if self.member == 0 else None)
        dist.gather(self._padded(message, longest), out, dst=self.group[0], group=self.pg)
        return [self._array(t)[:n] for t, n in zip(out, lengths)] if out is not None else None

    def bcast(self, message: np.ndarray | None) -> np.ndarray:
        n = torch.tensor([0 if message is None else len(message)], dtype=torch.int64, device=self.device)
        dist.broadcast(n, src=self.group[0], group=self.pg)
        if int(n.item()) == 0:
            return np.zeros(0, np.uint8)
        buffer = (self._tensor(message) if self.member == 0
                  else torch.empty(int(n.item()), dtype=torch.uint8, device=self.device))
        dist.broadcast(buffer, src=self.group[0], group=self.pg)
        return self._array(buffer)


def _new_group(ranks: Group) -> Any:
    """A process group whose rank ``i`` is ``ranks[i]`` (``new_group`` sorts
    ranks unless told not to; plans list groups in ascending order anyway)."""
    if list(ranks) == sorted(ranks):
        return dist.new_group(list(ranks))
    return dist.new_group(list(ranks), sort_ranks=False)


def _devices_of_ranks(torch_rank: int, size: int) -> tuple[int, ...]:
    """``device_of_rank``: every rank's ``SYNTH_DEVICE`` (its torch rank where
    unset), gathered; the same SynthError on every rank unless they are a
    permutation of the devices (collective)."""
    text = os.environ.get("SYNTH_DEVICE")
    mine = int(text) if text is not None and text.strip().isdigit() else (torch_rank if text is None else -1)
    out: list[Any] = [None] * size
    dist.all_gather_object(out, mine)
    if sorted(out) != list(range(size)):
        raise SynthError(f"the ranks' SYNTH_DEVICE values {out} are not the devices 0..{size - 1} once each: start "
                         "every rank through synth-reduce launch (or synth.torch.launch_rank) with one plan, or none")
    return tuple(int(d) for d in out)


class TorchWorld(World):
    """This process's rank of torch.distributed's default process group. Its
    collectives run on CUDA tensors of the current device when the group has
    NCCL and CUDA is available, else on CPU tensors (gloo).

    Ranks are the plan's device ids: under a renumbered launch (``synth-reduce
    launch`` or :func:`synth.torch.launch_rank`, which set ``SYNTH_DEVICE``)
    torch rank ``r`` runs device ``device_of_rank[r]``, and this world
    translates: :attr:`rank` is this process's device, groups are given and
    :meth:`allgather` answers in device ids, and the process groups it makes
    hold the devices' torch ranks (:attr:`rank_of_device`). Without a
    renumbering the two numberings are one. Making it is collective (the
    ranks exchange their devices)."""

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
        self.torch_rank, self.size = dist.get_rank(), dist.get_world_size()
        self.device_of_rank = _devices_of_ranks(self.torch_rank, self.size)
        self.rank_of_device = tuple(int(r) for r in np.argsort(self.device_of_rank))
        self.rank = self.device_of_rank[self.torch_rank]
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
        """Every rank's object, indexed by device id."""
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj)
        return [out[r] for r in self.rank_of_device]

    def torch_ranks(self, devices: Sequence[int]) -> tuple[int, ...]:
        """The torch ranks running ``devices``."""
        return tuple(self.rank_of_device[d] for d in devices)

    def split(self, groups: Sequence[Group]) -> _TorchComm | None:
        """One process group per group of device ids (member ``i`` = the
        group's ``i``-th device), created in the same order on every rank."""
        mine = None
        for group in groups:  # every rank creates every group, in the same order
            ranks = self.torch_ranks(group)
            pg = _new_group(ranks)
            if self.rank in group:
                mine = _TorchComm(ranks, pg, group.index(self.rank))
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
