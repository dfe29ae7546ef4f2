"""synth-reduce: placements and verified hierarchical reduction programs.

The pipeline, one module per concept:
topology -> placement -> language -> semantics -> search -> lowering
-> execute (numpy reference) / prove (z3) -> plan -> cli.
"""

__version__ = "0.1.0"
