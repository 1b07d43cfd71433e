"""Solo against packed, timed in a piece's first seconds: one shape's train step alone and as ``k`` runs in
one program (``scaling.model.packed``), on random tokens, on the piece's first device.

What it returns is the first piece's benchmark row (tokens/s and MFU of each way, the compile seconds)
and two measurements the piece's speed model starts from before any pack has run.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from scaling.config import MeshConfig, TrainConfig
from scaling.model.flops import training_flops_per_token


def _random_batch(config: TrainConfig, seed: int) -> dict:
    rows, length = config.batch_size, config.data.seq_len
    tokens = np.random.default_rng(seed).integers(0, config.model.vocab_size, (rows, length + 1), dtype=np.int32)
    ones = np.ones((rows, length), np.float32)
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": ones, "input_mask": ones}


def _timed(step, state, batch, hparams, seconds: float) -> tuple[float, float]:
    """(seconds to compile and take the first two steps, seconds per step after them, over about ``seconds``)."""
    import jax

    started = time.perf_counter()
    for _ in range(2):
        state, _ = step(state, batch, hparams)
    jax.block_until_ready(state)
    warm = time.perf_counter() - started
    steps, started = 0, time.perf_counter()
    while steps < 3 or time.perf_counter() - started < seconds:
        state, _ = step(state, batch, hparams)
        steps += 1
        if steps % 5 == 0:
            jax.block_until_ready(state)
    jax.block_until_ready(state)
    return warm, (time.perf_counter() - started) / steps


def solo_vs_packed(config: TrainConfig, size: int, peak_flops: float, seconds: float = 3.0) -> dict:
    """Tokens/s and MFU of ``config``'s step alone and of ``size`` runs of it packed, each timed for about
    ``seconds`` after compiling; the compile (and first steps') seconds of each."""
    import jax

    from scaling.model import mesh as mesh_lib
    from scaling.model import packed, program

    device = jax.devices()[:1]
    configs = [dataclasses.replace(config, seed=seed) for seed in range(size)]
    solo_mesh = mesh_lib.make_mesh(MeshConfig(), device)
    solo = program.build(configs[0], solo_mesh)
    solo_warm, solo_step = _timed(solo.train_step, solo.init(jax.random.PRNGKey(0)),
                                  mesh_lib.global_batch(_random_batch(config, 0), solo_mesh, config.batch_size),
                                  jax.device_put(program.hyperparameters(configs[0])), seconds)
    pack = packed.build_packed(packed.pack_shape(configs), mesh_lib.make_packed_mesh(MeshConfig(), 1, device), size)
    batches = [_random_batch(config, seed) for seed in range(size)]
    hparams = packed.stack_hyperparameters([program.hyperparameters(c) for c in configs])
    packed_warm, packed_step = _timed(pack.train_step, pack.init(packed.stack_keys(list(range(size)))),
                                      packed.global_batch(batches, pack, config.batch_size),
                                      jax.device_put(hparams), seconds)
    tokens = config.batch_size * config.data.seq_len
    per_token = training_flops_per_token(config.model, config.data.seq_len).total
    solo_rate, packed_rate = tokens / solo_step, size * tokens / packed_step
    return {"depth": config.model.depth, "width": config.model.width, "runs": size,
            "solo_tokens_per_second": round(solo_rate, 1), "packed_tokens_per_second": round(packed_rate, 1),
            "packed_per_run_over_solo": round(packed_rate / size / solo_rate, 3),
            "solo_mfu": round(solo_rate * per_token / peak_flops, 5),
            "packed_mfu": round(packed_rate * per_token / peak_flops, 5),
            "solo_step_seconds": solo_step, "packed_step_seconds": packed_step,
            "solo_compile_seconds": round(solo_warm, 2), "packed_compile_seconds": round(packed_warm, 2),
            "flops_per_step": per_token * tokens}
