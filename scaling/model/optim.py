"""The optimizer: AdamW with warmup then decay, clipping, and per-group numbers across shapes.

Under ``optim.parametrization="standard"``, ``optim.lr_rule`` decides how the
peak rate depends on the width: the same for every shape (``constant``),
scaled by base_width/width for every parameter (``width_scaled``), or scaled
only for the attention and feed-forward matrices (``mup``, μP's rates alone:
initialisation and multipliers are not scaled). Under ``mup`` and
``completep`` the parametrization sets each group's rate, weight decay and
epsilon (``scaling.model.parametrization.group_factors``) and ``lr_rule`` must be
``constant``.

The numbers a sweep varies (peak rates, schedule lengths, weight decay,
epsilon) are not constants of the compiled step: ``hyperparameters`` turns
them into scalars the step takes as an argument, one per parameter group,
and ``make_optimizer`` builds the optimizer from those (traced) scalars, so
runs that differ only in these numbers share one compiled program. What
stays in the program is the optimizer's structure: the schedule's kind,
clipping, Adam's betas, and whether the parameter groups are updated
apart (``grouped``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from scaling.config import ModelConfig, OptimConfig
from scaling.model import parametrization


def _names(path) -> list[str]:
    names = [jax.tree_util.keystr((entry,), simple=True) for entry in path]
    return [name for name in names if name != "value"]  # "value" is the field of a flax partitioning box


def _is_hidden_kernel(path) -> bool:
    names = _names(path)
    return names[-1] == "kernel" and ("attention" in names or "mlp" in names)


def _in_block(path) -> bool:
    return any(name == "layers" or name.startswith("layers_") for name in _names(path))


def _decays(path) -> bool:
    return _names(path)[-1] in ("kernel", "embedding", "position_embedding")


def group_of(optim: OptimConfig, path) -> str:
    """The group (``scaling.model.parametrization.groups``) of the parameter at ``path``: ``hidden`` for the
    attention and feed-forward matrices, ``block`` (where ``groups`` has it) for the blocks' norms and
    biases, ``other`` for the rest (embeddings, unembedding, final norm)."""
    if _is_hidden_kernel(path):
        return "hidden"
    if "block" in parametrization.groups(optim) and _in_block(path):
        return "block"
    return "other"


def learning_rates(optim: OptimConfig, model: ModelConfig) -> dict[str, float]:
    """Peak learning rates per group: ``hidden`` matrices and ``other`` parameters (and ``block`` where
    ``parametrization.groups`` has it), from ``optim.lr_rule`` under the standard parametrization, else
    from the parametrization."""
    if optim.parametrization != "standard":
        factors = parametrization.group_factors(optim, model)
        return {group: optim.peak_lr * factor.lr for group, factor in factors.items()}
    width_factor = optim.base_width / model.width
    if optim.lr_rule == "constant":
        return {"hidden": optim.peak_lr, "other": optim.peak_lr}
    if optim.lr_rule == "width_scaled":
        return {"hidden": optim.peak_lr * width_factor, "other": optim.peak_lr * width_factor}
    return {"hidden": optim.peak_lr * width_factor, "other": optim.peak_lr}  # mup


def rule_name(optim: OptimConfig) -> str:
    """How the run's rates follow the shape, for its record (``lr_rule``): the rule itself under the
    standard parametrization, else ``parametrization=NAME`` (so runs of one rate under two
    parametrizations are never pooled by the analysis)."""
    return optim.lr_rule if optim.parametrization == "standard" else f"parametrization={optim.parametrization}"


def _group_numbers(optim: OptimConfig, model: ModelConfig) -> dict[str, tuple[float, float, float]]:
    """Per group: (peak rate, weight decay, epsilon)."""
    factors = parametrization.group_factors(optim, model)
    rates = learning_rates(optim, model)
    return {group: (rates[group], optim.weight_decay * factor.weight_decay, optim.eps * factor.eps)
            for group, factor in factors.items()}


def grouped(optim: OptimConfig, model: ModelConfig) -> bool:
    """Whether the groups get numbers of their own (e.g. ``lr_rule="mup"`` or μP away from ``base_width``):
    a structural choice, since the optimizer state then holds one part per group."""
    return len(set(_group_numbers(optim, model).values())) > 1


def hyperparameters(optim: OptimConfig, model: ModelConfig, total_steps: int) -> dict[str, np.ndarray]:
    """The optimizer's numbers as scalars for the compiled step: per group G (``hidden``, ``other``, and
    ``block`` where ``parametrization.groups`` has it) its peak rate ``lr_G``, weight decay
    ``weight_decay_G`` and Adam epsilon ``eps_G``; ``warmup_steps`` and ``decay_steps`` (steps) and ``end_lr_fraction``.

    The warmup is cut to leave at least one step of decay, as ``total_steps`` may be shorter than it.
    """
    warmup = min(optim.warmup_steps, max(total_steps - 1, 0))
    numbers = {}
    for group, (lr, weight_decay, eps) in _group_numbers(optim, model).items():
        numbers |= {f"lr_{group}": np.float32(lr), f"weight_decay_{group}": np.float32(weight_decay),
                    f"eps_{group}": np.float32(eps)}
    return {**numbers, "warmup_steps": np.int32(warmup), "decay_steps": np.int32(max(total_steps - warmup, 1)),
            "end_lr_fraction": np.float32(optim.end_lr_fraction)}


def without_numbers(optim: OptimConfig) -> OptimConfig:
    """``optim`` with every field that ``hyperparameters`` carries set to a fixed value: what is left
    is what the compiled program depends on (with ``grouped`` and the model's multipliers, which
    ``scaling.model.program.ProgramShape`` holds)."""
    return dataclasses.replace(optim, peak_lr=1.0, base_width=1, base_depth=1, warmup_steps=0,
                               end_lr_fraction=0.0, weight_decay=0.0, eps=0.0)


def learning_rate(step, hparams: dict, group: str, schedule: str) -> jax.Array:
    """The learning rate of ``group`` ("hidden", "block" or "other") after ``step`` optimizer steps: a linear
    warmup from 0 to the peak over ``warmup_steps``, then ``schedule`` ("cosine", "linear" or
    "constant") to ``end_lr_fraction`` of the peak over ``decay_steps``, where it stays.

    The curve of optax's ``join_schedules`` of ``linear_schedule`` and ``cosine_decay_schedule`` (or
    ``linear_schedule``), written out because those check their step counts in Python and so cannot
    take them as traced arguments. The result can differ from optax's compiled curve in the last bit:
    with constant step counts XLA turns a division by a constant into a product with its reciprocal.
    """
    peak, end_fraction = hparams[f"lr_{group}"], hparams["end_lr_fraction"]
    warmup, decay_steps = hparams["warmup_steps"], hparams["decay_steps"]
    step = jnp.asarray(step)
    # optax.linear_schedule(0, peak, warmup): (init - end) * (1 - t / T) + end.
    warming = -peak * (1 - jnp.clip(step, 0, warmup) / jnp.maximum(warmup, 1)) + peak
    since = step - warmup
    if schedule == "cosine":  # optax.cosine_decay_schedule(peak, decay_steps, alpha=end_fraction)
        done = jnp.minimum(since.astype(jnp.float32), decay_steps.astype(jnp.float32))
        cosine = 0.5 * (1 + jnp.cos(jnp.pi * done / decay_steps))
        decayed = peak * ((1 - end_fraction) * cosine + end_fraction)
    elif schedule == "linear":  # optax.linear_schedule(peak, peak * end_fraction, decay_steps)
        end = peak * end_fraction
        decayed = (peak - end) * (1 - jnp.clip(since, 0, decay_steps) / decay_steps) + end
    else:
        decayed = peak
    return jnp.where(step < warmup, warming, decayed)


def make_optimizer(optim: OptimConfig, is_grouped: bool, hparams: dict) -> optax.GradientTransformation:
    """AdamW (+ global-norm clipping) with the rates, weight decays and epsilons of ``hparams`` (see
    ``hyperparameters``; traced inside the compiled step). With ``is_grouped`` each group (``group_of``)
    is updated with numbers of its own (``optax.multi_transform``), else every parameter with the
    ``hidden`` group's.
    """
    def decay_mask(params):
        return jax.tree_util.tree_map_with_path(lambda path, _: _decays(path), params)

    def adamw(group):
        return optax.adamw(lambda count: learning_rate(count, hparams, group, optim.schedule), b1=optim.beta1,
                           b2=optim.beta2, eps=hparams[f"eps_{group}"], weight_decay=hparams[f"weight_decay_{group}"],
                           mask=decay_mask)

    if is_grouped:
        def labels(params):
            return jax.tree_util.tree_map_with_path(lambda path, _: group_of(optim, path), params)
        core = optax.multi_transform({group: adamw(group) for group in parametrization.groups(optim)}, labels)
    else:
        core = adamw("hidden")
    parts = [optax.clip_by_global_norm(optim.grad_clip)] if optim.grad_clip > 0 else []
    return optax.chain(*parts, core)
