"""The llama block (RMSNorm, SwiGLU, rotary positions, no biases) and exact GELU."""

import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from model_params import init_params
from scaling.config import ModelConfig, TrainConfig, config_id
from scaling.overrides import override
from scaling.model import budget, flops
from scaling.model.transformer import Transformer, _ACTIVATIONS, rotary_positions


def _swiglu_hidden(width, ff_multiplier=4):
    return round(2 * ff_multiplier * width / 3)


@pytest.mark.parametrize("depth,width", [(1, 64), (2, 192), (3, 320), (12, 768)])
def test_llama_parameters_by_hand(depth, width):
    config = ModelConfig(depth=depth, width=width, block="llama", vocab_size=260, max_seq_len=128)
    hidden = _swiglu_hidden(width)
    counts = budget.count_params(config)
    # per layer: q, k, v, out (4·d²) + gate, up, down (3·d·h); no biases anywhere
    assert counts["non_embedding"] == depth * (4 * width**2 + 3 * width * hidden)
    # token embedding + untied unembedding; rotary positions have no table
    assert counts["embedding"] == 2 * 260 * width
    # RMSNorm scales only: two per layer and the final one
    assert counts["other"] == (2 * depth + 1) * width
    # the SwiGLU width keeps the layer at 12·d² as nearly as one channel allows
    assert abs(counts["non_embedding"] - 12 * depth * width**2) <= 3 * depth * width / 2 + 1e-9
    assert flops.training_flops_per_token(config, 64).layers == 6.0 * counts["non_embedding"]


def _rope_reference(x: np.ndarray, base: float = 10000.0) -> np.ndarray:
    """RoPE as complex rotations: channel i and i + D/2 form z = a + ib, multiplied by e^{i·p·θ_i}."""
    dim = x.shape[-1]
    theta = base ** (-2.0 * np.arange(dim // 2) / dim)
    out = np.empty_like(x, dtype=np.float64)
    for position in range(x.shape[1]):
        z = x[:, position, :, :dim // 2] + 1j * x[:, position, :, dim // 2:]
        rotated = z * np.exp(1j * position * theta)
        out[:, position, :, :dim // 2], out[:, position, :, dim // 2:] = rotated.real, rotated.imag
    return out


def test_rope_matches_a_reference_at_several_positions():
    x = np.random.default_rng(0).standard_normal((2, 40, 3, 16))
    got = np.asarray(rotary_positions(jnp.asarray(x, jnp.float32)))
    np.testing.assert_allclose(got, _rope_reference(x), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(got[:, 0], x[:, 0], atol=1e-6)  # position 0 is not rotated
    # q·k depends only on the distance between positions
    q = np.random.default_rng(1).standard_normal(16)
    k = np.random.default_rng(2).standard_normal(16)
    tiled = lambda v: jnp.asarray(np.broadcast_to(v, (1, 40, 1, 16)), jnp.float32)  # noqa: E731
    rq, rk = np.asarray(rotary_positions(tiled(q)))[0, :, 0], np.asarray(rotary_positions(tiled(k)))[0, :, 0]
    assert rq[10] @ rk[7] == pytest.approx(rq[33] @ rk[30], rel=1e-4)
    assert rq[10] @ rk[7] != pytest.approx(rq[10] @ rk[2], rel=1e-3)


def test_exact_gelu_is_the_error_function_form_and_the_old_name_is_tanh():
    x = jnp.linspace(-6, 6, 101)
    np.testing.assert_allclose(_ACTIVATIONS["gelu_exact"](x), jax.nn.gelu(x, approximate=False), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(_ACTIVATIONS["gelu"](x), jax.nn.gelu(x, approximate=True), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(_ACTIVATIONS["gelu_tanh"](x), jax.nn.gelu(x, approximate=True), rtol=1e-6)
    assert float(jnp.max(jnp.abs(_ACTIVATIONS["gelu_exact"](x) - _ACTIVATIONS["gelu"](x)))) > 1e-4


def test_new_fields_keep_old_run_ids():
    old = TrainConfig(model=ModelConfig(activation="gelu"))
    assert config_id(dataclasses.replace(old, model=dataclasses.replace(old.model, block="gpt"))) == config_id(old)
    # gelu_tanh is the same function as the old name, so the same run
    assert config_id(override(old, ["model.activation=gelu_tanh"])) == config_id(old)
    assert config_id(override(old, ["model.activation=gelu_exact"])) != config_id(old)
    assert config_id(override(old, ["model.block=llama", "model.activation=relu"])) != config_id(old)


def test_llama_block_fixes_its_options_and_refuses_contradictions():
    llama = ModelConfig(block="llama")
    assert (llama.norm, llama.activation, llama.position, llama.use_bias) == ("pre", "swiglu", "rope", False)
    for field, value in (("norm", "post"), ("activation", "gelu"), ("position", "sinusoidal"), ("use_bias", True)):
        with pytest.raises(ValueError, match=field):
            ModelConfig(block="llama", **{field: value})
    with pytest.raises(ValueError, match="activation"):
        ModelConfig(activation="swiglu")


def test_llama_model_is_causal_and_learns_positions_through_rotation():
    config = ModelConfig(depth=2, width=64, block="llama", max_seq_len=32)
    params = init_params(config, jax.random.PRNGKey(0))
    assert "position_embedding" not in params
    names = {"/".join(str(getattr(e, "key", e)) for e in path)
             for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]}
    assert not any(name.endswith("bias") for name in names)
    assert any("wi_gate" in name for name in names)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (1, 16), 0, 256)
    logits = Transformer(config).apply({"params": params}, tokens)
    changed = Transformer(config).apply({"params": params}, tokens.at[0, 10].set((tokens[0, 10] + 1) % 256))
    np.testing.assert_allclose(logits[0, :10], changed[0, :10], atol=1e-5)  # the future is not seen
    assert np.all(np.isfinite(np.asarray(logits))) and math.isfinite(float(logits.std()))


def test_the_tiny_preset_trains_with_the_llama_block_from_the_command_line(tmp_path):
    from scaling.store import records

    done = helpers.run_module("scaling.train", "--config", "tiny", "--workdir", tmp_path / "run", "--set",
                              "model.block=llama", "--set", "steps=30", "--set", "eval_every=0", "--no-progress",
                              timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    record = records.read_record(tmp_path / "run")
    assert record.status == "finished" and math.isfinite(record.final_eval_loss)
    config = json.loads((tmp_path / "run" / "config.json").read_text())["model"]
    assert (config["block"], config["activation"], config["position"]) == ("llama", "swiglu", "rope")
    llama = ModelConfig(**{k: v for k, v in config.items()})
    assert record.params_non_embedding == 12 * llama.depth * llama.width**2  # the budget's N, as for gpt
    assert record.params_total == budget.count_params(llama)["total"]
