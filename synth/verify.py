"""Prove lowered programs and plans: two independent checks.

* the numpy reference (:func:`synth.execute.check_numerically`): run the program
  on random integer data and compare every output with the direct reduction;
* z3 (:func:`synth.prove.prove`): the outputs equal the reduction for all
  integer inputs.

A plan's stored steps are already checked against the derivation of its
programs when it is loaded (:func:`synth.plan.load_plan`); :func:`verify_plan`
then proves every program of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import SynthError
from .execute import check_numerically
from .lowering import LoweredProgram
from .plan import Plan
from .prove import Proof, prove


@dataclass(frozen=True)
class Verification:
    elements_checked: int
    proof: Proof


def verify_lowered(lowered: LoweredProgram) -> Verification:
    """Both independent checks; SynthError if either fails. A z3 proof skipped for
    size (``proof.skipped``) is not a failure; callers report its scope."""
    checked = check_numerically(lowered)
    proof = prove(lowered)
    if not proof.proved and not proof.skipped:
        raise SynthError(f"z3 refutes the program: {proof.counterexample}")
    return Verification(checked, proof)


def verify_plan(plan: Plan, source: str = "plan") -> tuple[Verification, ...]:
    """Prove every program of ``plan`` (in document order); SynthError naming the
    reduction and size range of the first that fails."""
    out = []
    for planned in plan.reductions:
        for program in planned.programs:
            try:
                out.append(verify_lowered(program.lowered))
            except SynthError as exc:
                where = planned.reduction.describe()
                if len(planned.programs) > 1:
                    where += f", buffers of {program.min_bytes}..{program.max_bytes or 'any'} bytes"
                raise SynthError(f"{source}: {where}: {exc}") from None
    return tuple(out)
