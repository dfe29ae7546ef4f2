"""Average per-device gradients with a plan's program inside ``jax.shard_map``.

    synth-reduce --topology testbed-2x4 --axes dp=8 --out plan.json
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python examples/jax_shard_map.py --plan plan.json

On CPU, XLA_FLAGS gives JAX as many (fake) devices as the plan has; on a real
machine the plan's devices are ``jax.devices()`` in id order. Every device
computes the gradient of a linear model on its own data; the plan's allreduce
sums them over the reduction groups; the result is compared with
``jax.lax.pmean`` over the same mesh axes.
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import synth
import synth.jax
from synth.runtime.meshes import mesh_layout
from synth.synthesis.language import format_program


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", required=True, help="a plan written by synth-reduce --out or tune")
    args = parser.parse_args()
    try:
        plan = synth.load_plan(args.plan)
        reduction = plan.find(goal="allreduce").reduction

        # the three lines: the plan's mesh (one sub-axis per level), its program, shard_map over every axis
        mesh = synth.jax.mesh(plan, hierarchical=True)
        reduce = synth.jax.reducer(plan, goal="allreduce")
        blocks = P(*mesh.axis_names)

        layout = mesh_layout(plan.placement, hierarchical=True)
        reduced = tuple(d.name for d in layout.dims if d.axis in reduction.axes)
        rng = np.random.default_rng(0)
        devices = plan.placement.topology.num_devices
        w = jnp.asarray(rng.normal(size=16), jnp.float32)
        x = rng.normal(size=(devices, 32, 16)).astype(np.float32)  # row d: device d's data
        y = rng.normal(size=(devices, 32)).astype(np.float32)

        def averaged(x, y, with_plan):  # one device's blocks: (1, ..., 1, 32, 16) and (1, ..., 1, 32)
            x, y = x.reshape(32, 16), y.reshape(32)
            g = jax.grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
            g = reduce(g) / reduction.k if with_plan else jax.lax.pmean(g, reduced)
            return g.reshape((1,) * len(mesh.axis_names) + g.shape)

        results = []
        for with_plan in (True, False):
            run = jax.jit(jax.shard_map(lambda x, y, p=with_plan: averaged(x, y, p), mesh=mesh,
                                        in_specs=(blocks, blocks), out_specs=blocks))
            results.append(np.asarray(run(x[layout.ids], y[layout.ids])))  # device d's rows at its mesh place
        difference = float(np.abs(results[0] - results[1]).max())
        program = plan.find(goal="allreduce").programs[0].program
        same = np.allclose(results[0], results[1], rtol=1e-5, atol=1e-6)  # float32 sums in another order
        print(f"{reduction.describe()} on mesh axes {mesh.axis_names}: {format_program(program, ' ; ')}; "
              f"max |plan - pmean| = {difference:.2e} ({'equal' if same else 'DIFFERENT'} within float32 rounding)")
        return 0 if same else 1
    except synth.SynthError as exc:
        print(f"jax_shard_map.py: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
