"""A plan's mesh as JAX takes it: the array of device ids with its axis names,
as ``jax.experimental.mesh_utils`` builds one (``Mesh(devices, axis_names)``
with ``devices = np.asarray(jax.devices())[device_ids]``; ids are
``jax.devices()`` positions, the plan's device ids).

Flat (one dimension per axis) or hierarchical (one sub-axis per level each axis
spans: ``dp_node``, ``dp_gpu``), as :func:`synth.runtime.meshes.mesh_layout`
lays it out; what :func:`synth.jax.mesh` builds from the same plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..plan import Plan
from ..runtime.meshes import mesh_layout


@dataclass(frozen=True)
class JaxMeshExport:
    axis_names: tuple[str, ...]
    shape: tuple[int, ...]
    device_ids: list  # nested lists of ints, of ``shape``

    def to_dict(self) -> dict[str, Any]:
        return {"format": "jax", "axis_names": list(self.axis_names), "shape": list(self.shape),
                "device_ids": self.device_ids}


def jax_export(plan: Plan, hierarchical: bool = False) -> JaxMeshExport:
    layout = mesh_layout(plan.placement, hierarchical)
    return JaxMeshExport(layout.names, layout.shape, layout.ids.tolist())


def jax_text(export: JaxMeshExport, plan_path: str) -> str:
    return (f"# JAX mesh of {plan_path}: axis_names {export.axis_names}, shape {export.shape}\n"
            "# mesh = Mesh(np.asarray(jax.devices())[np.array(device_ids)], axis_names)\n"
            f"axis_names = {export.axis_names!r}\n"
            f"device_ids = {export.device_ids!r}\n")
