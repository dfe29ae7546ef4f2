"""The commands of ``synth-reduce`` besides the main one: which module runs
each, and the line ``synth-reduce --help`` shows for it. Data only, so that the
package (which dispatches) and the main command (whose help lists them) share
it without importing each other."""

from __future__ import annotations

# command -> (module, function); modules are imported on use, so the main
# command never loads the runtime's backends or the testbed
COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("plan", "run"),
    "compute": ("compute", "run"),
    "calibrate": ("calibrate", "run"),
    "fit": ("fit", "run_fit"),
    "validate": ("fit", "run_validate"),
    "verify": ("verify", "run"),
    "check": ("check", "run"),
    "bench": ("bench", "run_bench"),
    "tune": ("bench", "run_tune"),
    "emulate": ("emulate", "run"),
    "export": ("export", "run"),
    "launch": ("launch", "run"),
    "draw": ("draw", "run"),
}

# command -> what it does, one line for 'synth-reduce --help' (a test checks
# that every command of COMMANDS has one)
SUMMARIES: dict[str, str] = {
    "plan": "plan a training job: tp/dp/pp sizes, placement and programs of the fastest step that fits",
    "verify": "re-prove a plan file (numpy reference and z3)",
    "check": "check a hand-written program on one placement (--matrix) or on each",
    "compute": "one layer's forward and backward time on one device, operation by operation",
    "calibrate": "measure this GPU's operations with PyTorch and fit a per-operation compute profile",
    "fit": "learn the cost model's parameters from measurements",
    "validate": "score the cost model's accuracy on measurements",
    "bench": "time a plan's or the predicted best programs against the default (under mpiexec)",
    "tune": "time the predicted best programs and write the plan of the measured winner (under mpiexec)",
    "emulate": "run a command on an emulated cluster of network namespaces on this machine (root)",
    "export": "write what trainers take from a plan: rank map, Megatron-LM arguments, torchtitan settings, JAX mesh",
    "launch": "run a training script under torchrun with its rank renumbered to the plan's (rank map)",
    "draw": "draw a plan: each axis' groups on the hierarchy, its programs as steps on sub-groups (SVG, PNG)",
}


def commands_text() -> str:
    """The commands, one per line with its summary (for the main command's help)."""
    width = max(len(name) for name in COMMANDS)
    return "\n".join(f"  {name:<{width}}  {SUMMARIES.get(name, '')}".rstrip() for name in COMMANDS)
