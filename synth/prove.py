"""z3 proof that a lowered program meets its goal for every input.

Independent of the search's semantics: each device's buffer is a vector of ``k``
symbolic chunk values (z3 integer terms) that collectives overwrite in place,
the model of :mod:`synth.execute` written again symbolically. Initial values are
free variables: the device's own data, or, for chunks an AllGather device does
not own, garbage. The claim "every output the goal names equals the sum of its
reduction group's inputs (or the owner's shard)" is checked per output: z3
normalises ``got - want`` to a sum of monomials, and 0 proves it for all
integer inputs; any other output goes, negated, to the z3 solver, whose
``unsat`` is a proof and whose model is a counterexample.
"""

from __future__ import annotations

from dataclasses import dataclass

import z3

from .language import Collective
from .lowering import LoweredProgram, check_structure, verification_scope
from .semantics import Goal

#: (device, chunk) values z3 is given: the whole system if it fits, else
#: reduction group 0 alone (see ``verification_scope``), else the proof is skipped
LIMIT = 1 << 14


@dataclass(frozen=True)
class Proof:
    proved: bool
    scope: str  # "whole system", "reduction group 0 of N", or "skipped: why"
    obligations: int
    counterexample: str = ""

    @property
    def skipped(self) -> bool:
        return self.scope.startswith("skipped")


def _sum(terms: list[z3.ArithRef]) -> z3.ArithRef:
    """``z3.Sum`` without its per-argument type coercion (all terms are Int)."""
    if len(terms) == 1:
        return terms[0]
    array = (z3.Ast * len(terms))(*(t.as_ast() for t in terms))
    ctx = terms[0].ctx
    return z3.ArithRef(z3.Z3_mk_add(ctx.ref(), len(terms), array), ctx)


_CONSTANTS: dict[str, z3.ArithRef] = {}


def _constant(name: str) -> z3.ArithRef:
    """The z3 integer constant ``name``, created once per process: the same
    names recur in every proof of a group of the same size, and creating
    constants is most of a small proof's time."""
    term = _CONSTANTS.get(name)
    if term is None:
        term = _CONSTANTS[name] = z3.Int(name)
    return term


def prove(lowered: LoweredProgram) -> Proof:
    """Prove the program for all integer inputs on the scope that fits
    :data:`LIMIT`; SynthError if it is malformed
    (:func:`~synth.lowering.check_structure`)."""
    check_structure(lowered)
    scoped = verification_scope(lowered, LIMIT)
    if scoped is None:
        k = lowered.num_chunks
        return Proof(False, f"skipped: one reduction group has {k}x{k} values (> {LIMIT})", 0)
    lowered, scope = scoped
    k = lowered.num_chunks
    rows = lowered.reduction_groups
    value: dict[tuple[int, int], z3.ArithRef] = {}
    for row in rows:
        for rank, d in enumerate(row):
            for c in range(k):
                if lowered.goal is Goal.ALLGATHER and c != lowered.chunk_of_rank[rank]:
                    value[d, c] = _constant(f"garbage_{d}_{c}")
                else:
                    value[d, c] = _constant(f"in_{d}_{c}")
    initial = dict(value)
    for step in lowered.steps:
        for group, chunks in zip(step.groups, step.chunks):
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
                sums = {c: _sum([value[m, c] for m in group]) for c in chunks}
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
        if lowered.goal is Goal.ALLGATHER:
            wants = [initial[row[r], lowered.chunk_of_rank[r]] for r in range(k)]
        else:
            wants = [_sum([initial[e, lowered.chunk_of_rank[r]] for e in row]) for r in range(k)]
        for rank, d in enumerate(row):
            for r in range(k):
                if lowered.goal is Goal.REDUCESCATTER and r != rank:
                    continue
                claims.append((d, r, value[d, lowered.chunk_of_rank[r]], wants[r]))
    # z3 normalises each distinct obligation got - want (as a sum of monomials);
    # 0 proves it for all inputs. The rest go to the solver, which either proves
    # them (unsat) or returns a counterexample model.
    pending, seen = [], set()
    # the same term objects recur (a collective's sum is shared by its members):
    # look at each pair of objects once, then at each pair of z3 terms once
    for claim in {(id(c[2]), id(c[3])): c for c in claims}.values():
        key = (claim[2].get_id(), claim[3].get_id())
        if key in seen:
            continue
        seen.add(key)
        difference = z3.simplify(claim[2] - claim[3], som=True)
        if not (z3.is_int_value(difference) and difference.as_long() == 0):
            pending.append(claim)
    if not pending:
        return Proof(True, scope, len(claims))
    solver = z3.Solver()
    solver.add(z3.Or([got != want for _, _, got, want in pending]))
    if solver.check() == z3.unsat:
        return Proof(True, scope, len(claims))
    model = solver.model()
    for d, r, got, want in pending:
        if model.eval(got != want, model_completion=True):
            return Proof(False, scope, len(claims), f"device {d}, shard {r}: got {got}, expected {want}")
    return Proof(False, scope, len(claims), "z3 found a counterexample")
