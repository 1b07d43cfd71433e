"""The optimizer: AdamW with warmup then decay, clipping, and the learning-rate rule across widths.

``optim.lr_rule`` decides how the peak rate depends on the width: the same
for every shape (``constant``), scaled by base_width/width for every
parameter (``width_scaled``), or scaled only for the attention and
feed-forward matrices (``mup``, a partial μP: initialisation is not scaled).
"""

from __future__ import annotations

import jax
import optax

from scaling.config import ModelConfig

def _names(path) -> list[str]:
    names = [str(getattr(entry, "key", getattr(entry, "name", entry))) for entry in path]
    return [name for name in names if name != "value"]  # "value" is the field of a flax partitioning box


def _is_hidden_kernel(path) -> bool:
    names = _names(path)
    return names[-1] == "kernel" and ("attention" in names or "mlp" in names)


def _decays(path) -> bool:
    return _names(path)[-1] in ("kernel", "embedding", "position_embedding")


def learning_rates(optim, model: ModelConfig) -> dict[str, float]:
    """Peak learning rates for the ``hidden`` matrices and for ``other`` parameters under ``optim.lr_rule``."""
    width_factor = optim.base_width / model.width
    if optim.lr_rule == "constant":
        return {"hidden": optim.peak_lr, "other": optim.peak_lr}
    if optim.lr_rule == "width_scaled":
        return {"hidden": optim.peak_lr * width_factor, "other": optim.peak_lr * width_factor}
    return {"hidden": optim.peak_lr * width_factor, "other": optim.peak_lr}  # mup


def make_schedule(optim, peak_lr: float, total_steps: int):
    """Linear warmup to ``peak_lr`` over ``optim.warmup_steps``, then cosine/linear decay to a fraction of it."""
    warmup = min(optim.warmup_steps, max(total_steps - 1, 0))
    end = peak_lr * optim.end_lr_fraction
    decay_steps = max(total_steps - warmup, 1)
    if optim.schedule == "cosine":
        decay = optax.cosine_decay_schedule(peak_lr, decay_steps, alpha=optim.end_lr_fraction)
    elif optim.schedule == "linear":
        decay = optax.linear_schedule(peak_lr, end, decay_steps)
    else:
        decay = optax.constant_schedule(peak_lr)
    if warmup == 0:
        return decay
    return optax.join_schedules([optax.linear_schedule(0.0, peak_lr, warmup), decay], [warmup])


def make_optimizer(optim, model: ModelConfig, total_steps: int):
    """AdamW (+ global-norm clipping) whose per-group learning rates follow ``optim.lr_rule``.

    Returns ``(optax transformation, {group: schedule})``.
    """
    rates = learning_rates(optim, model)
    schedules = {group: make_schedule(optim, rate, total_steps) for group, rate in rates.items()}

    def decay_mask(params):
        return jax.tree_util.tree_map_with_path(lambda path, _: _decays(path), params)

    def adamw(schedule):
        return optax.adamw(schedule, b1=optim.beta1, b2=optim.beta2, eps=optim.eps,
                           weight_decay=optim.weight_decay, mask=decay_mask)

    if rates["hidden"] == rates["other"]:
        core = adamw(schedules["hidden"])
    else:
        def labels(params):
            return jax.tree_util.tree_map_with_path(
                lambda path, _: "hidden" if _is_hidden_kernel(path) else "other", params)
        core = optax.multi_transform({group: adamw(s) for group, s in schedules.items()}, labels)
    parts = [optax.clip_by_global_norm(optim.grad_clip)] if optim.grad_clip > 0 else []
    return optax.chain(*parts, core), schedules
