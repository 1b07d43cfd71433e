"""Packed runs: k runs of one ``ProgramShape`` trained as one program, stacked on a leading run axis.

The runs of one shape differ only in numbers (the seed's key, learning rates, schedule lengths: the
``hyperparameters`` the compiled step takes as an argument), so ``build_packed`` vmaps the solo
train and eval steps of ``scaling.model.program`` over a leading axis of length k (the pack's ``size``) of
the state, the batch and those numbers. That axis lies on the ``runs`` axis of a
``mesh.make_packed_mesh`` mesh: with ``runs=R`` the devices form R groups, each training k/R whole runs
on its own data×fsdp×tensor mesh with no collectives between groups; with ``runs=1`` every run uses
every device. Nothing mixes the runs: a member's loss, gradient norm and finiteness are its own
(``member_metrics``), and a member whose step is not finite keeps its old state, as a solo run's
step does, while the others update.

A member is a solo run in every stored respect: ``member_state`` takes its slice of the packed state
as exactly the state a solo run of the shape has on the member's group of devices (same tree,
shapes, dtypes and shardings; ``member_abstract_state``), so it checkpoints, restores and resumes
alone, and ``stack_states`` packs solo states (restored anywhere) into any position of any pack.
Both move only each device's own shards (no collective, no host copy).

How the runs are batched (``BATCHINGS``): ``vmap`` turns each operation of the step into one over
all k runs (batched matrix products: the way to fill a TPU or GPU); ``map`` loops over the runs
inside the one compiled step (``jax.lax.map``), each iteration the solo step on one run's slice. On
a CPU the vmapped step is slower than the runs one after another (``benchmarks/packed_throughput.py``,
``--parts``): its matrix products alone are as fast batched as one by one, and its optimizer is
faster, but its forward and backward pass are slower (L2-d64, 6 runs: 0.4-0.6× the runs' speed
alone). There every activation is k times larger: attention's vmapped core, softmax and norms slow
down most (to ~0.3× alone, measured part by part; our reading: their working set outgrows a core's
2 MiB cache), and XLA adds transposes and copies to
bring the batched products to its matrix kernels' layouts (d64, k=6: 80 transposes and 169 copies
against the solo step's 40 and 119). ``map`` keeps a solo run's working set and is the default on
CPU. ``map`` needs the runs axis to be 1.

Numerically a member follows its solo run to float32 rounding, not bitwise: XLA fuses, blocks and
sums the batched (or looped) step in another order than the solo step (``tests/test_packed.py``
states the tolerance).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from scaling.config import TrainConfig
from scaling.model import mesh as mesh_lib
from scaling.model.program import (Program, ProgramShape, build_shape, eval_step_function, initial_state_function,
                             train_step_function, batch_spec as program_batch_spec)

RUNS = mesh_lib.RUNS_AXIS
BATCHINGS = ("vmap", "map")


@dataclasses.dataclass(frozen=True)
class PackedProgram:
    """Everything compiled for ``size`` runs of one ``ProgramShape`` on one packed mesh."""

    solo: Program  # one run's program on group 0's devices: the model, the shape, a member's state layout
    mesh: Mesh  # axes (runs, data, fsdp, tensor)
    size: int  # runs in the pack (k); a multiple of the mesh's runs axis
    batching: str  # one of BATCHINGS: how the step goes over the runs
    state_shardings: dict  # the solo state's shardings with the run axis first, on ``runs``
    abstract_state: dict  # ShapeDtypeStructs [k, ...] carrying their shardings
    abstract_hparams: dict  # the same for the stacked hyperparameters
    batch_sharding: NamedSharding  # of a training batch [k, B, T]: runs on ``runs``, rows over data×fsdp
    init: Callable  # keys [k, 2] -> state
    train_step: Callable  # (state, batch [k, B, T], hparams [k]) -> (state, metrics, each [k])
    eval_step: Callable  # (params, batch [B, T], rng) -> (loss_sum, tokens, correct), each [k]; one batch for all

    @property
    def per_group(self) -> int:
        """Runs trained by each group of devices (size / the mesh's runs axis)."""
        return self.size // self.mesh.shape[RUNS]

    def group_of(self, member: int) -> int:
        """The group of devices (index along the mesh's runs axis) that trains run ``member``."""
        if not 0 <= member < self.size:
            raise ValueError(f"member={member} is invalid: allowed 0 to {self.size - 1}")
        return member // self.per_group

    def member_mesh(self, member: int) -> Mesh:
        """The (data, fsdp, tensor) mesh of the devices that train run ``member``."""
        return mesh_lib.group_mesh(self.mesh, self.group_of(member))


def pack_shape(configs: list[TrainConfig], **program_arguments) -> ProgramShape:
    """The one ``ProgramShape`` of ``configs`` (keywords as for ``program.build``); ValueError naming the
    first config whose compiled program differs (its model, optimizer structure, batch or mesh rules)."""
    if not configs:
        raise ValueError("configs is empty: a pack needs at least one run")
    shapes = [ProgramShape.of(config, **program_arguments) for config in configs]
    for index, shape in enumerate(shapes[1:], start=1):
        if shape != shapes[0]:
            fields = [f.name for f in dataclasses.fields(ProgramShape)
                      if getattr(shape, f.name) != getattr(shapes[0], f.name)]
            raise ValueError(f"configs[{index}] ({configs[index].name}) cannot share a pack with configs[0] "
                             f"({configs[0].name}): their programs differ in {', '.join(fields)}")
    return shapes[0]


def default_batching(mesh: Mesh) -> str:
    """``map`` on CPU meshes whose runs axis is 1 (see the module docstring), else ``vmap``."""
    cpu = mesh.devices.flat[0].platform == "cpu"
    return "map" if cpu and mesh.shape[RUNS] == 1 else "vmap"


def build_packed(shape: ProgramShape, mesh: Mesh, size: int, batching: str | None = None) -> PackedProgram:
    """The packed program of ``size`` runs of ``shape`` on ``mesh`` (from ``mesh.make_packed_mesh``);
    ``batching`` is one of ``BATCHINGS`` (default: ``default_batching(mesh)``).

    Raises ValueError naming ``size`` unless the mesh's runs axis divides it, ``batching`` if it is
    unknown or ``map`` with a runs axis above 1, or ``batch_size`` if a group's data×fsdp does not
    divide the batch. Built once per process for each (shape, mesh, size, batching).
    """
    if RUNS not in mesh.shape:
        raise ValueError(f"mesh axes {tuple(mesh.shape)} have no {RUNS!r} axis: make it with "
                         "scaling.model.mesh.make_packed_mesh")
    if size < 1 or size % mesh.shape[RUNS]:
        raise ValueError(f"size={size} is invalid: allowed a positive multiple of the mesh's runs axis "
                         f"({mesh.shape[RUNS]})")
    batching = default_batching(mesh) if batching is None else batching
    if batching not in BATCHINGS or (batching == "map" and mesh.shape[RUNS] > 1):
        raise ValueError(f"batching={batching!r} is invalid: allowed {BATCHINGS}, and 'map' only with a runs "
                         f"axis of 1 (this mesh's is {mesh.shape[RUNS]})")
    mesh_lib.check_batch(mesh, shape.batch_size, process_count=1, microbatches=shape.microbatches)
    return _build_packed(shape, mesh, size, batching)


def batch_spec(config: TrainConfig, packed: PackedProgram) -> dict:
    """ShapeDtypeStructs of one stacked training batch [k, B, T] of ``config``'s runs (for ahead-of-time
    compilation): a solo run's (``program.batch_spec``) with the run axis first."""
    return {key: jax.ShapeDtypeStruct((packed.size,) + leaf.shape, leaf.dtype, sharding=packed.batch_sharding)
            for key, leaf in program_batch_spec(config, packed.solo.mesh).items()}


@functools.lru_cache(maxsize=4)
def _build_packed(shape: ProgramShape, mesh: Mesh, size: int, batching: str) -> PackedProgram:
    solo = build_shape(shape, mesh_lib.group_mesh(mesh, 0))
    state_shardings = jax.tree_util.tree_map(lambda sharding: _stacked(sharding, mesh), solo.state_shardings)
    abstract_state = jax.tree_util.tree_map(
        lambda leaf, sharding: jax.ShapeDtypeStruct((size,) + leaf.shape, leaf.dtype, sharding=sharding),
        solo.abstract_state, state_shardings)
    per_run = NamedSharding(mesh, PartitionSpec(RUNS))  # hyperparameters and metrics: [k] (or [k, 2] keys)
    abstract_hparams = jax.tree_util.tree_map(
        lambda leaf: jax.ShapeDtypeStruct((size,) + leaf.shape, leaf.dtype, sharding=per_run), solo.abstract_hparams)
    stacked_batch = NamedSharding(mesh, PartitionSpec(RUNS, ("data", "fsdp")))
    shared_batch = mesh_lib.batch_sharding(mesh)  # one batch for every run: rows over data×fsdp in each group

    def over_runs(step, shared=()):
        """``step`` over the leading run axis of every argument but those numbered in ``shared``."""
        if batching == "vmap":
            # spmd_axis_name puts the run axis of the model's activation constraints on ``runs`` too.
            mapped = jax.vmap(step, in_axes=tuple(None if i in shared else 0 for i in range(3)),
                              spmd_axis_name=RUNS)
        else:
            def mapped(*args):
                same = {i: args[i] for i in shared}
                each = tuple(arg for i, arg in enumerate(args) if i not in shared)

                def one(sliced):
                    sliced = iter(sliced)
                    return step(*(same[i] if i in shared else next(sliced) for i in range(len(args))))
                return jax.lax.map(one, each)

        @functools.wraps(step)
        def traced(*args):
            with mesh_lib.activation_sharding(mesh, shape.rules):
                return mapped(*args)
        return traced

    # The initial state is the solo run's (the same random bits) in either batching; mapped, it compiles as
    # quickly as the solo init (a CPU sweep's start-up), vmapped as one batched program.
    boxed_state = initial_state_function(shape, solo.model)
    initialize = lambda rng: nn.unbox(boxed_state(rng))  # noqa: E731
    batched_init = (jax.vmap(initialize, spmd_axis_name=RUNS) if batching == "vmap"
                    else functools.partial(jax.lax.map, initialize))
    init = jax.jit(batched_init, in_shardings=per_run, out_shardings=state_shardings)
    train_step = jax.jit(over_runs(train_step_function(shape, solo.model)), donate_argnums=0,
                         in_shardings=(state_shardings, stacked_batch, per_run),
                         out_shardings=(state_shardings, per_run))
    eval_step = jax.jit(over_runs(eval_step_function(shape, solo.model), shared=(1, 2)),
                        in_shardings=(state_shardings["params"], shared_batch, mesh_lib.replicated(mesh)),
                        out_shardings=(per_run, per_run, per_run))
    return PackedProgram(solo, mesh, size, batching, state_shardings, abstract_state, abstract_hparams,
                         stacked_batch, init, train_step, eval_step)


def _stacked(sharding, mesh: Mesh):
    """A solo leaf's sharding with a leading run axis on ``runs`` (optax's empty MaskedNodes pass through)."""
    if not isinstance(sharding, NamedSharding):
        return sharding
    return NamedSharding(mesh, PartitionSpec(RUNS, *sharding.spec))


# ---------------------------------------------------------------------------
# Inputs: keys, hyperparameters and batches stacked on the run axis


def stack_keys(seeds: list[int]) -> np.ndarray:
    """[k, 2] uint32: ``jax.random.PRNGKey(seed)`` of each run, the keys ``PackedProgram.init`` takes."""
    return np.stack([np.asarray(jax.random.PRNGKey(seed)) for seed in seeds])


def stack_hyperparameters(hparams: list[dict]) -> dict[str, np.ndarray]:
    """One dict of [k, ...] arrays from k runs' ``program.hyperparameters(config)``."""
    return {name: np.stack([np.asarray(run[name]) for run in hparams]) for name in hparams[0]}


def global_batch(local_batches: list[dict], packed: PackedProgram, batch_size: int) -> dict:
    """One training batch per run (this process's rows, numpy, as ``Pipeline.train_batch`` gives them),
    stacked to [k, batch_size, ...] global arrays: runs on ``runs``, rows over data × fsdp."""
    if len(local_batches) != packed.size:
        raise ValueError(f"{len(local_batches)} batches for a pack of {packed.size} runs")
    stacked = {key: np.stack([batch[key] for batch in local_batches]) for key in local_batches[0]}
    return {key: jax.make_array_from_process_local_data(packed.batch_sharding, value,
                                                        (packed.size, batch_size) + value.shape[2:])
            for key, value in stacked.items()}


# ---------------------------------------------------------------------------
# Members: a run's slice of the packed state, and its metrics


def member_shardings(packed: PackedProgram, member: int):
    """The shardings of a solo run's state on the devices that train run ``member``."""
    group = packed.member_mesh(member)
    return jax.tree_util.tree_map(
        lambda sharding: NamedSharding(group, PartitionSpec(*sharding.spec[1:]))
        if isinstance(sharding, NamedSharding) else sharding, packed.state_shardings)


def member_abstract_state(packed: PackedProgram, member: int) -> dict:
    """ShapeDtypeStructs of run ``member``'s state: the solo run's, on the member's devices (for restoring
    its checkpoint straight into place)."""
    return jax.tree_util.tree_map(
        lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
        packed.solo.abstract_state, member_shardings(packed, member))


def member_state(packed: PackedProgram, state: dict, member: int) -> dict:
    """Run ``member``'s slice of the packed ``state``: a solo run's state (``member_abstract_state``),
    made from the shards its devices already hold."""
    group_devices = set(packed.member_mesh(member).devices.flat)
    position = member % packed.per_group  # its index within each device's [per_group, ...] shard

    def one(array, sharding):
        pieces = [shard.data[position] for shard in array.addressable_shards if shard.device in group_devices]
        return jax.make_array_from_single_device_arrays(array.shape[1:], sharding, pieces)

    return jax.tree_util.tree_map(one, state, member_shardings(packed, member))


def stack_states(packed: PackedProgram, states: list[dict]) -> dict:
    """The packed state of ``states`` (solo runs' states, in member order), each first moved onto its
    member's devices if it is elsewhere (e.g. restored on another mesh)."""
    if len(states) != packed.size:
        raise ValueError(f"{len(states)} states for a pack of {packed.size} runs")
    placed = [jax.device_put(state, member_shardings(packed, member)) for member, state in enumerate(states)]
    group_of_device = {device: group for group in range(packed.mesh.shape[RUNS])
                       for device in packed.mesh.devices[group].flat}

    def one(sharding, *members):
        on_device = [{shard.device: shard.data for shard in array.addressable_shards} for array in members]
        pieces = []
        for device in sharding.addressable_devices:
            first = group_of_device[device] * packed.per_group
            pieces.append(jnp.stack([on_device[first + j][device] for j in range(packed.per_group)]))
        return jax.make_array_from_single_device_arrays((packed.size,) + members[0].shape, sharding, pieces)

    return jax.tree_util.tree_map(one, packed.state_shardings, *placed)


def member_metrics(metrics: dict) -> list[dict]:
    """The packed step's metrics (each [k]) as one dict of Python numbers per run: ``loss`` (nats per
    predicted token), ``grad_norm``, ``finite`` (False: the run's step was not applied, it diverged),
    ``predicted_tokens``, ``lr``."""
    host = jax.device_get(metrics)
    size = len(next(iter(host.values())))
    return [{name: values[member].item() for name, values in host.items()} for member in range(size)]
