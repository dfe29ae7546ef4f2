"""synth-reduce: placements and verified hierarchical reduction programs.

The pipeline, one module per concept: ``topology`` -> ``placement`` ->
``language`` -> ``semantics`` -> ``reduction`` -> ``search`` -> ``lowering`` ->
``execute`` (numpy reference) / ``prove`` (z3) / ``verify`` -> ``cost`` ->
``plan`` -> ``runtime`` (``backends``, ``bench``) -> ``cli``. The job planner:
``transformer`` -> ``compute`` -> ``stepmodel`` -> ``planner`` (``steprecords``,
``stepfit`` learn its compute curve).

The public API, importable from the package top level::

    import synth
    solution = synth.solve("p2-a100", {"dp": 4, "mp": 16}, reduce="dp")
    synth.write_plan("plan.json", solution.plan())
    plan = synth.load_plan("plan.json")          # light: numpy only
    synth.verify_plan(plan)                      # numpy reference + z3
    synth.Executor(plan, world)(buffer)          # run it (see synth.runtime)

Names are loaded on first use, so ``import synth.runtime`` (a trainer executing
a plan) does not load the synthesizer (z3, lark, yaml).
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing is not imported at run time: less start-up before the CLI's error handling

__version__ = "0.1.0"

_EXPORTS = {
    "solve": "api", "solve_problem": "api", "solve_sizes": "api", "rank_placements": "api", "Solution": "api",
    "SizesSolution": "api", "plan_job": "planner", "JobRequest": "planner", "JobSolution": "planner",
    "PlacementResult": "api", "ProgramResult": "api", "WorkloadSolution": "api",
    "load_plan": "plan", "write_plan": "plan", "Plan": "plan",
    "verify_plan": "verify", "Executor": "runtime",
    "Model": "cost", "Algorithm": "cost", "Profile": "cost",
    "Reduction": "reduction", "Goal": "semantics", "Topology": "topology", "load_topology": "topology",
    "SynthError": "errors",
}
_SUBMODULES = ("torch", "jax")

__all__ = [
    "Algorithm", "Executor", "Goal", "JobRequest", "JobSolution", "Model", "Plan", "PlacementResult", "Profile",
    "ProgramResult", "Reduction", "SizesSolution", "Solution", "SynthError", "Topology", "WorkloadSolution",
    "__version__", "load_plan", "load_topology", "plan_job", "rank_placements", "solve", "solve_problem",
    "solve_sizes", "verify_plan", "write_plan",
]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from typing import Any

    from .api import (PlacementResult, ProgramResult, SizesSolution, Solution, WorkloadSolution, rank_placements,
                      solve, solve_problem, solve_sizes)
    from .cost import Algorithm, Model, Profile
    from .errors import SynthError
    from .plan import Plan, load_plan, write_plan
    from .planner import JobRequest, JobSolution, plan_job
    from .reduction import Reduction
    from .runtime import Executor
    from .semantics import Goal
    from .topology import Topology, load_topology
    from .verify import verify_plan


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'synth' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
