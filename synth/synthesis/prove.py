"""z3 proof that a lowered program meets its goal for every input.

Independent of the search's semantics: each device's buffer is a vector of ``k``
symbolic chunk values (z3 integer terms) that collectives overwrite in place,
the model of :mod:`synth.synthesis.execute` written again symbolically. Initial values are
free variables: the device's own data, or, for chunks an AllGather device does
not own, garbage. The claim "every output the goal names equals the sum of its
reduction group's inputs (or the owner's shard)" is checked per output: z3
normalises ``got - want`` to a sum of monomials, and 0 proves it for all
integer inputs; any other output goes, negated, to the z3 solver, whose
``unsat`` is a proof and whose model is a counterexample.

Cost. A proof of a program on one group of ``k = 32`` builds a few hundred sums;
most of its time is the Python side of z3's API, so terms are built through
its C functions directly (:class:`_Terms`), the integer constants of a group
size are created once per process, and each distinct obligation is normalised
once.
"""

from __future__ import annotations

from dataclasses import dataclass

import z3

from ..caches import memoised
from ..interrupts import solver_check, z3_ctrl_c_off
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


_CONSTANTS: dict[str, z3.ArithRef] = {}


def _constant(name: str) -> z3.ArithRef:
    """The z3 integer constant ``name``, created once per process (and kept
    alive here): the same names recur in every proof of a group of the same
    size, and creating constants was most of a small proof's time."""
    term = _CONSTANTS.get(name)
    if term is None:
        term = _CONSTANTS[name] = z3.Int(name)
    return term


class _Terms:
    """Integer terms of one proof as raw z3 ASTs, kept alive by one vector
    (instead of a Python wrapper with its own reference count per term)."""

    def __init__(self) -> None:
        z3_ctrl_c_off()  # before the first simplification: z3's own Ctrl-C handler would lose a SIGINT
        self.ctx = z3.main_ctx()
        self.ref = self.ctx.ref()
        self._keep = z3.AstVector(ctx=self.ctx)
        self.zero = z3.IntVal(0, self.ctx)

    def add(self, terms: list) -> object:
        if len(terms) == 1:
            return terms[0]
        ast = z3.Z3_mk_add(self.ref, len(terms), (z3.Ast * len(terms))(*terms))
        z3.Z3_ast_vector_push(self.ref, self._keep.vector, ast)
        return ast

    def same(self, got: object, want: object) -> bool:
        """Whether z3 normalises ``got - want`` (a sum of monomials) to 0: then
        they are equal for every input."""
        difference = z3.Z3_mk_sub(self.ref, 2, (z3.Ast * 2)(got, want))
        z3.Z3_ast_vector_push(self.ref, self._keep.vector, difference)
        return self.expr(z3.Z3_simplify_ex(self.ref, difference, _sum_of_monomials().params)).eq(self.zero)

    def all_same(self, pairs: list[tuple[object, object]]) -> bool:
        """Whether every ``got - want`` normalises to 0, by normalising one
        term: their sum weighted by distinct fresh variables."""
        if len(pairs) == 1:
            return self.same(*pairs[0])
        weighted = []
        for i, (got, want) in enumerate(pairs):
            difference = z3.Z3_mk_sub(self.ref, 2, (z3.Ast * 2)(got, want))
            z3.Z3_ast_vector_push(self.ref, self._keep.vector, difference)
            product = z3.Z3_mk_mul(self.ref, 2, (z3.Ast * 2)(_constant(f"weight_{i}").as_ast(), difference))
            z3.Z3_ast_vector_push(self.ref, self._keep.vector, product)
            weighted.append(product)
        total = self.add(weighted)
        return self.expr(z3.Z3_simplify_ex(self.ref, total, _sum_of_monomials().params)).eq(self.zero)

    def expr(self, ast: object) -> z3.ArithRef:
        return z3.ArithRef(ast, self.ctx)

    def id(self, ast: object) -> int:
        return z3.Z3_get_ast_id(self.ref, ast)


@memoised(maxsize=1)
def _sum_of_monomials() -> z3.ParamsRef:
    params = z3.ParamsRef()
    params.set("som", True)
    return params


@memoised(maxsize=64)
def _inputs(rows: tuple[tuple[int, ...], ...], k: int, goal: Goal, chunk_of_rank: tuple[int, ...]):
    """The initial values as columns (``[c][d]``: chunk ``c`` of device ``d``)
    and, per row, what each shard must end as: the sum of the row's inputs
    (the owner's input for allgather), as raw ASTs kept alive by this cache.
    The same for every proof of a group of this size, goal and chunk placement."""
    devices = max(d for row in rows for d in row) + 1
    columns: list[list] = [[None] * devices for _ in range(k)]
    for row in rows:
        for rank, d in enumerate(row):
            for c in range(k):
                garbage = goal is Goal.ALLGATHER and c != chunk_of_rank[rank]
                columns[c][d] = _constant(f"{'garbage' if garbage else 'in'}_{d}_{c}").as_ast()
    wants, keep = [], []
    for row in rows:
        if goal is Goal.ALLGATHER:
            wants.append([columns[chunk_of_rank[r]][row[r]] for r in range(k)])
        else:
            sums = [z3.Sum([z3.ArithRef(columns[chunk_of_rank[r]][e], z3.main_ctx()) for e in row])
                    for r in range(k)]
            keep.append(sums)  # alive as long as this cache entry
            wants.append([s.as_ast() for s in sums])
    return tuple(tuple(col) for col in columns), wants, keep


#: the values after each program prefix proved so far (the programs of a search
#: share prefixes), and the vector keeping their terms alive; forgotten all at
#: once, between proofs, past _PREFIX_LIMIT
_PREFIXES: dict[tuple, tuple[tuple, ...]] = {}
_PREFIX_TERMS: list["_Terms"] = []
_PREFIX_LIMIT = 20_000


def _run(steps, start: tuple, base: tuple) -> list[list]:
    """The values after ``steps`` from the initial columns ``start``, reusing
    the longest prefix already computed."""
    if len(_PREFIXES) > _PREFIX_LIMIT or not _PREFIX_TERMS:
        _PREFIXES.clear()
        _PREFIX_TERMS[:] = [_Terms()]
    terms = _PREFIX_TERMS[0]
    keys = [base]
    for step in steps:
        keys.append((keys[-1], step))
    done = next((i for i in range(len(steps), 0, -1) if keys[i] in _PREFIXES), 0)
    value = [list(col) for col in (_PREFIXES[keys[done]] if done else start)]
    for number in range(done, len(steps)):
        step = steps[number]
        kind = step.collective
        for group, chunks in zip(step.groups, step.chunks):
            size = len(chunks) // len(group)
            if kind is Collective.ALLGATHER:
                for i, owner in enumerate(group):
                    for c in chunks[i * size:(i + 1) * size]:
                        col = value[c]
                        got = col[owner]
                        for m in group:
                            col[m] = got
            elif kind is Collective.BROADCAST:
                root = group[0]
                for c in chunks:
                    col = value[c]
                    got = col[root]
                    for m in group:
                        col[m] = got
            else:
                sums = {}
                for c in chunks:
                    col = value[c]
                    sums[c] = terms.add([col[m] for m in group])
                if kind is Collective.ALLREDUCE:
                    for c in chunks:
                        col, total = value[c], sums[c]
                        for m in group:
                            col[m] = total
                elif kind is Collective.REDUCE:
                    for c in chunks:
                        value[c][group[0]] = sums[c]
                else:  # ReduceScatter: member i keeps part i
                    for i, m in enumerate(group):
                        for c in chunks[i * size:(i + 1) * size]:
                            value[c][m] = sums[c]
        _PREFIXES[keys[number + 1]] = tuple(tuple(col) for col in value)
    return value


def skipped(k: int) -> Proof | None:
    """The skipped proof of a program on groups of ``k`` devices, if even one
    group is over :data:`LIMIT`; else None."""
    if k * k <= LIMIT:
        return None
    return Proof(False, f"skipped: one reduction group has {k}x{k} values (> {LIMIT})", 0)


def prove(lowered: LoweredProgram) -> Proof:
    """Prove the program for all integer inputs on the scope that fits
    :data:`LIMIT`; SynthError if it is malformed
    (:func:`~synth.synthesis.lowering.check_structure`)."""
    too_large = skipped(lowered.num_chunks)
    if too_large is not None:
        return too_large
    check_structure(lowered)
    lowered, scope = verification_scope(lowered, LIMIT)
    k = lowered.num_chunks
    rows = lowered.reduction_groups
    start, wants_of_row, _ = _inputs(rows, k, lowered.goal, lowered.chunk_of_rank)
    value = _run(lowered.steps, start, (rows, k, lowered.goal, lowered.chunk_of_rank))
    terms = _Terms()
    claims = []
    for row, wants in zip(rows, wants_of_row):
        for r in range(k):
            col, want = value[lowered.chunk_of_rank[r]], wants[r]
            devices = (row[r],) if lowered.goal is Goal.REDUCESCATTER else row
            claims.extend((d, r, col[d], want) for d in devices)
    # z3 normalises each distinct obligation got - want (as a sum of monomials);
    # 0 proves it for all inputs. The rest go to the solver, which either proves
    # them (unsat) or returns a counterexample model. The same term objects recur
    # (a collective's sum is shared by its members): each pair of objects is
    # looked at once, then each pair of z3 terms once.
    distinct, seen = [], set()
    for claim in {(id(c[2]), id(c[3])): c for c in claims}.values():
        key = (terms.id(claim[2]), terms.id(claim[3]))
        if key not in seen:
            seen.add(key)
            distinct.append(claim)
    # all at once first: sum_i t_i (got_i - want_i), the t_i fresh variables, is
    # 0 as a polynomial exactly when every got_i - want_i is
    if terms.all_same([(c[2], c[3]) for c in distinct]):
        return Proof(True, scope, len(claims))
    pending = [(c[0], c[1], terms.expr(c[2]), terms.expr(c[3])) for c in distinct if not terms.same(c[2], c[3])]
    if not pending:
        return Proof(True, scope, len(claims))
    solver = z3.Solver()
    solver.add(z3.Or([got != want for _, _, got, want in pending]))
    if solver_check(solver) == z3.unsat:  # unknown raises: never read as a counterexample
        return Proof(True, scope, len(claims))
    model = solver.model()
    for d, r, got, want in pending:
        if model.eval(got != want, model_completion=True):
            return Proof(False, scope, len(claims), f"device {d}, shard {r}: got {got}, expected {want}")
    return Proof(False, scope, len(claims), "z3 found a counterexample")
