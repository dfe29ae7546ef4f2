"""``synth-reduce emulate``: an emulated cluster on this machine, the command
line (its parsers and ``emulate_main``) over :mod:`synth.testbed`'s description
and imperative layer."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from ..errors import SynthError
from ..testbed.commands import plan_text
from ..testbed.description import AUTO_CAP_GBPS, DEFAULT_MTU_BYTES, Cluster, describe_cluster, describe_text
from ..testbed.names import Names
from ..testbed.namespaces import RANKS_LOST_EXIT, RanksLost, cluster_up, down, find_mpiexec, launch, preflight
from .args import Parser, add_scale_argument, scaled_topology


def _parser(prog: str, job: bool) -> argparse.ArgumentParser:
    # the job's COMMAND comes after '--', which emulate_main splits off before parsing
    usage = f"{prog} --topology T [options] -- COMMAND..." if job else None
    p = Parser(prog=prog, usage=usage, description=(
        "Emulate the topology's cluster on this machine (root): one network namespace per node, "
        "tc-shaped uplinks, " + ("then run COMMAND under mpiexec across it and tear everything down."
                                 if job else "and print what would be created and run.")))
    p.add_argument("--topology", required=True, help="YAML file or shipped name: [node, rank] or [rack, node, rank]")
    add_scale_argument(p)
    p.add_argument("--ranks-per-node", type=int, metavar="N", help="MPI ranks per node (default: the rank level's count)")
    p.add_argument("--rate-scale", metavar="FACTOR", default="auto",
                   help="multiply the topology's uplink bandwidths by FACTOR (default auto: 1, or less so that "
                        f"the fastest shaped uplink is {AUTO_CAP_GBPS * 8:g} Gbit/s)")
    p.add_argument("--node-rate-gbit", type=float, metavar="X",
                   help="shape node uplinks to X Gbit/s; the rack uplinks keep their ratio to them")
    p.add_argument("--mtu", type=int, default=DEFAULT_MTU_BYTES, metavar="BYTES",
                   help=f"MTU of every emulated link (default {DEFAULT_MTU_BYTES}; 9000: jumbo frames, whose "
                        "headers take 0.7%% of a link instead of 4.4%%)")
    if job:
        p.add_argument("--verbose", action="store_true", help="print every ip/tc command and the mpiexec line")
    return p


def _describe_from(args: argparse.Namespace) -> Cluster:
    scale = None
    if args.rate_scale != "auto":
        try:
            scale = float(args.rate_scale)
        except ValueError:
            raise SynthError(f"--rate-scale {args.rate_scale}: expected a number or 'auto'") from None
    return describe_cluster(scaled_topology(args), os.getpid(), args.ranks_per_node, scale,
                            args.node_rate_gbit, mtu_bytes=args.mtu)


def _say(text: str) -> None:
    print(f"synth-reduce emulate: {text}", file=sys.stderr, flush=True)


def _split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    if "--" not in argv:
        return list(argv), []
    i = list(argv).index("--")
    return list(argv[:i]), list(argv[i + 1:])


def emulate_main(argv: list[str]) -> int:
    """``synth-reduce emulate``; see the package docstring."""
    if argv[:1] == ["down"]:
        p = Parser(prog="synth-reduce emulate down",
                    description="Remove namespaces, links and work folders left by emulate runs that died.")
        p.add_argument("--all", action="store_true", help="also those of emulate processes still running")
        p.add_argument("--verbose", action="store_true", help="print every command that removes something")
        args = p.parse_args(argv[1:])
        preflight()
        removed, kept = down(args.all, _say if args.verbose else None)
        for left in removed:
            _say(f"removed {left.describe()}")
        for left in kept:
            _say(f"kept cluster {Names(left.owner_pid).tag} of running process {left.owner_pid} (--all removes it)")
        if not removed and not kept:
            _say("nothing to remove")
        return 0
    if argv[:1] == ["plan"]:
        options, command = _split_command(argv[1:])
        cluster = _describe_from(_parser("synth-reduce emulate plan", job=False).parse_args(options))
        print(plan_text(cluster))
        return 0
    options, command = _split_command(argv)
    args = _parser("synth-reduce emulate", job=True).parse_args(options)
    if not command:
        raise SynthError("give the command to run after '--', e.g. "
                         "synth-reduce emulate --topology testbed-2x4 -- synth-reduce bench --topology testbed-2x4 "
                         "--axes dp=8 (see 'synth-reduce emulate --help')")
    cluster = _describe_from(args)
    preflight()
    find_mpiexec()
    log = _say if args.verbose else None
    for line in describe_text(cluster).splitlines():
        _say(line)
    with cluster_up(cluster, log, _say):
        try:
            code, ended = launch(cluster, command, log), "the command exited with"
        except RanksLost as lost:
            _say(str(lost))
            code, ended = RANKS_LOST_EXIT, "the job lost ranks: exit code"
    _say(f"torn down cluster {cluster.tag}; {ended} {code}")
    return code


def run(argv: Sequence[str]) -> int:
    return emulate_main(list(argv))
