"""The runtime: plans executed on a real collective library, and timed.

* :mod:`~synth.runtime.executor`: the :class:`~synth.runtime.executor.Executor`
  (schedule, buffer layout, size ranges, collective checks) over a duck-typed
  world (:class:`~synth.runtime.executor.World`);
* :mod:`~synth.runtime.backends`: the worlds: numpy threads (reference), MPI
  (mpi4py), NCCL (CuPy); :mod:`~synth.runtime.torch_world`: torch.distributed
  (NCCL on GPUs, gloo on CPUs), imported only when chosen;
* :mod:`~synth.runtime.meshes`: a plan's device mesh for trainers, and the hosts
  a launch must have;
* :mod:`~synth.runtime.bench`: ``bench`` and ``tune``, nccl-tests style (its parts:
  ``bench_setup``, ``bench_measure``, ``bench_report``, ``bench_tune``);
* :mod:`~synth.runtime.pipelined`: a chunk-level schedule (an MSCCL
  algorithm's thread blocks) run with non-blocking point-to-point (MPI or
  torch.distributed);
* :mod:`~synth.runtime.sparse`, :mod:`~synth.runtime.sparse_bench`: sparse
  programs and their benchmark; :mod:`~synth.runtime.alltoall`: all-to-all
  programs on a world's sub-groups.

Imports: the shared top-level values (including ``plan``), ``synthesis`` and
``cost``; nothing of ``planner``, ``export``, ``testbed`` or ``cli``. The
adapters :mod:`synth.torch` and :mod:`synth.jax` import this stage, never the
reverse. This ``__init__`` imports nothing: ``import synth.runtime.executor``
loads numpy only (no z3, lark or yaml), and no backend's library is imported
before its backend is chosen.
"""
