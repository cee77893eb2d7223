"""Device mesh, logical-axis sharding rules, and host-local to global batches.

One code path for one device, one host with many devices, and many hosts: the
train step is `jax.jit` with explicit in/out shardings over a `Mesh` with axes
("data", "model"). Parameters carry logical axis names (set by the modules via
`nn.with_logical_partitioning`); `LOGICAL_AXIS_RULES` maps "heads" (and the
MLP hidden axis) onto "model" for tensor parallelism and replicates the rest.
The batch is split over "data"; each host contributes only its own rows.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import jax
import numpy as np
from flax import linen as nn
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from primal_jax.errors import ConfigError

MESH_AXES = ("data", "model")
# Logical names used by primal_jax modules -> mesh axes. Names absent here
# (embed, kv, rank, vocab, classes, ...) are replicated.
LOGICAL_AXIS_RULES: tuple[tuple[str, str | None], ...] = (
  ("heads", "model"),
  ("mlp", "model"),
  ("batch", "data"),
)


# What a mesh that needs more devices than one CPU has should say: XLA makes N CPU devices when asked
# before JAX starts, which is how every multi-device path here is tested.
MORE_CPU_DEVICES = "on CPU, start with XLA_FLAGS=--xla_force_host_platform_device_count=N to get N devices"


def resolve_mesh_shape(mesh_shape: Sequence[int], num_devices: int, hint: str = "") -> tuple[int, ...]:
  """Fill one -1 entry so the product is `num_devices`, e.g. (-1, 2) on 8 devices -> (4, 2).

  A shape the devices cannot take is a `ConfigError` naming `mesh_shape`, followed by `hint` (`make_mesh`
  passes how to get more CPU devices when the devices are CPUs).
  """
  shape = tuple(int(d) for d in mesh_shape)
  hint = f"; {hint}" if hint else ""
  if len(shape) != len(MESH_AXES):
    raise ConfigError(f"mesh_shape must have {len(MESH_AXES)} entries {MESH_AXES}, got {list(mesh_shape)}")
  if shape.count(-1) > 1 or any(d == 0 or d < -1 for d in shape):
    raise ConfigError(f"mesh_shape entries must be positive with at most one -1, got {list(mesh_shape)}")
  known = math.prod(d for d in shape if d != -1)
  if -1 in shape:
    if num_devices % known:
      raise ConfigError(f"mesh_shape {list(mesh_shape)} does not divide the {num_devices} devices{hint}")
    shape = tuple(num_devices // known if d == -1 else d for d in shape)
  if math.prod(shape) != num_devices:
    raise ConfigError(f"mesh_shape {list(shape)} needs {math.prod(shape)} devices, {num_devices} are available{hint}")
  return shape


def make_mesh(mesh_shape: Sequence[int] = (-1, 1), devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A ("data", "model") mesh with Auto axes (what Linen logical partitioning expects)."""
  devices = list(jax.devices() if devices is None else devices)
  on_cpu = all(device.platform == "cpu" for device in devices)
  shape = resolve_mesh_shape(mesh_shape, len(devices), MORE_CPU_DEVICES if on_cpu else "")
  return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices)


def tree_shardings(boxed_abstract_tree, mesh: Mesh, rules=LOGICAL_AXIS_RULES):
  """NamedShardings for a tree whose leaves may be `nn.Partitioned` boxes (replicated if not)."""
  specs = nn.get_partition_spec(boxed_abstract_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, rules)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) axis split over "data", everything else replicated."""
  return NamedSharding(mesh, PartitionSpec("data"))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def global_batch(local_batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Assemble each host's rows into global arrays sharded over "data".

  Every process passes its own [local_batch, ...] slice (rows
  process_index * b : (process_index + 1) * b of the global batch); the result
  has the global leading dimension.
  """
  sharding = batch_sharding(mesh)
  data_size = mesh.shape["data"]
  out = {}
  for name, value in local_batch.items():
    global_rows = value.shape[0] * jax.process_count()
    if global_rows % data_size:
      raise ValueError(
        f"global batch size {global_rows} (batch['{name}']) must be divisible by the mesh's data axis ({data_size})"
      )
    out[name] = jax.make_array_from_process_local_data(sharding, value)
  return out


def maybe_initialize_distributed(mode: str = "auto") -> bool:
  """Start `jax.distributed` for multi-host runs.

  Args:
    mode: "off"; "on" (always: on TPU pods and SLURM/Kubernetes clusters JAX
      finds the coordinator itself); "auto" (only when the standard variables
      JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID are set,
      which also lets several processes share one machine).
  Returns:
    Whether `jax.distributed.initialize` was called.
  """
  if mode not in ("off", "on", "auto"):
    raise ValueError(f"distributed must be one of off|on|auto, got {mode!r}")
  env = os.environ
  explicit = all(k in env for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"))
  if mode == "off" or (mode == "auto" and not explicit):
    return False
  if jax.distributed.is_initialized():
    return False
  if "JAX_CPU_COLLECTIVES_IMPLEMENTATION" not in env:
    # Cross-process collectives on CPU need gloo (the default has none); GPU/TPU ignore this.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if explicit:
    jax.distributed.initialize(
      coordinator_address=env["JAX_COORDINATOR_ADDRESS"],
      num_processes=int(env["JAX_NUM_PROCESSES"]),
      process_id=int(env["JAX_PROCESS_ID"]),
    )
  else:
    jax.distributed.initialize()
  return True
