"""Device meshes, logical-to-mesh sharding, and multi-host start-up.

The mesh has three named axes:
- ``data``: pure data parallelism (parameters replicated);
- ``fsdp``: data parallelism whose parameters and optimizer state are also
  sharded (ZeRO-3 style), so a large model never sits whole on one device;
- ``tensor``: Megatron-style splitting of heads, feed-forward and vocabulary.
The global batch is split over ``data`` × ``fsdp``.
Packed runs (``scaling.model.packed``) add a leading ``runs`` axis (``make_packed_mesh``): each group of
devices along it trains whole runs of one shape on its own data × fsdp × tensor mesh.

Parameters carry logical axis names (see ``scaling.model.transformer``). ``MeshConfig.rules``
maps each name to mesh axes. A dimension that a mesh axis does not divide
evenly is replicated instead, so odd vocabularies or tiny widths still run.
Activations are named the same way (``constrain``, inside
``activation_sharding``) and go through the same rules, so under fsdp a
block's activations stay split over the batch while its weights are gathered,
rather than the other way round.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from scaling.config import MeshConfig

AXES = ("data", "fsdp", "tensor")


def initialize_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None, *, auto: bool = False) -> None:
    """Start multi-process JAX as the caller decided; idempotent.

    With ``coordinator_address`` (host:port), ``num_processes`` and
    ``process_id`` they go to ``jax.distributed.initialize`` (gloo carries the
    collectives when the platform is the CPU). With ``auto=True`` JAX finds
    the cluster itself (SLURM, TPU). With neither, nothing happens: whether a
    process belongs to a multi-host job is decided by the caller (the sweep
    launcher's ``sweeps.hosts``), never guessed here.
    """
    if jax.distributed.is_initialized():
        return
    if coordinator_address is not None:
        if os.environ.get("JAX_PLATFORMS", "") in ("", "cpu"):
            # Cross-process collectives on CPU need gloo.
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                                   process_id=process_id)
    elif auto:
        jax.distributed.initialize()


def mesh_shape(config: MeshConfig, device_count: int) -> dict[str, int]:
    """Resolve -1 axes against ``device_count``; raise ValueError naming the bad field."""
    sizes = {"data": config.data, "fsdp": config.fsdp, "tensor": config.tensor}
    fixed = math.prod(size for size in sizes.values() if size != -1)
    for name, size in sizes.items():
        if size == -1:
            if device_count % fixed:
                raise ValueError(f"mesh.{name}=-1 cannot be resolved: the other axes ({fixed} devices) do not "
                                 f"divide the {device_count} available devices")
            sizes[name] = device_count // fixed
    if math.prod(sizes.values()) != device_count:
        raise ValueError(f"mesh data×fsdp×tensor = {sizes['data']}×{sizes['fsdp']}×{sizes['tensor']} = "
                         f"{math.prod(sizes.values())} must equal the {device_count} devices; set one axis "
                         f"(e.g. mesh.data) to -1 to use all the rest")
    return sizes


def make_mesh(config: MeshConfig, devices=None) -> Mesh:
    """A ``Mesh`` with axes (data, fsdp, tensor) over ``devices`` (default: all devices of all hosts)."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = mesh_shape(config, len(devices))
    shape = tuple(sizes[axis] for axis in AXES)
    if devices[0].platform == "cpu":  # CPU devices have no physical topology to respect
        return Mesh(np.asarray(devices).reshape(shape), AXES)
    from jax.experimental import mesh_utils

    try:
        grid = mesh_utils.create_device_mesh(shape, devices=devices, allow_split_physical_axes=True)
    except Exception as error:  # noqa: BLE001 - a plain reshape would silently give a slow device order
        kinds = sorted({getattr(d, "device_kind", d.platform) for d in devices})
        reason = (str(error).strip().splitlines() or [""])[0][:160]
        raise ValueError(f"mesh data×fsdp×tensor = {'×'.join(map(str, shape))} cannot be laid out on the "
                         f"{len(devices)} {'/'.join(kinds)} devices of this topology "
                         f"({type(error).__name__}: {reason}); choose mesh sizes that fit the slice, "
                         "e.g. mesh.data=-1") from None
    return Mesh(grid, AXES)


RUNS_AXIS = "runs"


def make_packed_mesh(config: MeshConfig, runs: int, devices=None) -> Mesh:
    """A ``Mesh`` with axes (runs, data, fsdp, tensor) over ``devices`` (default: all devices of all hosts).

    The devices split into ``runs`` groups; each group has ``config``'s data×fsdp×tensor mesh over its
    len(devices)/runs devices (-1 axes resolve against the group). Packed runs place their run axis on
    ``runs``, so a group trains whole runs with no collectives across groups; ``runs=1`` gives every
    run every device. Raises ValueError naming ``runs`` if it does not divide the devices.
    """
    devices = list(jax.devices() if devices is None else devices)
    if runs < 1 or len(devices) % runs:
        raise ValueError(f"runs={runs} is invalid: allowed a divisor of the {len(devices)} devices")
    sizes = mesh_shape(config, len(devices) // runs)
    shape = (runs,) + tuple(sizes[axis] for axis in AXES)
    if devices[0].platform == "cpu":
        return Mesh(np.asarray(devices).reshape(shape), (RUNS_AXIS,) + AXES)
    from jax.experimental import mesh_utils

    try:
        grid = mesh_utils.create_device_mesh(shape, devices=devices, allow_split_physical_axes=True)
    except Exception as error:  # noqa: BLE001 - as in make_mesh: a plain reshape would give a slow device order
        reason = (str(error).strip().splitlines() or [""])[0][:160]
        raise ValueError(f"mesh runs×data×fsdp×tensor = {'×'.join(map(str, shape))} cannot be laid out on the "
                         f"{len(devices)} devices of this topology ({type(error).__name__}: {reason}); choose "
                         "sizes that fit the slice") from None
    return Mesh(grid, (RUNS_AXIS,) + AXES)


def group_mesh(packed_mesh: Mesh, group: int) -> Mesh:
    """The (data, fsdp, tensor) mesh of one group of a ``make_packed_mesh`` mesh: the devices that train
    that group's runs, laid out as a solo run of the same ``MeshConfig`` on them would be."""
    return Mesh(packed_mesh.devices[group], AXES)


def batch_axes_size(mesh: Mesh) -> int:
    """How many ways the global batch is split (data × fsdp)."""
    return mesh.shape["data"] * mesh.shape["fsdp"]


def check_batch(mesh: Mesh, batch_size: int, process_count: int | None = None, microbatches: int = 1) -> None:
    """Fail early, naming ``batch_size`` (or ``microbatches``), if the batch does not divide over the batch
    axes and hosts, or one shard's rows do not divide into ``microbatches``."""
    ways = batch_axes_size(mesh)
    if batch_size % ways:
        raise ValueError(f"batch_size={batch_size} is invalid: allowed a multiple of mesh data×fsdp = {ways}")
    rows = batch_size // ways
    if rows % microbatches:
        raise ValueError(f"microbatches={microbatches} is invalid: allowed a divisor of the {rows} rows each "
                         f"data×fsdp shard holds (batch_size={batch_size} over {ways} shards)")
    process_count = jax.process_count() if process_count is None else process_count
    if batch_size % process_count:
        raise ValueError(f"batch_size={batch_size} is invalid: allowed a multiple of the {process_count} processes")


def _mesh_axes_for(name, rules: dict):
    target = rules.get(name) if name is not None else None
    if target is None:
        return ()
    return (target,) if isinstance(target, str) else tuple(target)


def logical_to_spec(logical_axes, shape, mesh: Mesh, rules) -> PartitionSpec:
    """Map one array's logical axis names to a mesh ``PartitionSpec``.

    A mesh axis is used at most once per array, size-1 mesh axes are dropped,
    and a dimension the chosen mesh axes do not divide is left replicated.
    """
    rules = dict(rules)
    used, spec = set(), []
    for name, size in zip(tuple(logical_axes) + (None,) * (len(shape) - len(logical_axes)), shape):
        axes = tuple(a for a in _mesh_axes_for(name, rules) if a not in used and mesh.shape[a] > 1)
        if axes and size % math.prod(mesh.shape[a] for a in axes) == 0:
            used.update(axes)
            spec.append(axes[0] if len(axes) == 1 else axes)
        else:
            spec.append(None)
    return PartitionSpec(*spec)


def tree_shardings(logical_specs, abstract_tree, mesh: Mesh, rules):
    """NamedShardings for every leaf of ``abstract_tree`` from a matching tree of logical PartitionSpecs."""

    def one(spec, leaf):
        if not hasattr(leaf, "shape"):  # optax.MaskedNode (multi_transform, lr_rule='mup') holds no array
            return leaf
        axes = tuple(spec) if isinstance(spec, PartitionSpec) else ()
        return NamedSharding(mesh, logical_to_spec(axes, leaf.shape, mesh, rules))

    return jax.tree_util.tree_map(one, logical_specs, abstract_tree,
                                  is_leaf=lambda x: isinstance(x, PartitionSpec) or x is None)


_ACTIVATION_RULES: contextvars.ContextVar = contextvars.ContextVar("activation_rules", default=None)


@contextlib.contextmanager
def activation_sharding(mesh: Mesh, rules):
    """While tracing inside this context, ``constrain`` pins activations to ``mesh`` through ``rules``.

    Enter it inside the function being jitted (the constraints are recorded
    when the function is traced). Outside it ``constrain`` does nothing, so
    the model also runs unsharded (tests, ``model.init``).
    """
    token = _ACTIVATION_RULES.set((mesh, dict(rules)))
    try:
        yield
    finally:
        _ACTIVATION_RULES.reset(token)


def constrain(x: jax.Array, logical_axes) -> jax.Array:
    """Constrain one activation to the sharding its logical axis names map to (see ``activation_sharding``).

    The mapping is ``logical_to_spec``'s, the one the parameters use: a
    dimension its mesh axes do not divide stays whole. On a one-device mesh,
    or outside ``activation_sharding``, ``x`` is returned untouched.
    """
    active = _ACTIVATION_RULES.get()
    if active is None or active[0].devices.size == 1:
        return x
    mesh, rules = active
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, logical_to_spec(logical_axes, x.shape, mesh, rules)))


def active_mesh() -> Mesh | None:
    """The mesh of the enclosing ``activation_sharding`` (None outside it)."""
    active = _ACTIVATION_RULES.get()
    return None if active is None else active[0]


def activation_spec(logical_axes, shape) -> PartitionSpec:
    """The ``PartitionSpec`` ``constrain`` gives an activation of ``shape``
    (every dimension None outside ``activation_sharding``)."""
    active = _ACTIVATION_RULES.get()
    if active is None:
        return PartitionSpec(*([None] * len(shape)))
    return logical_to_spec(logical_axes, shape, active[0], active[1])


def activation_shards(logical_axis: str, size: int) -> int:
    """How many ways ``constrain`` splits a dimension of ``size`` named ``logical_axis`` (1 outside
    ``activation_sharding``): e.g. ``activation_shards("batch", rows)`` is how many devices share the rows."""
    active = _ACTIVATION_RULES.get()
    if active is None:
        return 1
    mesh, rules = active
    spec = logical_to_spec((logical_axis,), (size,), mesh, rules)[0]
    axes = () if spec is None else (spec,) if isinstance(spec, str) else tuple(spec)
    return math.prod(mesh.shape[axis] for axis in axes)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Sharding of a [batch, length] array: rows over data × fsdp."""
    return NamedSharding(mesh, PartitionSpec(("data", "fsdp")))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def global_batch(local_batch: dict, mesh: Mesh, global_batch_size: int) -> dict:
    """Assemble per-process numpy rows into global jax.Arrays sharded over the batch axes."""
    sharding = batch_sharding(mesh)
    return {key: jax.make_array_from_process_local_data(sharding, value, (global_batch_size,) + value.shape[1:])
            for key, value in local_batch.items()}
