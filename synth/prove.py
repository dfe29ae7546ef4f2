"""z3 proof that a lowered program meets its goal for every input.

Independent of the search's semantics: each device's buffer is a vector of ``k``
symbolic chunk values (z3 integer terms) that collectives overwrite in place,
the model of :mod:`synth.execute` written again symbolically. Initial values are
free variables: the device's own data, or, for chunks an AllGather device does
not own, garbage. The claim "every output the goal names equals the sum of its
reduction group's inputs (or the owner's shard)" is negated and handed to z3;
``unsat`` is a proof for all integer inputs. A ``sat`` model is a counterexample.
"""

from __future__ import annotations

from dataclasses import dataclass

import z3

from .language import Collective
from .lowering import LoweredProgram
from .semantics import Goal

#: above this many (device, chunk) values, prove on the first reduction group only
WHOLE_SYSTEM_LIMIT = 1 << 14


@dataclass(frozen=True)
class Proof:
    proved: bool
    scope: str  # "whole system" or "reduction group 0 of N"
    obligations: int
    counterexample: str = ""


def prove(lowered: LoweredProgram) -> Proof:
    k = lowered.num_chunks
    rows = lowered.reduction_groups
    if lowered.num_devices * k > WHOLE_SYSTEM_LIMIT and len(rows) > 1:
        rows, scope = rows[:1], f"reduction group 0 of {len(lowered.reduction_groups)}"
    else:
        scope = "whole system"
    devices = {d for row in rows for d in row}
    value: dict[tuple[int, int], z3.ArithRef] = {}
    for row in rows:
        for rank, d in enumerate(row):
            for c in range(k):
                if lowered.goal is Goal.ALLGATHER and c != lowered.chunk_of_rank[rank]:
                    value[d, c] = z3.Int(f"garbage_{d}_{c}")
                else:
                    value[d, c] = z3.Int(f"in_{d}_{c}")
    initial = dict(value)
    for step in lowered.steps:
        for group, chunks in zip(step.groups, step.chunks):
            if group[0] not in devices:
                continue
            size = len(chunks) // len(group)
            kind = step.collective
            if kind is Collective.ALLGATHER:
                updates = {
                    (m, c): value[owner, c]
                    for i, owner in enumerate(group)
                    for c in chunks[i * size : (i + 1) * size]
                    for m in group
                }
            elif kind is Collective.BROADCAST:
                updates = {(m, c): value[group[0], c] for c in chunks for m in group[1:]}
            else:
                sums = {c: z3.Sum([value[m, c] for m in group]) for c in chunks}
                if kind is Collective.ALLREDUCE:
                    updates = {(m, c): sums[c] for c in chunks for m in group}
                elif kind is Collective.REDUCE:
                    updates = {(group[0], c): sums[c] for c in chunks}
                else:  # ReduceScatter: member i keeps part i
                    updates = {
                        (m, c): sums[c] for i, m in enumerate(group) for c in chunks[i * size : (i + 1) * size]
                    }
            value.update(updates)
    claims = []
    for row in rows:
        for rank, d in enumerate(row):
            for r in range(k):
                c = lowered.chunk_of_rank[r]
                if lowered.goal is Goal.ALLGATHER:
                    want = initial[row[r], c]
                elif lowered.goal is Goal.REDUCESCATTER and r != rank:
                    continue
                else:
                    want = z3.Sum([initial[e, c] for e in row])
                claims.append((d, r, value[d, c], want))
    solver = z3.Solver()
    solver.add(z3.Or([got != want for _, _, got, want in claims]))
    if solver.check() == z3.unsat:
        return Proof(True, scope, len(claims))
    model = solver.model()
    for d, r, got, want in claims:
        if model.eval(got != want, model_completion=True):
            return Proof(False, scope, len(claims), f"device {d}, shard {r}: got {got}, expected {want}")
    return Proof(False, scope, len(claims), "z3 found a counterexample")
