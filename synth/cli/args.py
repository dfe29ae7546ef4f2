"""Argument groups shared by the commands, and the parser class they use."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..cost import ALGORITHMS, Model
from ..cost.nccl_rules import NCCL_VERSION, RULES
from ..errors import SynthError
from ..synthesis.alltoall import ALLTOALL
from ..synthesis.problem import MAX_STEPS_DEFAULT, ProblemSpec
from ..synthesis.semantics import Goal
from ..synthesis.sparse import SPARSE_ALLREDUCE
from ..topology import Topology, load_topology, parse_scale


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are SynthErrors (one line, exit 2)."""

    def error(self, message: str) -> None:  # one line, exit 2, like SynthError
        raise SynthError(f"{message} (see '{self.prog} --help')")


def add_problem_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", required=True, help="topology YAML file, or a shipped name (e.g. dgx-a100)")
    p.add_argument("--axes", required=True, help="parallelism axes with sizes, e.g. dp=16,mp=8")
    p.add_argument("--reduce", help="reduction axes, e.g. dp or dp,mp (default: the first axis)")
    p.add_argument(
        "--collective",
        choices=[g.value for g in Goal] + [SPARSE_ALLREDUCE, ALLTOALL],
        help="the collective to implement over the --reduce axes (default: allreduce; sparse-allreduce with "
             "--density; alltoall: the main command only)",
    )
    p.add_argument("--density", metavar="D",
                   help="fraction of non-zeros per rank of a sparse gradient, in (0, 1] (implies --collective "
                        "sparse-allreduce)")
    p.add_argument("--encoding", choices=("coo", "bitmap", "auto"), default="coo",
                   help="sparse-allreduce: how indices travel: coo (4-byte index per entry; nothing to scan on "
                        "receipt), bitmap (Zen's hash bitmap per partition: fewer bytes once merged sets are dense, "
                        "a scan of the partition's slots to decode), auto (fewest bytes); all fall back to dense "
                        "when smaller (default: coo)")
    p.add_argument(
        "--constrain",
        action="append",
        default=[],
        metavar="AXIS@LEVEL{=,>=,<=}N",
        help="constrain a matrix entry, e.g. mp@node=1 (mp stays inside a node); repeatable",
    )
    add_scale_argument(p)
    p.add_argument("--max-steps", type=int, default=MAX_STEPS_DEFAULT,
                   help=f"longest program to search (default: {MAX_STEPS_DEFAULT})")


def add_scale_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scale", action="append", default=[], metavar="LEVEL=COUNT",
                   help="override level counts, e.g. node=2 or node=2,gpu=4; repeatable, applied in order")


def scaled_topology(args: argparse.Namespace) -> Topology:
    """``--topology`` with every ``--scale`` applied, in order."""
    topology = load_topology(args.topology)
    for item in args.scale:
        topology = topology.scaled(parse_scale(item))
    return topology


def sparse_density(args: argparse.Namespace) -> float | None:
    """The density of a sparse all-reduce the arguments ask for, or None for a
    dense goal; SynthError when --density and --collective disagree."""
    density = getattr(args, "density", None)
    collective = args.collective
    if density is None:
        if collective == SPARSE_ALLREDUCE:
            raise SynthError("--collective sparse-allreduce needs --density D, the fraction of non-zeros per rank, "
                             "e.g. --density 0.01")
        return None
    if collective not in (None, SPARSE_ALLREDUCE):
        raise SynthError(f"--density applies to sparse-allreduce, not --collective {collective}; drop one of them")
    try:
        value = float(density)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 1:
        raise SynthError(f"--density {density}: outside (0, 1]; give the fraction of non-zeros per rank, e.g. 0.01")
    return value


def problem_spec(args: argparse.Namespace, alltoall: bool = False) -> ProblemSpec:
    """The problem the arguments of :func:`add_problem_arguments` describe (a
    sparse all-reduce searches the dense all-reduce programs it lowers). An
    all-to-all (``--collective alltoall``) is the main command's only
    (``alltoall``: its caller; the problem's axes are the all-to-all's)."""
    if args.collective == ALLTOALL and not alltoall:
        raise SynthError("--collective alltoall: this command runs reductions; list and price all-to-all programs "
                         "with the main command (synth-reduce --topology T --axes ep=64 --collective alltoall)")
    sparse = sparse_density(args) is not None
    return ProblemSpec(
        topology=args.topology,
        axes=args.axes,
        reduce=args.reduce,
        goal="allreduce" if sparse or alltoall else args.collective,
        constraints=tuple(args.constrain),
        scale=tuple(args.scale),
        max_steps=args.max_steps,
    )


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--algo", default="nccl", choices=ALGORITHMS,
                   help="collective library to model: nccl (NCCL's own choice of algorithm and protocol), an "
                        "algorithm forced like NCCL_ALGO (ring, tree, nvls, nvlstree, pat), or mpi (the CPU "
                        "testbed's OpenMPI) (default: nccl)")
    p.add_argument("--profile", metavar="PROFILE.json",
                   help="fitted parameters (synth-reduce fit), or 'prior' for the topology's numbers and NCCL's own "
                        "constants; default: the shipped calibration (fitted on the public NCCL corpus)")
    p.add_argument("--nccl-version", metavar="X.Y.Z", default=NCCL_VERSION,
                   help=f"NCCL release whose tuning rules choose the algorithm and protocol ({', '.join(RULES)} "
                        f"transcribed; another version uses the newest of these not newer than it) "
                        f"(default: {NCCL_VERSION})")


def model_of(args: argparse.Namespace) -> Model:
    return Model.load(args.algo, args.profile, args.nccl_version)


def compute_profile_argument(text: str) -> Any:
    """``--compute-profile``: a compute profile file, or a shipped profile by
    its name (``h100-sxm5-80gb``, as ``compute --device`` takes it) or by its
    shipped path (``profiles/h100-sxm5-80gb.compute.json``, found wherever the
    command runs). A path that exists is always that file."""
    from ..planner.compute import load_compute_profile, shipped_operation_profiles
    from ..resources import profiles_dir

    if Path(text).exists():
        return load_compute_profile(text)
    name = Path(text).name.removesuffix(".compute.json")
    for profile in shipped_operation_profiles():
        if name.casefold() == profile.name.casefold():
            return profile
    shipped = profiles_dir() / Path(text).name
    if Path(text).parent.name == "profiles" and shipped.exists():
        return load_compute_profile(shipped)
    return load_compute_profile(text)  # the file's own error (no such file ...)
