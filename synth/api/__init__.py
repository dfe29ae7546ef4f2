"""The public Python API: what research scripts, trainers and the command line use.

    import synth
    solution = synth.solve("p2-a100", {"dp": 4, "mp": 16}, reduce="dp")
    best = solution.best                      # the placement predicted fastest
    print(best.matrix, best.programs[0].text, best.programs[0].predicted_s)
    synth.write_plan("plan.json", solution.plan())

:func:`solve` enumerates every placement, synthesizes every program of at most
``max_steps`` steps, predicts and ranks them, and (``verify=True``) proves every
program it returns with the numpy reference and z3. :func:`rank_placements`
ranks placements for a whole workload. The numbers are those the command line
prints (``synth-reduce ... --json``), which is a thin layer over these calls.

One module per collective, each answer in the one shape of
:mod:`synth.api.results` (``best``, ``by_speed``, ``matrix``, the table's rows):
:mod:`~synth.api.reduction` (all-reduce, reduce-scatter, all-gather),
:mod:`~synth.api.sparse` (sparse all-reduce), :mod:`~synth.api.alltoall`,
:mod:`~synth.api.sizes` (axes without sizes) and :mod:`~synth.api.workload`
(a whole step's reductions). Adding a collective: a module of its own on the
bases of :mod:`~synth.api.results`, imported here and listed in
:data:`COLLECTIVE_MODULES`, whose ``__all__`` names are then this package's.
"""

from __future__ import annotations

from . import alltoall, reduction, sizes, sparse, workload

#: the modules whose ``__all__`` this package exports, one per collective
COLLECTIVE_MODULES = (reduction, sizes, workload, sparse, alltoall)

__all__ = ["COLLECTIVE_MODULES"]
for _module in COLLECTIVE_MODULES:
    globals().update({name: getattr(_module, name) for name in _module.__all__})
    __all__ += _module.__all__
del _module
