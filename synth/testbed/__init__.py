"""``synth-reduce emulate``: an emulated hierarchical cluster on one Linux box
(docs/testbed.md), and MPI jobs launched across it.

    synth-reduce emulate --topology T [options] -- COMMAND...   # build, mpiexec COMMAND, tear down
    synth-reduce emulate plan --topology T [options]            # dry run: what it would create
    synth-reduce emulate down [--all]                           # remove leftovers of crashed runs

The topology's innermost level is the MPI ranks of a node, the level above it the
nodes, an optional level above that the racks (at most 3 levels). Every node is a
network namespace; its processes also get their own hostname, ``/dev/shm``
(tmpfs) and ``TMPDIR``, so OpenMPI treats nodes as separate hosts: shared memory
inside a node, TCP between nodes. A further namespace, the switch, holds the
bridges and the launcher (``mpiexec``): nodes hang off the top bridge (or off
their rack's bridge, which hangs off the top bridge), each through a veth pair
shaped by ``tc tbf`` at both ends (bandwidth per direction). Every link and
address lives inside namespaces this package created (the root namespace is never
touched), so the private subnet cannot clash with the host's network.

Rates: the topology's uplink bandwidths times a rate scale (see ``description``).

Layers, one module each, every one importing only those above it:

- ``names``: the ``sr-<pid>`` naming scheme of namespaces, links, bridges and
  work folders: builds them from an owner pid and an index, and recognises them.
- ``description`` (pure): a cluster described from a topology
  (``describe_cluster``): nodes, racks, addresses, shaped rates; ``describe_text``.
- ``commands`` (pure): the commands and files that build a cluster and launch a
  job on it (``build_commands``, ``enter_node``, ``agent_script``,
  ``hostfile_text``, ``mpiexec_command``), and the dry run listing them (``plan_text``).
- ``watch`` (pure): from snapshots of the node namespaces' processes, when a
  job has lost ranks: stalled after a rank's guard died, or ended by mpiexec
  while a node's ranks still ran (its daemon died).
- ``namespaces`` (imperative): runs them: ``preflight``, ``build``, ``launch``
  (which stops a job that lost ranks), ``teardown``, ``cluster_up`` (which always
  tears down), ``scan``, ``down``.

- ``evaluation``: the measured evaluation of docs/results.md (the cases
  ``scripts/run_evaluation.py`` measures on emulated clusters, and the report
  ``scripts/evaluation_report.py`` makes of them). It imports the cost model
  (``cost``: records, fit); this ``__init__`` does not import it, so the
  emulator alone never loads the cost model.

Imports: the shared top-level values (``errors``, ``topology``) and, in
``evaluation`` only, ``synthesis`` and ``cost``; nothing of ``planner``,
``runtime``, ``export`` or ``cli``. The command line, ``synth-reduce
emulate``, is :mod:`synth.cli.emulate`.

Guide: docs/testbed.md.
"""

from .commands import (
    MPI_ENV,
    RANK_GUARD,
    RANK_PAUSE_S,
    agent_script,
    build_commands,
    enter_node,
    hostfile_text,
    mpiexec_command,
    plan_text,
)
from .description import SUBNET, Cluster, Node, Rack, Shaping, choose_rate_scale, describe_cluster, describe_text
from .names import Names
from .namespaces import Leftovers, RanksLost, cluster_up, down, find_mpiexec, launch, preflight, scan, teardown

__all__ = [
    "MPI_ENV", "RANK_GUARD", "RANK_PAUSE_S", "SUBNET", "Cluster", "Leftovers", "Names", "Node", "Rack", "RanksLost",
    "Shaping", "agent_script", "build_commands", "choose_rate_scale", "cluster_up", "describe_cluster",
    "describe_text", "down", "enter_node", "find_mpiexec", "hostfile_text", "launch",
    "mpiexec_command", "plan_text", "preflight", "scan", "teardown",
]
