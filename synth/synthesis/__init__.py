"""Synthesis: placements, the reduction language, its semantics, the search
for programs, their lowering onto the whole system, and their proofs.

The stage, one concept per module, each importing only those before it:

* :mod:`~synth.synthesis.placement`: parallelism matrices (placements of the
  axes on the hierarchy) and their enumeration with z3;
* :mod:`~synth.synthesis.language`: instructions and programs, their text form
  (lark grammar ``grammars/program.lark``);
* :mod:`~synth.synthesis.semantics`: states, the rules of every collective,
  goals and synthesis hierarchies (the reference);
* :mod:`~synth.synthesis.statespace`: the interned state space the search and
  the tracer step, one part per module (interning, checks, outcomes, the
  lookahead, patterns, shifts, vector steps) and its ``SearchTuning``;
* :mod:`~synth.synthesis.reduction`: a placement + reduction axes + goal, with
  its synthesis hierarchy and group tables;
* :mod:`~synth.synthesis.problem`: the question a command asks (topology, axes,
  reduction, constraints), resolved into placements and reductions;
* :mod:`~synth.synthesis.search`: every valid program up to a length, over
  states, with counts and k-best paths; :mod:`~synth.synthesis.bounded`: the
  independent z3 bounded search that cross-checks it in the tests;
* :mod:`~synth.synthesis.lowering`: a program's steps as groups of global
  device ids and chunk runs;
* :mod:`~synth.synthesis.execute` (numpy reference executor, the first
  verifier), :mod:`~synth.synthesis.prove` (z3, the second) and
  :mod:`~synth.synthesis.verify` (both, memoised; also of a plan's programs);
* :mod:`~synth.synthesis.hashing` and :mod:`~synth.synthesis.sparse`: sparse
  all-reduce, a program's sparse form; :mod:`~synth.synthesis.alltoall`:
  all-to-all programs (their language, search and labelled-block proof).

Imports: the shared top-level values only (``errors``, ``units``,
``resources``, ``documents``, ``topology``, ``caches``); nothing of ``cost``, ``planner``,
``runtime``, ``export``, ``testbed`` or ``cli``, nor the plan document (the
plan module imports this stage and proves a plan's programs with
:func:`~synth.synthesis.verify.verify_lowered`). This ``__init__`` imports nothing, so
``import synth.synthesis.lowering`` does not load z3 or lark.
"""
