"""The compiled program of k >= 1 runs of one shape, as the training loop and the preflight see it.

One interface (``RunProgram``) whatever the pack's size, so that there is one
training loop (``scaling.run.loop``) and one lowering (``lower_train_step``):

- a pack of one is the plain program of ``scaling.model.program`` (no run axis:
  its state is a solo run's, its step the un-mapped one, and it may span
  several processes, pod-wide);
- a pack of k > 1 is ``scaling.model.packed``'s program, the runs stacked on a
  leading axis (one process).

Either way a member's state (``member_state``) is exactly a solo run's, so a
run checkpoints, restores and resumes in a pack of any size. The numbers a
run hands its step (``program.hyperparameters``) are the only thing that
differs between the members; ``pack_key`` says which configs may share one.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

from scaling.config import TrainConfig
from scaling.model import mesh as mesh_lib, optim as optim_lib, packed as packed_lib, parametrization
from scaling.model import program as program_lib


def pack_key(config: TrainConfig):
    """What runs must share to train in one pack: ``config`` without the numbers a run hands its
    compiled step as arguments (seed, learning rates and schedule numbers; ``program.hyperparameters``)
    and without its name. Runs whose keys are equal have one program, one step count, one data source
    and one loop cadence (evaluation, checkpoints, logging); hashable."""
    return (dataclasses.replace(config, seed=0, name="", optim=optim_lib.without_numbers(config.optim)),
            parametrization.multipliers(config.optim, config.model))


@dataclasses.dataclass(frozen=True)
class RunProgram:
    """The program of ``size`` runs: ``solo`` alone (size 1), or ``packed`` (size k > 1)."""

    solo: program_lib.Program  # one run's program (for a pack: on group 0's devices)
    packed: packed_lib.PackedProgram | None = None

    @property
    def size(self) -> int:
        return 1 if self.packed is None else self.packed.size

    @property
    def mesh(self):
        return self.solo.mesh if self.packed is None else self.packed.mesh

    @property
    def train_step(self):
        """``(state, batch, hparams) -> (state, metrics)``: the jitted step of all members at once."""
        return self.solo.train_step if self.packed is None else self.packed.train_step

    @property
    def abstract_state(self):
        return self.solo.abstract_state if self.packed is None else self.packed.abstract_state

    def init(self, seeds: list[int]):
        """The fresh state of runs with ``seeds`` (one per member): each a solo run's initial state."""
        if self.packed is None:
            return self.solo.init(jax.random.PRNGKey(seeds[0]))
        return self.packed.init(packed_lib.stack_keys(seeds))

    def member_abstract_state(self, member: int):
        """ShapeDtypeStructs of run ``member``'s state (a solo run's, on its devices): what its checkpoint
        restores into."""
        if self.packed is None:
            return self.solo.abstract_state
        return packed_lib.member_abstract_state(self.packed, member)

    def member_state(self, state, member: int):
        """Run ``member``'s state: a solo run's state, from the shards its devices hold."""
        return state if self.packed is None else packed_lib.member_state(self.packed, state, member)

    def stack_states(self, states: list):
        """The program's state from its members' solo states (in member order)."""
        return states[0] if self.packed is None else packed_lib.stack_states(self.packed, states)

    def hyperparameters(self, configs: list[TrainConfig]):
        """The members' ``program.hyperparameters``, placed on the devices as the step takes them."""
        numbers = [program_lib.hyperparameters(config) for config in configs]
        if self.packed is None:
            return jax.device_put(numbers[0], mesh_lib.replicated(self.solo.mesh))
        return jax.device_put(packed_lib.stack_hyperparameters(numbers),
                              jax.tree_util.tree_map(lambda leaf: leaf.sharding, self.packed.abstract_hparams))

    def global_batch(self, local_batches: list[dict], batch_size: int) -> dict:
        """One training batch per member (this process's rows) as the step's global batch."""
        if self.packed is None:
            return mesh_lib.global_batch(local_batches[0], self.solo.mesh, batch_size)
        return packed_lib.global_batch(local_batches, self.packed, batch_size)

    def member_metrics(self, fetched: dict, member: int) -> dict:
        """One member's values (Python numbers) of the step's metrics, already fetched to the host."""
        if self.packed is None:
            return {name: np.asarray(value).item() for name, value in fetched.items()}
        return {name: np.asarray(values)[member].item() for name, values in fetched.items()}

    def member_steps(self, state) -> list[int]:
        """Each member's optimizer step count."""
        return [int(step) for step in np.atleast_1d(jax.device_get(state["step"]))]

    def evaluate(self, params, batches: list, batch_size: int) -> list[dict]:
        """Per member: ``loss`` (mean nats per predicted token) and ``accuracy`` over ``batches`` (the
        validation set every member shares): ``program.evaluate``."""
        if self.packed is None:
            return program_lib.evaluate(self.solo.eval_step, self.solo.mesh, params, batches, batch_size)
        return program_lib.evaluate(self.packed.eval_step, self.packed.mesh, params, batches, batch_size)


def build(configs: list[TrainConfig], devices=None, *, runs_axis: int | None = None,
          batching: str | None = None) -> RunProgram:
    """The program of ``configs`` (resolved; equal ``pack_key``) on ``devices`` (default: all). The mesh
    and batch are checked first, before anything compiles. One config: the plain program on the config's
    mesh. Several: ``packed.build_packed`` on a mesh whose ``runs`` axis is ``runs_axis`` (default: the
    largest divisor of the device count that divides the pack, so each device group trains whole runs);
    ``batching``: ``packed.BATCHINGS``."""
    config = configs[0]
    arguments = program_lib.arguments_of(config)
    if len(configs) == 1 and runs_axis in (None, 1) and batching is None:
        mesh = mesh_lib.make_mesh(config.mesh, devices)
        mesh_lib.check_batch(mesh, config.batch_size, microbatches=config.microbatches)
        return RunProgram(program_lib.build(config, mesh, **arguments))
    devices = list(jax.devices() if devices is None else devices)
    runs = math.gcd(len(configs), len(devices)) if runs_axis is None else runs_axis
    mesh = mesh_lib.make_packed_mesh(config.mesh, runs, devices)
    shape = packed_lib.pack_shape(configs, **arguments)
    packed = packed_lib.build_packed(shape, mesh, len(configs), batching)
    return RunProgram(packed.solo, packed)


def lower_train_step(config: TrainConfig, mesh, *, size: int = 1, arguments: dict | None = None,
                     batching: str | None = None) -> tuple[RunProgram, jax.stages.Lowered]:
    """The program of ``size`` runs of ``config``'s shape on ``mesh`` and its train step lowered ahead of
    time: ``(program, lowered)``. The one ahead-of-time entry point, for a run alone and for a pack.

    Nothing is allocated and no data is read (the state, batch and hyperparameters are abstract), so
    ``mesh`` may be made of compile-only devices (a TPU slice described by libtpu). A pack's ``mesh`` is a
    ``mesh.make_packed_mesh`` one; a run alone's has no ``runs`` axis. ``arguments`` are
    ``program.build``'s data keywords (default: the trainer's for the config, ``program.arguments_of``),
    so what is lowered is the program the run trains; ``batching`` as for ``packed.build_packed``.
    ``lowered.compile()`` compiles it; ``lowered.as_text()`` is the StableHLO.
    """
    arguments = program_lib.arguments_of(config) if arguments is None else arguments
    if size == 1 and mesh_lib.RUNS_AXIS not in mesh.shape:
        solo = program_lib.build(config, mesh, **arguments)
        return RunProgram(solo), solo.train_step.lower(solo.abstract_state, program_lib.batch_spec(config, mesh),
                                                       solo.abstract_hparams)
    packed = packed_lib.build_packed(program_lib.ProgramShape.of(config, **arguments), mesh, size, batching)
    lowered = packed.train_step.lower(packed.abstract_state, packed_lib.batch_spec(config, packed),
                                      packed.abstract_hparams)
    return RunProgram(packed.solo, packed), lowered
