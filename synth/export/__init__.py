"""Exports: what other stacks take from a plan, unchanged.

* :mod:`~synth.export.rank_map`: the rank map (trainer rank -> device) that
  makes groups formed from rank order the plan's groups, and the environment a
  torchrun process takes to be renumbered (``synth-reduce launch``,
  :func:`synth.torch.launch_rank`);
* :mod:`~synth.export.trainer`: a plan's axes under trainer names, a job
  plan's job;
* :mod:`~synth.export.megatron`: Megatron-LM arguments;
* :mod:`~synth.export.torchtitan`: torchtitan's ``[parallelism]`` settings;
* :mod:`~synth.export.jax_mesh`: the device array of a JAX mesh.
* :mod:`~synth.export.msccl`: a verified program as an MSCCL algorithm XML
  (what the MSCCL executor build of NCCL loads), pipelined chunk by chunk;
* :mod:`~synth.export.msccl_check`: an independent chunk-level interpreter that
  checks any MSCCL XML (format, connections, dependencies, deadlock, result).

``synth-reduce export`` is the command. Every group an export implies is
checked against the plan before it is returned; the plan itself was checked
against the derivation of its programs when it was loaded. The NCCL programs
(MSCCL XML, tuner rules; docs/nccl-programs.md) land here too.

Imports: the shared top-level values (including ``plan``), ``synthesis``,
``cost``, ``planner`` and ``runtime`` (its mesh layouts; nothing that runs);
nothing of ``testbed`` or ``cli``. No module here imports torch, jax, z3 or
lark.
"""
