"""The sharded program of a run: one compiled train step per shape, shared by every run of that shape.

``build`` returns the model, the state's shardings on a mesh, and the jitted
init / train / eval functions. The init is jitted with output shardings, so
parameters are created already sharded and never whole on one host.
The training loop runs these functions (through ``scaling.model.run_program``, the
interface of a run alone and of a pack); ``benchmarks/``, tests and the TPU
preflight (``sweeps/preflight/``) compile exactly them ahead of time, all
through ``run_program.lower_train_step``.

A run's numbers (``hyperparameters``: the seed's key, the peak learning rates,
the schedule's lengths, weight decay) are an argument of the train step, not
constants in it. So every run of one ``ProgramShape`` on one mesh -- a sweep's
seeds and learning rates -- shares one program: ``build`` makes it once per
process, XLA compiles it once, and the persistent compilation cache holds one
entry. The learning-rate schedule is computed from these traced numbers
(``optim.learning_rate``): on steps whose rate divides by a step count it can
differ from what a program with the counts as constants computes by a few
float32 roundings (relative 4e-7; see there), so losses agree to about 1e-7.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from scaling.config import ModelConfig, OptimConfig, TrainConfig
from scaling.data import pipeline as data_lib
from scaling.model import mesh as mesh_lib, optim as optim_lib, parametrization
from scaling.model.loss import compute_loss, loss_and_grads
from scaling.model.transformer import Transformer


@dataclasses.dataclass(frozen=True)
class ProgramShape:
    """Everything a compiled program depends on: the runs of equal shapes share one program.

    Left out are the numbers a run hands its program as an argument
    (``hyperparameters``) and the fields that change nothing compiled
    (names, logging, checkpoints, the steps' count).
    """

    model: ModelConfig
    optim: OptimConfig  # with its numbers fixed (optim.without_numbers)
    grouped: bool  # hidden matrices and other parameters have rates of their own (optim.grouped)
    rules: tuple  # logical axis -> mesh axes (MeshConfig.rules)
    batch_size: int
    seq_len: int
    microbatches: int
    mask_id: int | None = None
    random_token_limit: int | None = None
    label_ids: tuple[int, int] | None = None
    # The parametrization's model-side scales (initialisation, attention, residual branches, output).
    multipliers: parametrization.Multipliers = parametrization.Multipliers()

    @classmethod
    def of(cls, config: TrainConfig, *, mask_id: int | None = None, random_token_limit: int | None = None,
           label_ids: tuple[int, int] | None = None) -> "ProgramShape":
        """The shape of ``config``'s program (the keywords as for ``build``)."""
        return cls(model=config.model, optim=optim_lib.without_numbers(config.optim),
                   grouped=optim_lib.grouped(config.optim, config.model), rules=config.mesh.rules,
                   batch_size=config.batch_size, seq_len=config.data.seq_len, microbatches=config.microbatches,
                   mask_id=mask_id, random_token_limit=random_token_limit,
                   label_ids=None if label_ids is None else tuple(label_ids),
                   multipliers=parametrization.multipliers(config.optim, config.model))


@dataclasses.dataclass(frozen=True)
class Program:
    """Everything compiled for one ``ProgramShape`` on one mesh."""

    model: Transformer
    mesh: jax.sharding.Mesh
    state_shardings: dict
    abstract_state: dict  # ShapeDtypeStructs carrying their shardings, for restore and AOT compilation
    abstract_hparams: dict  # the same for the train step's hyperparameters
    init: Callable  # key -> state
    train_step: Callable  # (state, batch, hparams) -> (state, metrics)
    eval_step: Callable  # (params, batch, rng) -> (loss_sum, tokens, correct); correct is 0 without label_ids
    shape: ProgramShape  # what it was built from (the trainer and the preflight build from the same one)


def hyperparameters(config: TrainConfig) -> dict[str, np.ndarray]:
    """The numbers of ``config`` that its train step takes as an argument (numpy scalars): the seed's
    ``key`` (the per-step RNG of dropout and masking) and the optimizer's (``optim.hyperparameters``:
    peak rates, weight decays and epsilons per group, schedule lengths in steps)."""
    return {"key": np.asarray(jax.random.PRNGKey(config.seed)),
            **optim_lib.hyperparameters(config.optim, config.model, config.steps)}


def batch_spec(config: TrainConfig, mesh) -> dict:
    """ShapeDtypeStructs of one global batch (for ahead-of-time compilation)."""
    sharding = mesh_lib.batch_sharding(mesh)
    shape = (config.batch_size, config.data.seq_len)
    return {"inputs": jax.ShapeDtypeStruct(shape, jnp.int32, sharding=sharding),
            "targets": jax.ShapeDtypeStruct(shape, jnp.int32, sharding=sharding),
            "weights": jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding),
            "input_mask": jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding)}


def build(config: TrainConfig, mesh, *, mask_id: int | None = None, random_token_limit: int | None = None,
          label_ids: tuple[int, int] | None = None) -> Program:
    """Model, optimizer and jitted, sharded init/train/eval functions for ``config`` on ``mesh``.

    ``mask_id`` turns on on-device BERT masking for the masked objective on
    LM data (pass the data pipeline's mask token id); leave it None for
    causal models and for classification tasks. ``label_ids`` (classification
    tasks: the pipeline's ``LABEL_TOKENS``) reads labels from those two logits only.
    Configs of one ``ProgramShape`` get the same ``Program`` (built once per process);
    ``train_step`` takes ``hyperparameters(config)`` as its third argument.
    """
    mesh_lib.check_batch(mesh, config.batch_size, process_count=1, microbatches=config.microbatches)
    shape = ProgramShape.of(config, mask_id=mask_id, random_token_limit=random_token_limit, label_ids=label_ids)
    return _build(shape, mesh)


def build_shape(shape: ProgramShape, mesh) -> Program:
    """The ``Program`` of ``shape`` on ``mesh`` (built once per process, as ``build``), for code that already
    has the shape, such as the packed program of several runs (``scaling.model.packed``)."""
    return _build(shape, mesh)


def train_step_function(shape: ProgramShape, model: Transformer) -> Callable:
    """The unjitted train step of ``shape``: ``(state, batch, hparams) -> (state, metrics)``."""
    return _train_step(shape, model)


def eval_step_function(shape: ProgramShape, model: Transformer) -> Callable:
    """The unjitted eval step of ``shape``: ``(params, batch, rng) -> (loss_sum, tokens, correct)``."""
    return _eval_step(shape, model)


def forget_programs() -> None:
    """Drop the programs built so far in this process: the next ``build`` traces and compiles afresh (for
    code that changes how a step is traced, such as a test that switches the activation constraints off,
    or that times compilation)."""
    _build.cache_clear()


def arguments_of(config: TrainConfig) -> dict:
    """The keyword arguments ``build`` takes from the data for the resolved ``config`` (its vocabulary is the
    tokenizer's): the one place they are derived (``data.program_arguments``), so the trainer, the preflight
    and a trained run read back build the same program."""
    return data_lib.program_arguments(config.data, config.model.objective, config.model.vocab_size)


def initial_state_function(shape: ProgramShape, model: Transformer) -> Callable:
    """The unjitted ``key -> state`` of one run of ``shape`` (parameters still boxed with their logical axes):
    step 0, the initial parameters and the optimizer's state. The solo init and the packed one both use it."""
    # Any run's numbers will do where only their shapes count (the optimizer state's structure).
    template = {"key": np.asarray(jax.random.PRNGKey(0)), **optim_lib.hyperparameters(shape.optim, shape.model, 1)}
    sample = jnp.zeros((1, shape.seq_len), jnp.int32)

    def boxed_state(rng):
        params = model.init(rng, sample)["params"]
        tx = optim_lib.make_optimizer(shape.optim, shape.grouped, template)
        return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}

    return boxed_state


# A sweep trains the runs of one shape one after another (cheapest first), so a few programs suffice.
@functools.lru_cache(maxsize=4)
def _build(shape: ProgramShape, mesh) -> Program:
    model = Transformer(shape.model, multipliers=shape.multipliers)
    # Any run's numbers will do where only their shapes count (the hyperparameters' AOT specs).
    template = {"key": np.asarray(jax.random.PRNGKey(0)), **optim_lib.hyperparameters(shape.optim, shape.model, 1)}
    boxed_state = initial_state_function(shape, model)
    abstract_boxed = jax.eval_shape(boxed_state, jax.random.PRNGKey(0))
    abstract = nn.unbox(abstract_boxed)
    state_shardings = mesh_lib.tree_shardings(nn.get_partition_spec(abstract_boxed), abstract, mesh, shape.rules)
    replicated, batch_sharding = mesh_lib.replicated(mesh), mesh_lib.batch_sharding(mesh)
    abstract_state = jax.tree_util.tree_map(
        lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
        abstract, state_shardings)
    abstract_hparams = jax.tree_util.tree_map(
        lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=replicated), template)

    def sharded_activations(step):
        # The model's activation constraints take effect while the step is traced.
        @functools.wraps(step)
        def traced(*args):
            with mesh_lib.activation_sharding(mesh, shape.rules):
                return step(*args)
        return traced

    init = jax.jit(lambda rng: nn.unbox(boxed_state(rng)), out_shardings=state_shardings)
    train_step = jax.jit(sharded_activations(_train_step(shape, model)), donate_argnums=0,
                         in_shardings=(state_shardings, batch_sharding, replicated),
                         out_shardings=(state_shardings, replicated))
    eval_step = jax.jit(sharded_activations(_eval_step(shape, model)),
                        in_shardings=(state_shardings["params"], batch_sharding, replicated),
                        out_shardings=(replicated, replicated, replicated))
    return Program(model, mesh, state_shardings, abstract_state, abstract_hparams, init, train_step, eval_step, shape)


def _losses(shape: ProgramShape) -> dict:
    return {"mask_id": shape.mask_id, "random_token_limit": shape.random_token_limit, "label_ids": shape.label_ids}


def _train_step(shape: ProgramShape, model: Transformer) -> Callable:
    """``(state, batch, hparams) -> (state, metrics)``, to be jitted."""

    def train_step(state, batch, hparams):
        tx = optim_lib.make_optimizer(shape.optim, shape.grouped, hparams)
        rng = jax.random.fold_in(hparams["key"], state["step"])
        loss, aux, grads = loss_and_grads(model, state["params"], batch, rng=rng, microbatches=shape.microbatches,
                                          deterministic=shape.model.dropout == 0.0, **_losses(shape))
        grad_norm = optax.global_norm(grads)
        # A finite loss and gradient norm (which bounds every squared gradient
        # entry, so Adam's moments stay finite too) decide whether the step is
        # applied; judging the updated parameters instead would keep a second
        # copy of them alive. A step that fails keeps the old state: the loop
        # then stops as diverged, and the state it may checkpoint is the last good one.
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        keep = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
        new_state = {"step": state["step"] + 1,
                     "params": jax.tree_util.tree_map(keep, params, state["params"]),
                     "opt_state": jax.tree_util.tree_map(keep, opt_state, state["opt_state"])}
        lr = optim_lib.learning_rate(state["step"], hparams, "hidden", shape.optim.schedule)
        return new_state, {"loss": loss, "grad_norm": grad_norm, "finite": finite,
                           "predicted_tokens": aux["tokens"], "lr": lr}

    return train_step


def _eval_step(shape: ProgramShape, model: Transformer) -> Callable:
    """``(params, batch, rng) -> (loss_sum, tokens, correct)``, to be jitted."""

    def eval_step(params, batch, rng):
        loss, aux = compute_loss(model, params, batch, rng=rng, deterministic=True, **_losses(shape))
        return loss * aux["tokens"], aux["tokens"], aux.get("correct", jnp.zeros((), jnp.float32))

    return eval_step


def evaluate(eval_step: Callable, mesh, params, batches: list, batch_size: int) -> list[dict]:
    """The one evaluator, for a run alone and for a pack: per run, ``loss`` (mean nats per predicted token)
    and ``accuracy`` (fraction of predictions correct: meaningful for classification tasks, whose eval step
    counts correct labels; 0 otherwise) over ``batches`` (this process's rows of each). ``eval_step`` is a
    ``Program``'s or a ``PackedProgram``'s: its outputs are scalars for one run, [k] for a pack."""
    total = count = correct = 0.0
    for index, local in enumerate(batches):
        batch = mesh_lib.global_batch(local, mesh, batch_size)
        # A fixed key per batch: every run masks the validation set identically.
        loss_sum, tokens, right = eval_step(params, batch, jax.random.PRNGKey(10_000 + index))
        total = total + np.atleast_1d(np.asarray(loss_sum, np.float64))
        count = count + np.atleast_1d(np.asarray(tokens, np.float64))
        correct = correct + np.atleast_1d(np.asarray(right, np.float64))
    total, count, correct = (np.atleast_1d(np.asarray(value, np.float64)) for value in (total, count, correct))
    return [{"loss": float(t / max(c, 1.0)), "accuracy": float(r / max(c, 1.0))}
            for t, c, r in zip(total, count, correct)]


def evaluate_metrics(program: Program, params, batches: list, batch_size: int) -> dict:
    """``evaluate`` of one run's ``program``: its ``loss`` and ``accuracy``."""
    return evaluate(program.eval_step, program.mesh, params, batches, batch_size)[0]
