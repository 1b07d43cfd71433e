"""A trained run, read back for use: its config, its tokenizer and the parameters of its newest checkpoint.

``load_run(run_dir)`` reads ``<run dir>/config.json``, builds the run's
program (``scaling.model.program``) on a mesh of the current devices and restores
the step and parameters of the newest checkpoint that reads back (orbax;
the optimizer state is not read). The arrays are restored straight into the
new mesh's shardings, so a run saved on one device can be read onto eight
and the other way round: the checkpoint's own layout does not matter. The
mesh is the run's ``mesh`` config when it fits the current devices, else
all of them data-parallel (``mesh.data=-1``); ``--set mesh.fsdp=N`` and the
like choose another.

Nothing is written to the run directory (the checkpoints are opened read
only), so a finished run, or one still training, can be read safely.
``eval`` and ``sample`` of ``python -m scaling.train`` use this module
(``scaling.run.evaluate``, ``scaling.run.generate``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import sys

import jax
import orbax.checkpoint as ocp
from etils import epath

from scaling.config import MeshConfig, TrainConfig, from_dict
from scaling.overrides import override
from scaling.data import pipeline as data
from scaling.data.token_cache import SPECIAL_TOKENS
from scaling.model import mesh as mesh_lib
from scaling.model.program import Program, arguments_of, build
from scaling.store.rundir import absolute_path, checkpoint_steps, one_line

# Config fields a user may change when reading a run back: the data it is evaluated on, the batch, the mesh.
OVERRIDABLE = ("data.", "mesh.", "batch_size", "eval_batches")


class RunDirError(ValueError):
    """A run directory that cannot be read back; the message is one line naming the path."""


@dataclasses.dataclass(frozen=True)
class TrainedRun:
    """A run read back: ``config`` (its vocabulary resolved to the tokenizer's, overrides applied),
    ``program`` (built for ``config`` on the current devices), ``params`` (sharded on the program's mesh),
    ``step`` (the checkpoint's optimizer step), ``tokenizer`` with the pipeline's special ids, and
    ``batch_size``: sequences per batch to read (``config.batch_size`` is that rounded up to a multiple
    of the mesh's batch shards, the rows the program computes; the rest are padding)."""

    run_dir: epath.Path
    config: TrainConfig
    program: Program
    params: dict
    step: int
    tokenizer: object
    eos_id: int
    pad_id: int
    mask_id: int
    cls_id: int
    batch_size: int

    @property
    def vocab_size(self) -> int:
        """Ids the model predicts: the tokenizer's plus the four special tokens."""
        return self.config.model.vocab_size

    @property
    def byte_level(self) -> bool:
        """True when every ordinary token is one byte (the ``byte`` tokenizer), so bits per byte are defined."""
        return self.config.data.tokenizer == "byte"


def read_config(run_dir) -> TrainConfig:
    """The run's ``config.json`` as a ``TrainConfig``; ``RunDirError`` if there is none or it is unreadable."""
    run_dir = absolute_path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: no such run directory")
    path = run_dir / "config.json"
    if not path.exists():
        raise RunDirError(f"{run_dir}: no config.json here, so not a run directory of scaling.run.train "
                          "(a sweep's runs are its subdirectories)")
    try:
        return from_dict(TrainConfig, json.loads(path.read_text()))
    except (ValueError, TypeError) as error:
        raise RunDirError(f"{path}: not a readable run config ({error})") from None


def apply_overrides(config: TrainConfig, assignments: list[str]) -> TrainConfig:
    """``config`` with ``--set KEY=VALUE`` assignments of the fields in ``OVERRIDABLE`` only: the model and
    the optimizer are the checkpoint's, and changing them would not describe this run."""
    for assignment in assignments:
        key = assignment.partition("=")[0]
        if not any(key == name or (name.endswith(".") and key.startswith(name)) for name in OVERRIDABLE):
            raise RunDirError(f"--set {assignment}: only data.*, mesh.*, batch_size and eval_batches can be "
                              "changed when reading a run back")
    changed = override(config, assignments)
    if changed.data.tokenizer != config.data.tokenizer or changed.data.bpe_vocab_size != config.data.bpe_vocab_size:
        raise RunDirError(f"--set data.tokenizer: the run was trained with tokenizer {config.data.tokenizer!r}; "
                          "its model reads only that tokenizer's ids")
    return changed


def tokenizer_of(config: TrainConfig):
    """The run's tokenizer. ``byte`` and ``hf:`` need nothing else; a trained ``bpe`` is read from the
    run's token cache (built from its corpus on first use, as the trainer does)."""
    spec = config.data.tokenizer
    if spec == "byte":
        from scaling.data.tokenizer import ByteTokenizer

        return ByteTokenizer()
    if spec.startswith("hf:"):
        from scaling.data.tokenizer import load_hf

        return load_hf(spec[3:])
    return data.build(config.data).tokenizer


def pick_mesh(config: TrainConfig, devices, chosen: bool = False) -> jax.sharding.Mesh:
    """The run's mesh on ``devices`` when its sizes fit them, else all of them data-parallel (said on
    stderr). ``chosen``: the mesh was set on the command line, so a misfit is an error (``ValueError``)."""
    try:
        return mesh_lib.make_mesh(config.mesh, devices)
    except ValueError as error:
        if chosen:
            raise
        print(f"note: the run's mesh does not fit the {len(devices)} devices here ({error}); reading it onto "
              "all of them data-parallel (choose with --set mesh.fsdp=N and the like)", file=sys.stderr)
        return mesh_lib.make_mesh(MeshConfig(rules=config.mesh.rules), devices)


def load_run(run_dir, *, overrides: tuple[str, ...] = (), devices=None, batch_size: int | None = None) -> TrainedRun:
    """Read ``run_dir`` (local or ``gs://``) back: config, tokenizer, and the parameters of its newest
    checkpoint that reads back whole, on ``devices`` (default: all of this process's).

    ``overrides``: ``--set`` assignments (``OVERRIDABLE`` fields). ``batch_size`` (sequences) is the batch
    the program is built for, rounded up to a multiple of the mesh's batch shards (default: the run's own).
    Raises ``RunDirError`` (one line) for a directory without a config or without a readable checkpoint.
    """
    run_dir = absolute_path(run_dir)
    config = apply_overrides(read_config(run_dir), list(overrides))
    checkpoints = run_dir / "checkpoints"
    steps = sorted(checkpoint_steps(run_dir), reverse=True)
    if not steps:
        raise RunDirError(f"{run_dir}: no checkpoints yet ({checkpoints} holds none); train the run first, "
                          "e.g. python -m scaling.train --config " + str(run_dir / "config.json")
                          + f" --workdir {run_dir}")
    tokenizer = tokenizer_of(config)
    base = tokenizer.base_vocab_size
    pad_id, eos_id, mask_id, cls_id = range(base, base + len(SPECIAL_TOKENS))
    vocab = base + len(SPECIAL_TOKENS)
    devices = list(jax.local_devices() if devices is None else devices)
    mesh = pick_mesh(config, devices, chosen=any(o.startswith("mesh.") for o in overrides))
    shards = mesh_lib.batch_axes_size(mesh)
    batch_size = batch_size or config.batch_size
    rows = -(-batch_size // shards) * shards
    config = dataclasses.replace(config, batch_size=rows, microbatches=1,
                                 model=dataclasses.replace(config.model, vocab_size=vocab))
    # As the trainer builds it (program.arguments_of): classification tasks read their label from two
    # logits; masked LMs mask.
    program = build(config, mesh, **arguments_of(config))
    step, params = _restore_newest(checkpoints, steps, program.abstract_state)
    return TrainedRun(run_dir, config, program, params, step, tokenizer, eos_id, pad_id, mask_id, cls_id,
                      batch_size)


@contextlib.contextmanager
def _quiet_orbax():
    """Silence what reading checkpoints prints that asks nothing of the user: orbax's warning for every
    read-only manager ("setting save_interval_steps=0"), and, after a damaged checkpoint, the tracebacks
    of its abandoned read tasks failing on closed event loops (collected here, while still silenced), which
    would bury the one-line warning (as ``scaling.store.checkpoints`` does while training)."""
    loggers = [logging.getLogger(name) for name in ("absl", "asyncio")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    previous = sys.unraisablehook

    def hook(unraisable):
        message = str(unraisable.exc_value)
        if not ("Event loop is closed" in message or "error while reading array" in message):
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        gc.collect()
        sys.unraisablehook = previous
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def parent_params(run_dir, config: TrainConfig, abstract_state: dict) -> tuple[str, int, dict]:
    """The parameters a run of ``config`` starts from when it continues another run's (``init_from``):
    ``(the parent's run id, its step, its newest parameters that read back, on abstract_state's shardings)``.
    Raises ``RunDirError`` (one line) if the parent has no config or no readable checkpoint, or if its model
    is not ``config``'s (the vocabulary aside, which the data resolves)."""
    from scaling.config import config_id

    run_dir = absolute_path(run_dir)
    parent = read_config(run_dir)
    mine, theirs = config.model, dataclasses.replace(parent.model, vocab_size=config.model.vocab_size)
    if mine != theirs:
        fields = [f.name for f in dataclasses.fields(mine) if getattr(mine, f.name) != getattr(theirs, f.name)]
        raise RunDirError(f"init_from={str(run_dir)!r}: that run's model differs from this one's in "
                          f"{', '.join(fields)}; continue a run of the same shape")
    steps = sorted(checkpoint_steps(run_dir), reverse=True)
    if not steps:
        raise RunDirError(f"init_from={str(run_dir)!r}: no checkpoints yet; train that run first")
    step, params = _restore_newest(run_dir / "checkpoints", steps, abstract_state)
    return config_id(parent), step, params


def _restore_newest(directory: epath.Path, steps: list[int], abstract_state: dict) -> tuple[int, dict]:
    """(step, params) of the newest of ``steps`` that reads back, onto ``abstract_state``'s shardings; older
    ones are tried after a damaged one (each named on stderr). Only the step and the parameters are read."""
    wanted = {"step": abstract_state["step"], "params": abstract_state["params"]}
    restore = ocp.args.PyTreeRestore(item=wanted, restore_args=ocp.checkpoint_utils.construct_restore_args(wanted),
                                     partial_restore=True)
    errors = []
    with _quiet_orbax():
        manager = ocp.CheckpointManager(directory, item_names=("state", "meta"),
                                        options=ocp.CheckpointManagerOptions(read_only=True, create=False))
        try:
            for step in steps:
                try:
                    state = manager.restore(step, args=ocp.args.Composite(state=restore))["state"]
                except Exception as error:  # noqa: BLE001 - any failure to read means "try an older one"
                    errors.append(f"step {step}: {one_line(error)}")
                    print(f"warning: {directory}: checkpoint of step {step} does not read back "
                          f"({one_line(error)}); trying an older one", file=sys.stderr)
                    continue
                return int(jax.device_get(state["step"])), state["params"]
        finally:
            manager.close()
    raise RunDirError(f"{directory}: no checkpoint reads back ({'; '.join(errors)})")
