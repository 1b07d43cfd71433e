"""Fresh parameters of a small model, for the model, attention, loss and parametrization tests (the trainer
initialises its state in ``scaling.model.program``)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from scaling.config import ModelConfig
from scaling.model.parametrization import Multipliers
from scaling.model.transformer import Transformer


def init_params(config: ModelConfig, rng, batch_size: int = 1, length: int | None = None,
                multipliers: Multipliers = Multipliers()):
    """Unboxed float parameters of a fresh model (allocates them; use for small models); ``length`` in tokens."""
    model = Transformer(config, multipliers=multipliers)
    tokens = jnp.zeros((batch_size, length or min(config.max_seq_len, 8)), jnp.int32)
    return nn.unbox(jax.jit(model.init)(rng, tokens)["params"])
