"""The job planner: which tp/dp/pp sizes, micro-batch, placement and programs
give the fastest training step that fits in memory (``synth-reduce plan``).

* :mod:`~synth.planner.transformer`: a model's shapes and parameters, with its
  FLOPs (:mod:`~synth.planner.flops`) and activations
  (:mod:`~synth.planner.activations`: also the recomputation options);
  :mod:`~synth.planner.modelspec` loads it (shipped models in ``models/``,
  YAML files, inline fields);
* :mod:`~synth.planner.compute`: the compute-efficiency curve and its document;
* :mod:`~synth.planner.stepmodel`: time of one training step (:mod:`~synth.planner.training`: the options and configurations, :mod:`~synth.planner.memory`: memory per device);
* :mod:`~synth.planner.workload`: whole-job workloads (``--workload``): the
  reductions of a step, ranked per placement;
* :mod:`~synth.planner.collectives`: what the step model asks of a placement's
  collectives; :mod:`~synth.planner.collectivecosts`: those collectives priced
  with the best synthesized programs;
* :mod:`~synth.planner.request` and :mod:`~synth.planner.configurations`: what
  to plan, and the search over sizes, micro-batches and placements, job plans;
* :mod:`~synth.planner.steprecords` and :mod:`~synth.planner.stepfit`: step-time
  records of real runs and the compute-curve fit learned from them.

Imports: the shared top-level values (including ``plan``), ``synthesis`` and
``cost``; nothing of ``runtime``, ``export``, ``testbed`` or ``cli``.
"""
