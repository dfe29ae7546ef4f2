"""synth-reduce: placements and verified hierarchical reduction programs.

The package shows the pipeline, one stage per subpackage, each importing only
the stages below it (``tests/test_layout.py`` checks this):

* top level, shared by every stage: ``version``, ``errors``, ``units``, ``resources``,
  ``documents`` (versioned JSON), ``topology``; ``plan`` (the plan document:
  built from and re-derived with the synthesis stage, read by every stage
  above it); ``api`` (the public API) and the adapters ``torch`` and ``jax``;
* ``synthesis``: placements, the reduction language and its semantics, the
  search, lowering, and the two verifiers (numpy reference, z3);
* ``cost``: the contention-aware cost model (what NCCL or MPI runs, and how
  long it takes), its measurement records, the NCCL corpus and the fit;
* ``planner``: the job planner (model shapes, compute, step model, the search
  over sizes, micro-batches and placements) and whole-job workloads;
* ``runtime``: the executor of plans, its backends (numpy, MPI, NCCL, torch)
  and ``bench``/``tune``;
* ``export``: files other stacks load (NCCL, trainers);
* ``testbed``: the emulated cluster and the evaluation measured on it;
* ``cli``: the ``synth-reduce`` command, one module per command.

The public API, importable from the package top level::

    import synth
    solution = synth.solve("p2-a100", {"dp": 4, "mp": 16}, reduce="dp")
    synth.write_plan("plan.json", solution.plan())
    plan = synth.load_plan("plan.json")          # light: numpy only
    synth.verify_plan(plan)                      # numpy reference + z3
    synth.Executor(plan, world)(buffer)          # run it (see synth.runtime.executor)

Names are loaded on first use, so ``import synth.runtime.executor`` (a trainer
executing a plan) does not load the synthesizer (z3, lark, yaml).
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing is not imported at run time: less start-up before the CLI's error handling

from .version import __version__

_EXPORTS = {
    "solve": "api", "solve_problem": "api", "solve_sparse": "api", "SparseSolution": "api",
    "solve_alltoall": "api", "AllToAllSolution": "api", "solve_sizes": "api", "rank_placements": "api", "Solution": "api",
    "SizesSolution": "api", "PlacementResult": "api", "ProgramResult": "api", "WorkloadSolution": "api",
    "plan_job": "planner.configurations", "JobRequest": "planner.request",
    "JobSolution": "planner.configurations",
    "load_plan": "plan", "write_plan": "plan", "Plan": "plan",
    "verify_plan": "plan", "Executor": "runtime.executor",
    "Model": "cost", "Algorithm": "cost", "NetworkProfile": "cost", "Profile": "cost",
    "Reduction": "synthesis.reduction", "Goal": "synthesis.semantics",
    "Topology": "topology", "load_topology": "topology",
    "SynthError": "errors",
}
_SUBMODULES = ("torch", "jax")

__all__ = [
    "AllToAllSolution", "Algorithm", "Executor", "Goal", "JobRequest", "JobSolution", "Model", "NetworkProfile", "Plan",
    "PlacementResult", "Profile",
    "ProgramResult", "Reduction", "SizesSolution", "Solution", "SparseSolution", "SynthError", "Topology", "WorkloadSolution",
    "__version__", "load_plan", "load_topology", "plan_job", "rank_placements", "solve", "solve_problem",
    "solve_alltoall", "solve_sizes", "solve_sparse", "verify_plan", "write_plan",
]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from typing import Any

    from .api import (
        AllToAllSolution,
        PlacementResult,
        ProgramResult,
        SizesSolution,
        Solution,
        SparseSolution,
        WorkloadSolution,
        rank_placements,
        solve,
        solve_alltoall,
        solve_problem,
        solve_sizes,
        solve_sparse,
    )
    from .cost import Algorithm, Model, NetworkProfile, Profile
    from .errors import SynthError
    from .plan import Plan, load_plan, verify_plan, write_plan
    from .planner.configurations import JobSolution, plan_job
    from .planner.request import JobRequest
    from .runtime.executor import Executor
    from .synthesis.reduction import Reduction
    from .synthesis.semantics import Goal
    from .topology import Topology, load_topology


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
