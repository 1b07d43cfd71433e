"""The optimizer: AdamW with warmup then decay, clipping, and the learning-rate rule across widths.

``optim.lr_rule`` decides how the peak rate depends on the width: the same
for every shape (``constant``), scaled by base_width/width for every
parameter (``width_scaled``), or scaled only for the attention and
feed-forward matrices (``mup``, a partial μP: initialisation is not scaled).

The numbers a sweep varies (peak rates, schedule lengths, weight decay) are
not constants of the compiled step: ``hyperparameters`` turns them into
scalars the step takes as an argument, and ``make_optimizer`` builds the
optimizer from those (traced) scalars, so runs that differ only in these
numbers share one compiled program. What stays in the program is the
optimizer's structure: the schedule's kind, clipping, Adam's betas and
epsilon, and whether the two parameter groups have rates of their own
(``grouped``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from scaling.config import ModelConfig, OptimConfig


def _names(path) -> list[str]:
    names = [str(getattr(entry, "key", getattr(entry, "name", entry))) for entry in path]
    return [name for name in names if name != "value"]  # "value" is the field of a flax partitioning box


def _is_hidden_kernel(path) -> bool:
    names = _names(path)
    return names[-1] == "kernel" and ("attention" in names or "mlp" in names)


def _decays(path) -> bool:
    return _names(path)[-1] in ("kernel", "embedding", "position_embedding")


def learning_rates(optim: OptimConfig, model: ModelConfig) -> dict[str, float]:
    """Peak learning rates for the ``hidden`` matrices and for ``other`` parameters under ``optim.lr_rule``."""
    width_factor = optim.base_width / model.width
    if optim.lr_rule == "constant":
        return {"hidden": optim.peak_lr, "other": optim.peak_lr}
    if optim.lr_rule == "width_scaled":
        return {"hidden": optim.peak_lr * width_factor, "other": optim.peak_lr * width_factor}
    return {"hidden": optim.peak_lr * width_factor, "other": optim.peak_lr}  # mup


def grouped(optim: OptimConfig, model: ModelConfig) -> bool:
    """Whether hidden matrices and other parameters get rates of their own (``mup`` away from
    ``base_width``): a structural choice, since the optimizer state then holds one part per group."""
    rates = learning_rates(optim, model)
    return rates["hidden"] != rates["other"]


def hyperparameters(optim: OptimConfig, model: ModelConfig, total_steps: int) -> dict[str, np.ndarray]:
    """The optimizer's numbers as scalars for the compiled step: peak rates per group (``lr_hidden``,
    ``lr_other``), ``warmup_steps`` and ``decay_steps`` (steps), ``end_lr_fraction`` and ``weight_decay``.

    The warmup is cut to leave at least one step of decay, as ``total_steps`` may be shorter than it.
    """
    rates = learning_rates(optim, model)
    warmup = min(optim.warmup_steps, max(total_steps - 1, 0))
    return {"lr_hidden": np.float32(rates["hidden"]), "lr_other": np.float32(rates["other"]),
            "warmup_steps": np.int32(warmup), "decay_steps": np.int32(max(total_steps - warmup, 1)),
            "end_lr_fraction": np.float32(optim.end_lr_fraction), "weight_decay": np.float32(optim.weight_decay)}


def without_numbers(optim: OptimConfig) -> OptimConfig:
    """``optim`` with every field that ``hyperparameters`` carries set to a fixed value: what is left
    is what the compiled program depends on (with ``grouped``)."""
    return dataclasses.replace(optim, peak_lr=1.0, base_width=1, warmup_steps=0, end_lr_fraction=0.0,
                               weight_decay=0.0)


def learning_rate(step, hparams: dict, group: str, schedule: str) -> jax.Array:
    """The learning rate of ``group`` ("hidden" or "other") after ``step`` optimizer steps: a linear
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
    """AdamW (+ global-norm clipping) with the rates and weight decay of ``hparams`` (see ``hyperparameters``;
    traced inside the compiled step). With ``is_grouped`` the hidden matrices and the other parameters
    are updated with rates of their own (``optax.multi_transform``), else every parameter with ``lr_hidden``.
    """
    def decay_mask(params):
        return jax.tree_util.tree_map_with_path(lambda path, _: _decays(path), params)

    def adamw(group):
        return optax.adamw(lambda count: learning_rate(count, hparams, group, optim.schedule), b1=optim.beta1,
                           b2=optim.beta2, eps=optim.eps, weight_decay=hparams["weight_decay"], mask=decay_mask)

    if is_grouped:
        def labels(params):
            return jax.tree_util.tree_map_with_path(
                lambda path, _: "hidden" if _is_hidden_kernel(path) else "other", params)
        core = optax.multi_transform({group: adamw(group) for group in ("hidden", "other")}, labels)
    else:
        core = adamw("hidden")
    parts = [optax.clip_by_global_norm(optim.grad_clip)] if optim.grad_clip > 0 else []
    return optax.chain(*parts, core)
