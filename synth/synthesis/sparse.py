"""Sparse all-reduce: a goal whose programs are the proved dense all-reduce
programs of the same reduction, each step lowered to its sparse form.

Goal. Each device holds a sparse tensor over ``n`` positions: (index, value)
pairs, indices unique, density ``D`` (``D n`` entries). The result on every
device of a reduction group is the dense sum's non-zeros over the group: every
index where the sum is non-zero, with that sum, and no other index.

Lowering. A hash partition (:class:`~synth.synthesis.hashing.HashPartition`)
plays the part of a chunk: partition ``j`` of the index space <-> chunk ``j``
of the dense buffer. Every dense step becomes the sparse step that does to
partitions what it does to chunks (:data:`SPARSE_NAMES`):

* ReduceScatter -> ``PartitionSum``: each member sends the entries of the
  partitions of part ``t`` to member ``t`` (an alltoallv of encoded
  partitions), which sums them with its own;
* AllGather -> ``GatherPartitions``: the members' reduced partitions are
  all-gathered (an allgatherv), each sent sparse or dense, whichever is fewer
  bytes;
* AllReduce -> ``GatherSum``: the members' whole sets (of the step's
  partitions) are all-gathered and summed locally;
* Reduce -> ``GatherSumRoot``: the same, gathered and summed at the root only;
* Broadcast -> ``BroadcastSet``: the root's partitions go to every member.

Why it is correct. The dense semantics reads and writes chunk ``c`` only from
chunk ``c``; the sparse rules read and write partition ``c`` only from partition
``c``, and sum where the dense rules sum (a merge of sparse tensors is the sum
of the dense vectors they stand for, with zeros dropped). So a dense program
proved (numpy + z3) to give every device the sum of every chunk gives every
device the sum of every partition, provided the partition of an index is a
function of the index alone, identical on every rank (the invariant stated in
:mod:`synth.synthesis.hashing`). :func:`check_sparse` checks that claim exactly,
per program, on integer data with uniform and Zipf-skewed indices against the
numpy dense sum; z3 applies to the dense program (its proof is what the
lowering inherits), not to the hash.

The goal is not a member of :class:`~synth.synthesis.semantics.Goal`: its
state (which contributors each partition holds) is the dense all-reduce's
state, so the search runs once for ``Goal.ALLREDUCE`` and this module lowers
its programs; the dense goals' outputs are unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import SynthError
from .hashing import Encoding, HashPartition, decode, encode
from .language import Collective, Program, read_program
from .lowering import LoweredProgram, check_structure
from .semantics import Goal

#: the goal's name on the command line and in workloads
SPARSE_ALLREDUCE = "sparse-allreduce"

#: the sparse step each dense collective lowers to (module docstring)
SPARSE_NAMES = {
    Collective.REDUCESCATTER: "PartitionSum",
    Collective.ALLGATHER: "GatherPartitions",
    Collective.ALLREDUCE: "GatherSum",
    Collective.REDUCE: "GatherSumRoot",
    Collective.BROADCAST: "BroadcastSet",
}
_DENSE_NAMES = {v: k.value for k, v in SPARSE_NAMES.items()}


def check_density(density: float) -> float:
    """``density`` if it is in (0, 1], else a SynthError naming ``--density``."""
    if not (isinstance(density, (int, float)) and 0 < density <= 1):
        raise SynthError(f"--density {density}: give the fraction of non-zeros per rank in (0, 1], e.g. 0.01")
    return float(density)


@dataclass(frozen=True)
class Skew:
    """How indices are drawn: ``uniform``, or ``zipf:S`` (probability of the
    ``r``-th most popular index ~ ``1 / r^S``; the popular ones are the low
    indices, shared by every rank, as for an embedding's frequent tokens)."""

    kind: str = "uniform"
    exponent: float = 0.0

    @classmethod
    def parse(cls, text: str | None) -> "Skew":
        if text is None or text == "uniform":
            return cls()
        m = re.fullmatch(r"zipf:([0-9]*\.?[0-9]+)", text)
        if m is None or float(m.group(1)) <= 0:
            raise SynthError(f"--skew {text}: use uniform or zipf:S with S > 0, e.g. zipf:1.1")
        return cls("zipf", float(m.group(1)))

    def __str__(self) -> str:
        return "uniform" if self.kind == "uniform" else f"zipf:{self.exponent:g}"


def sparse_indices(n: int, density: float, skew: Skew, rng: np.random.Generator) -> np.ndarray:
    """``round(D n)`` (at least 1) distinct indices in ``[0, n)``, increasing,
    drawn without replacement with the weights of ``skew`` (Efraimidis-Spirakis:
    the smallest ``E / w`` of exponential ``E``)."""
    count = min(n, max(1, round(check_density(density) * n)))
    if skew.kind == "uniform":
        return np.sort(rng.choice(n, count, replace=False))
    log_w = -skew.exponent * np.log1p(np.arange(n, dtype=np.float64))
    keys = np.log(rng.exponential(size=n)) - log_w
    return np.sort(np.argpartition(keys, count - 1)[:count]) if count < n else np.arange(n)


def sparse_values(count: int, rng: np.random.Generator, dtype: str | np.dtype = "int64") -> np.ndarray:
    """``count`` non-zero integers in [-100, 100] (exact in any dtype the runtime takes)."""
    v = rng.integers(1, 101, size=count) * rng.choice((-1, 1), size=count)
    return v.astype(dtype)


def sparse_inputs(devices: int, n: int, density: float, skew: Skew, seed: int = 0,
                  dtype: str | np.dtype = "int64") -> list[tuple[np.ndarray, np.ndarray]]:
    """Per device (indices increasing, non-zero values), device ``d`` seeded by ``(seed, d)``."""
    out = []
    for d in range(devices):
        rng = np.random.default_rng((seed, d))
        idx = sparse_indices(n, density, skew, rng)
        out.append((idx, sparse_values(len(idx), rng, dtype)))
    return out


def dense_sum(inputs: Sequence[tuple[np.ndarray, np.ndarray]], n: int) -> tuple[np.ndarray, np.ndarray]:
    """The reference: the dense sum of the inputs (int64), as (non-zero indices, sums)."""
    total = np.zeros(n, dtype=np.int64)
    for idx, val in inputs:
        total[idx] += val.astype(np.int64)
    nz = np.flatnonzero(total)
    return nz, total[nz]


# ---------------------------------------------------------------- the sparse form of a program


def format_sparse(program: Program, sep: str = "\n") -> str:
    """``PartitionSum(gpu, inside)`` ...: the dense text with each collective
    replaced by its sparse step's name."""
    return sep.join(SPARSE_NAMES[i.collective] + str(i)[len(i.collective.value):] for i in program.instructions)


def parse_sparse(text: str, source: str = "<sparse program>") -> Program:
    """The dense program of a sparse text (:func:`format_sparse`'s inverse);
    dense collective names are accepted too."""
    names = "|".join(_DENSE_NAMES)

    def dense(m: re.Match) -> str:
        return _DENSE_NAMES[m.group(0)]

    return read_program(re.sub(rf"\b({names})\b", dense, text.strip()), source)


# ---------------------------------------------------------------- the reference executor


Entries = tuple[np.ndarray, np.ndarray]  # (slots increasing, values) of one partition


def _merge(parts: Sequence[Entries]) -> Entries:
    """The sum of sparse partitions, zeros dropped (the reference's own merge:
    np.unique and np.add.at, not the runtime's merge_runs)."""
    slots = np.concatenate([p[0] for p in parts])
    values = np.concatenate([p[1] for p in parts]).astype(np.int64)
    uniq, inverse = np.unique(slots, return_inverse=True)
    sums = np.zeros(len(uniq), dtype=np.int64)
    np.add.at(sums, inverse, values)
    keep = sums != 0
    return uniq[keep], sums[keep]


def _wire(entries: Entries, size: int, encoding: Encoding | None) -> Entries:
    """``entries`` after a trip through the encoder (what a receiver decodes)."""
    if encoding is None:
        return entries
    fmt, blob = encode(entries[0], entries[1].astype(np.int64), size, encoding)
    return decode(fmt, len(entries[0]), blob, size, np.int64)


def execute_sparse(lowered: LoweredProgram, partition: HashPartition,
                   inputs: Sequence[tuple[np.ndarray, np.ndarray]],
                   encoding: Encoding | None = Encoding.AUTO) -> list[tuple[np.ndarray, np.ndarray]]:
    """Run the sparse form of an all-reduce program on every device at once:
    ``inputs[d]`` = device ``d``'s (indices, integer values); returns per
    device (indices increasing, values). Like the dense reference
    (:mod:`synth.synthesis.execute`) every device keeps a slot per partition,
    a step reads and overwrites only the partitions its groups cover (part ``i``
    of a group's ordered list belongs to member ``i``), and stale partitions
    stay. Every transfer goes through :func:`~synth.synthesis.hashing.encode`
    with ``encoding`` (None: no encoding)."""
    if lowered.goal is not Goal.ALLREDUCE:
        raise SynthError(f"sparse-allreduce lowers all-reduce programs, not {lowered.goal.value}")
    if partition.k != lowered.num_chunks:
        raise SynthError(f"the partition has {partition.k} partitions, the program {lowered.num_chunks} chunks")
    sizes = partition.partition_sizes
    state = [partition.split(idx, val.astype(np.int64)) for idx, val in inputs]
    for step in lowered.steps:
        c = step.collective
        for members, chunks in zip(step.groups, step.chunks):
            m = len(members)
            if not chunks:
                continue
            part = max(len(chunks) // m, 1)
            owner = [position // part for position in range(len(chunks))]
            new: dict[tuple[int, int], Entries] = {}
            for position, j in enumerate(chunks):
                sent = [_wire(state[d][j], sizes[j], encoding) for d in members]
                if c is Collective.BROADCAST:
                    for d in members:
                        new[d, j] = sent[0]
                elif c is Collective.ALLGATHER:
                    for d in members:
                        new[d, j] = sent[owner[position]]
                else:
                    total = _merge(sent)
                    if c is Collective.ALLREDUCE:
                        targets = members
                    elif c is Collective.REDUCE:
                        targets = members[:1]
                    else:  # ReduceScatter: the member whose part holds the partition
                        targets = (members[owner[position]],)
                    for d in targets:
                        new[d, j] = total
            for (d, j), entries in new.items():
                state[d][j] = entries
    return [partition.join(parts) for parts in state]


def check_sparse(lowered: LoweredProgram, n: int, density: float, skew: Skew, seed: int = 0,
                 encoding: Encoding | None = Encoding.AUTO, partition_seed: int = 0,
                 sizes: Sequence[int] | None = None) -> int:
    """Run :func:`execute_sparse` on integer data (``skew`` indices at
    ``density`` over ``n`` positions) and compare every device's result with the
    dense sum over its reduction group; returns the entries checked, raises a
    SynthError naming the first device that differs. ``sizes``: the hierarchy
    the partitions are hashed over (default: one level of ``k``)."""
    check_structure(lowered)
    partition = HashPartition(n, tuple(sizes) if sizes is not None else (lowered.num_chunks,), partition_seed)
    inputs = sparse_inputs(lowered.num_devices, n, density, skew, seed)
    results = execute_sparse(lowered, partition, inputs, encoding)
    checked = 0
    for group in lowered.reduction_groups:
        want_idx, want_val = dense_sum([inputs[d] for d in group], n)
        for d in group:
            idx, val = results[d]
            if not (np.array_equal(idx, want_idx) and np.array_equal(val, want_val)):
                raise SynthError(
                    f"sparse reference: device {d} holds {len(idx)} entries, the dense sum has {len(want_idx)} "
                    f"non-zeros ({'values differ' if np.array_equal(idx, want_idx) else 'indices differ'}) for "
                    f"{format_sparse(lowered.program, ' ; ')}")
            checked += len(idx)
    return checked

