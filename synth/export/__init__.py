"""Exports: files that other stacks load unchanged, written from a plan.

This stage turns proved plans into what NCCL-based stacks and trainers consume:
MSCCL algorithm XML and NCCL tuner rules (NCCL), the rank map, Megatron-LM
arguments, a torchtitan ``[parallelism]`` table and a JAX device array
(trainers); ``synth-reduce export`` is its command. It is empty so far: the
exports land here (``../shared/DESIGN.md`` sections 11 and 12).

Imports: the shared top-level values (including ``plan``), ``synthesis``,
``cost`` and ``planner``; nothing of ``runtime``, ``testbed`` or ``cli``. Every
file it emits comes from a plan whose programs are proved.
"""
