"""What ``emulate`` runs, as data (pure: runs nothing): the ``ip``/``tc`` commands
that build a cluster, the prefix that enters a node, the launcher agent, the
hostfile, the ``mpiexec`` line with its rank guard, and the dry run that lists
them all (``plan_text``)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Sequence

from .description import SUBNET, Cluster, Shaping, describe_text


def _ip(namespace: str, *args: str) -> tuple[str, ...]:
    return ("ip", "-n", namespace, *args)


def _tbf(namespace: str, device: str, s: Shaping) -> tuple[str, ...]:
    return ("tc", "-n", namespace, "qdisc", "add", "dev", device, "root", *s.tc_args())


def build_commands(c: Cluster) -> list[tuple[str, ...]]:
    """The ``ip``/``tc`` commands that create ``c``, in order; each touches only
    the cluster's own namespaces."""
    sw = c.switch_namespace
    mtu = ("mtu", str(c.mtu_bytes))  # every link and bridge of the cluster: a path takes its smallest
    cmds: list[tuple[str, ...]] = [("ip", "netns", "add", ns) for ns in c.namespaces]
    cmds += [_ip(ns, "link", "set", "lo", "up") for ns in c.namespaces]
    cmds += [
        _ip(sw, "link", "add", c.top_bridge, *mtu, "type", "bridge"),
        _ip(sw, "addr", "add", f"{c.launcher_address}/{SUBNET.prefixlen}", "dev", c.top_bridge),
        _ip(sw, "link", "set", c.top_bridge, "up"),
    ]
    for r in c.racks:
        assert c.rack_shaping is not None
        cmds += [
            _ip(sw, "link", "add", r.bridge, *mtu, "type", "bridge"),
            _ip(sw, "link", "set", r.bridge, "up"),
            _ip(sw, "link", "add", r.link, *mtu, "type", "veth", "peer", "name", r.peer, *mtu),
            _ip(sw, "link", "set", r.link, "master", r.bridge, "up"),
            _ip(sw, "link", "set", r.peer, "master", c.top_bridge, "up"),
            _tbf(sw, r.link, c.rack_shaping),
            _tbf(sw, r.peer, c.rack_shaping),
        ]
    for n in c.nodes:
        cmds += [
            ("ip", "link", "add", n.link, "netns", n.namespace, *mtu, "type", "veth", "peer", "name", n.peer,
             "netns", sw, *mtu),
            _ip(sw, "link", "set", n.peer, "master", n.bridge, "up"),
            _ip(n.namespace, "addr", "add", f"{n.address}/{SUBNET.prefixlen}", "dev", n.link),
            _ip(n.namespace, "link", "set", n.link, "up"),
            _tbf(n.namespace, n.link, c.node_shaping),
            _tbf(sw, n.peer, c.node_shaping),
        ]
    return cmds


# `sh -c` script run by unshare: own hostname and /dev/shm, TMPDIR, then exec the
# command ($1 hostname, $2 TMPDIR, the rest the command).
_ENTER = 'hostname "$1" && mount -t tmpfs tmpfs /dev/shm && mkdir -p "$2" && export TMPDIR="$2" && shift 2 && exec "$@"'


def enter_node(namespace: str, tmpdir: Path) -> tuple[str, ...]:
    """Prefix that runs a command in ``namespace`` with hostname ``namespace``,
    a private tmpfs on ``/dev/shm`` and ``TMPDIR=tmpdir``."""
    return ("ip", "netns", "exec", namespace, "unshare", "--uts", "--mount", "--propagation", "private",
            "sh", "-c", _ENTER, "sh", namespace, str(tmpdir))


def agent_script(c: Cluster) -> str:
    """The launcher agent (PRRTE's ``plm_ssh_agent``): called like ssh as
    ``agent [-options] HOST COMMAND...``, it runs COMMAND in HOST's node."""
    cases = "\n".join(f"  {n.address}) exec {shlex.join(enter_node(n.namespace, n.tmpdir))} sh -c \"$*\" ;;"
                      for n in c.nodes)
    return (
        "#!/bin/sh\n"
        f"# written by synth-reduce emulate for cluster {c.tag}; removed at teardown\n"
        'while [ "${1#-}" != "$1" ]; do shift; done  # ssh-style options: none apply\n'
        'host=$1; shift\n'
        'case "$host" in\n'
        f"{cases}\n"
        '  *) echo "synth-reduce emulate: no node $host in this cluster" >&2; exit 255 ;;\n'
        "esac\n"
    )


def hostfile_text(c: Cluster) -> str:
    return "".join(f"{n.address} slots={n.ranks}\n" for n in c.nodes)


# OpenMPI 5.0's launcher (PRRTE) can hang forever when a rank exits within
# milliseconds of its start (its "running" event lands after its exit; seen with
# `hostname` in about half of the runs). Each rank therefore runs its command,
# keeps the exit status and pauses RANK_PAUSE_S before exiting.
RANK_PAUSE_S = 0.2
RANK_GUARD = f'"$0" "$@"; status=$?; sleep {RANK_PAUSE_S}; exit $status'


def mpiexec_command(c: Cluster, mpiexec: str, command: Sequence[str]) -> tuple[str, ...]:
    """``mpiexec`` across the nodes, run in the switch namespace; ranks are
    placed node by node (rank ``d`` on node ``d // ranks``), as device ids are.
    Each rank runs ``command`` under the guard above."""
    subnet = str(SUBNET)
    return (
        *enter_node(c.switch_namespace, c.launcher_tmpdir), mpiexec,
        "-n", str(c.ranks), "--hostfile", str(c.hostfile_path), "--map-by", "slot",
        "--prtemca", "plm_ssh_agent", str(c.agent_path), "--prtemca", "plm_ssh_no_tree_spawn", "1",
        "--prtemca", "oob_tcp_if_include", subnet, "--mca", "btl_tcp_if_include", subnet,
        "--mca", "mpi_yield_when_idle", "1", "--bind-to", "none", "--oversubscribe",
        "sh", "-c", RANK_GUARD, *command,
    )


MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def plan_text(c: Cluster) -> str:
    """The dry run: description, nodes, and every command ``emulate`` would run."""
    lines = [describe_text(c), "", f"{'node':>4}  {'namespace = hostname':<22} {'address':<13} "
             f"{'link/peer':<24} bridge"]
    for n in c.nodes:
        lines.append(f"{n.index:>4}  {n.namespace:<22} {n.address:<13} {n.link + '/' + n.peer:<24} {n.bridge}")
    lines += ["", "commands:"] + [f"  {shlex.join(cmd)}" for cmd in build_commands(c)]
    lines += ["", f"launcher agent {c.agent_path}:"] + [f"  {line}" for line in agent_script(c).splitlines()]
    lines += ["", "job: " + " ".join(f"{k}={v}" for k, v in MPI_ENV.items()) + " "
              + shlex.join(mpiexec_command(c, "mpiexec", ["COMMAND..."]))]
    return "\n".join(lines)
