"""Each parametrization rule against a table written from the references, one test per rule.

The references, cited in every row:
- TP5: "Tensor Programs V: Tuning Large Neural Networks via Zero-Shot Hyperparameter Transfer" (Yang et
  al.): Table 3 (μP for Adam: hidden weights' rate ∝ 1/fan_in, input weights and all biases constant),
  Table 8 (the readout written as a multiplier 1/width on its input), Definition 4.1 (attention logits
  1/d_head), section D.2 (zero readout and zero query, optional);
- mup: the authors' package (microsoft/mup): ``MuAdamW`` divides the rate of matrix-like parameters by
  width_mult and, by default (decoupled_wd=False), multiplies their weight decay by it; ``MuReadout``
  multiplies its input by output_mult/width_mult;
- CP1: "Don't be lazy: CompleteP enables compute-efficient deep transformers" (Dey et al.), Table 1:
  the SP, μP and α columns (embeddings, pre-LN, hidden weights and biases, residual branches, final LN,
  unembedding, and the last row, AdamW ε of the residual blocks);
- CPcode: the reference code that paper links (EleutherAI/nanoGPT-mup, branch completep): one epsilon
  for every parameter, scaled by 1/(m_N·m_L^α) under CompleteP and not at all under μP alone.

The shape is m_N = 4 (width 256 over 64) and m_L = 4 (depth 8 over 2); every factor below is what the
reference says relative to the base shape, written as a power of m_N and m_L.
"""

import dataclasses
import math

import jax
import numpy as np
import pytest

from model_params import init_params
from scaling.config import ModelConfig, OptimConfig, TrainConfig, config_id
from scaling.overrides import override
from scaling.model import optim as optim_lib, parametrization
from scaling.model.transformer import attention_logit_scale

M_N, M_L = 4.0, 4.0
MODEL = ModelConfig(depth=8, width=256, num_heads=2, max_seq_len=16, use_bias=True)  # heads of 128, 32 at base
BASE = OptimConfig(peak_lr=1.0, weight_decay=1.0, eps=1.0, base_width=64, base_depth=2)

# Parameter kinds: a path in the parameter tree of MODEL (scanned layers).
KINDS = {"embedding": ("token_embedding", "embedding"), "position": ("position_embedding",),
         "hidden": ("layers", "mlp", "wi", "kernel"), "query": ("layers", "attention", "query", "kernel"),
         "out_projection": ("layers", "attention", "out", "kernel"), "hidden_bias": ("layers", "mlp", "wi", "bias"),
         "block_norm": ("layers", "attention_norm", "scale"), "final_norm": ("final_norm", "scale"),
         "unembedding": ("unembedding", "kernel")}
ALIGNED = {"eps_rule": "blocks", "mup_weight_decay": "width", "mup_out_init": "base"}

# (reference, parametrization, options, kind, quantity, factor as a function of α). Weight decay is the
# AdamW decay coefficient where the project decays (matrices and embeddings; CP1 and CPcode decay no
# norm or bias either) and None where it does not.
OPTIMIZER_RULES = [
    ("TP5 Table 3: hidden weights' Adam rate 1/fan_in", "mup", {}, "hidden", "lr", lambda a: 1 / M_N),
    ("TP5 Table 3: input weights' Adam rate constant", "mup", {}, "embedding", "lr", lambda a: 1.0),
    ("TP5 Table 3: biases' Adam rate constant", "mup", {}, "hidden_bias", "lr", lambda a: 1.0),
    ("TP5 Table 8: readout's Adam rate constant (multiplier form)", "mup", {}, "unembedding", "lr", lambda a: 1.0),
    ("CP1 μP: pre-LN rate constant", "mup", {}, "block_norm", "lr", lambda a: 1.0),
    ("mup MuAdamW default, CP1 μP: hidden weight decay × m_N", "mup", ALIGNED, "hidden", "weight_decay",
     lambda a: M_N),
    ("MuAdamW(decoupled_wd=True), CPcode μP: hidden weight decay constant", "mup", {}, "hidden", "weight_decay",
     lambda a: 1.0),
    ("CP1 μP: embedding weight decay constant", "mup", ALIGNED, "embedding", "weight_decay", lambda a: 1.0),
    ("CP1 μP last row: residual blocks' ε × 1/m_N (matrices)", "mup", ALIGNED, "hidden", "eps", lambda a: 1 / M_N),
    ("CP1 μP last row: residual blocks' ε × 1/m_N (norms)", "mup", ALIGNED, "block_norm", "eps", lambda a: 1 / M_N),
    ("CP1 μP last row: residual blocks' ε × 1/m_N (biases)", "mup", ALIGNED, "hidden_bias", "eps",
     lambda a: 1 / M_N),
    ("CP1 last row: embedding ε unscaled (outside the blocks)", "mup", ALIGNED, "embedding", "eps", lambda a: 1.0),
    ("CP1 last row: final-norm ε unscaled", "mup", ALIGNED, "final_norm", "eps", lambda a: 1.0),
    ("CP1 last row: unembedding ε unscaled", "mup", ALIGNED, "unembedding", "eps", lambda a: 1.0),
    ("mup MuAdam, CPcode μP: no ε rule (the first implementation)", "mup", {}, "hidden", "eps", lambda a: 1.0),
    ("CP1 α: hidden rate × m_N^-1 m_L^(α-1)", "completep", ALIGNED, "hidden", "lr", lambda a: M_L ** (a - 1) / M_N),
    ("CP1 α: hidden bias rate × m_L^(α-1)", "completep", ALIGNED, "hidden_bias", "lr", lambda a: M_L ** (a - 1)),
    ("CP1 α: pre-LN rate × m_L^(α-1)", "completep", ALIGNED, "block_norm", "lr", lambda a: M_L ** (a - 1)),
    ("CP1 α: embedding rate constant", "completep", ALIGNED, "embedding", "lr", lambda a: 1.0),
    ("CP1 α: final-LN rate constant", "completep", ALIGNED, "final_norm", "lr", lambda a: 1.0),
    ("CP1 α: unembedding rate constant", "completep", ALIGNED, "unembedding", "lr", lambda a: 1.0),
    ("CP1 α: hidden weight decay × m_N", "completep", ALIGNED, "hidden", "weight_decay", lambda a: M_N),
    ("CP1 α: embedding weight decay constant", "completep", ALIGNED, "embedding", "weight_decay", lambda a: 1.0),
    ("CP1 α: norms not decayed", "completep", ALIGNED, "block_norm", "weight_decay", lambda a: None),
    ("CP1 α last row: blocks' ε × m_N^-1 m_L^-α (matrices)", "completep", ALIGNED, "hidden", "eps",
     lambda a: 1 / (M_N * M_L ** a)),
    ("CP1 α last row: blocks' ε × m_N^-1 m_L^-α (norms)", "completep", ALIGNED, "block_norm", "eps",
     lambda a: 1 / (M_N * M_L ** a)),
    ("CP1 α last row: embedding ε unscaled", "completep", ALIGNED, "embedding", "eps", lambda a: 1.0),
    ("CP1 α last row: final-norm ε unscaled", "completep", ALIGNED, "final_norm", "eps", lambda a: 1.0),
    ("CP1 α last row: unembedding ε unscaled", "completep", ALIGNED, "unembedding", "eps", lambda a: 1.0),
    ("CPcode: one ε for all, × m_N^-1 m_L^-α (embedding)", "completep", {"eps_rule": "all"}, "embedding", "eps",
     lambda a: 1 / (M_N * M_L ** a)),
    ("CPcode: one ε for all, × m_N^-1 m_L^-α (final norm)", "completep", {"eps_rule": "all"}, "final_norm", "eps",
     lambda a: 1 / (M_N * M_L ** a)),
    ("first implementation (matches neither): CompleteP's embedding ε × 1/m_N", "completep", {}, "embedding",
     "eps", lambda a: 1 / M_N),
    ("CP1 SP column: standard changes nothing (hidden rate)", "standard", ALIGNED, "hidden", "lr", lambda a: 1.0),
    ("CP1 SP column: standard changes nothing (hidden ε)", "standard", ALIGNED, "hidden", "eps", lambda a: 1.0),
]


def _optim(name, options, alpha=1.0):
    return dataclasses.replace(BASE, parametrization=name, **options,
                               **({"depth_alpha": alpha} if name == "completep" else {}))


def _leaf_paths(params):
    return {tuple(key for key in (jax.tree_util.keystr((entry,), simple=True) for entry in path)): path
            for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]}


@pytest.fixture(scope="module")
def paths():
    """Each kind's flax path in a real parameter tree (what ``optim.group_of`` sees in the trainer)."""
    found = _leaf_paths(init_params(MODEL, jax.random.PRNGKey(0)))
    return {kind: found[path] for kind, path in KINDS.items()}


def numbers(optim, path) -> dict:
    """The rate, weight decay (None where the parameter is not decayed) and ε the trainer gives ``path``."""
    group = optim_lib.group_of(optim, path)
    hp = optim_lib.hyperparameters(optim, MODEL, total_steps=10)
    decays = optim_lib._decays(path)
    return {"lr": float(hp[f"lr_{group}"]), "eps": float(hp[f"eps_{group}"]),
            "weight_decay": float(hp[f"weight_decay_{group}"]) if decays else None}


@pytest.mark.parametrize("alpha", [1.0, 0.5])
@pytest.mark.parametrize("reference,name,options,kind,quantity,factor", OPTIMIZER_RULES,
                         ids=[rule[0] for rule in OPTIMIZER_RULES])
def test_optimizer_rule(paths, reference, name, options, kind, quantity, factor, alpha):
    if alpha != 1.0 and name != "completep":
        pytest.skip("α is CompleteP's")
    got = numbers(_optim(name, options, alpha), paths[kind])[quantity]
    expected = factor(alpha)
    assert (got is None) if expected is None else got == pytest.approx(expected, rel=1e-6), reference


# Model-side rules: the multipliers the compiled program takes, and what initialisation makes of them.
MODEL_RULES = [
    ("TP5 Table 3, CP1: hidden init variance × 1/m_N", "mup", {}, "hidden_init", lambda a: M_N ** -0.5),
    ("TP5 Definition 4.1: attention 1/d_head, equal to 1/sqrt(d_head) at the base head size", "mup", {},
     "attention", lambda a: math.sqrt(32) / 128 * math.sqrt(128)),
    ("TP5 Table 8, mup MuReadout, CP1 Unembed Fwd: output × output_mult/m_N", "mup", {"output_multiplier": 3.0},
     "output", lambda a: 3.0 / M_N),
    ("mup MuReadout output_mult: a base setting the standard model takes too", "standard",
     {"output_multiplier": 3.0}, "output", lambda a: 3.0),
    ("CP1 α: residual branches × m_L^-α", "completep", ALIGNED, "residual", lambda a: M_L ** -a),
    ("CP1 μP: no residual multiplier", "mup", ALIGNED, "residual", lambda a: 1.0),
    ("CP1 α: hidden init without a depth factor (output projections start at the base depth's value)",
     "completep", ALIGNED, "branch_init_depth", lambda a: 2),
    ("CP1 μP, CPcode: μP's output projections without GPT-2's depth factor", "mup", ALIGNED, "branch_init_depth",
     lambda a: 2),
    ("first implementation: μP keeps GPT-2's 1/sqrt(2·depth)", "mup", {}, "branch_init_depth", lambda a: None),
    ("TP5 section D.2: zero readout (optional)", "mup", {"zero_init_readout": True}, "zero_readout", lambda a: True),
    ("TP5 section D.2: zero query (optional)", "completep", {"zero_init_query": True}, "zero_query", lambda a: True),
]


@pytest.mark.parametrize("alpha", [1.0, 0.5])
@pytest.mark.parametrize("reference,name,options,field,value", MODEL_RULES, ids=[rule[0] for rule in MODEL_RULES])
def test_model_rule(reference, name, options, field, value, alpha):
    if alpha != 1.0 and name != "completep":
        pytest.skip("α is CompleteP's")
    got = getattr(parametrization.multipliers(_optim(name, options, alpha), MODEL), field)
    expected = value(alpha)
    assert got == (pytest.approx(expected) if isinstance(expected, float) else expected), reference


def test_attention_scale_is_one_over_head_size():
    """TP5 Definition 4.1, as the model applies it: sqrt(d_base)/d_head = sqrt(32)/128."""
    scales = parametrization.multipliers(_optim("mup", {}), MODEL)
    assert float(attention_logit_scale(MODEL, 8, None, scales.attention)) == pytest.approx(math.sqrt(32) / 128)


def _std(params, *path):
    for key in path:
        params = params[key]
    return float(np.std(np.asarray(params)))


def test_zero_readout_and_query_start_at_zero_and_nothing_else_does():
    """TP5 section D.2: the unembedding and the query projections start at zero; keys, values and the
    embedding keep their normal start."""
    optim = _optim("mup", {"zero_init_readout": True, "zero_init_query": True})
    params = init_params(MODEL, jax.random.PRNGKey(0), multipliers=parametrization.multipliers(optim, MODEL))
    assert not np.any(np.asarray(params["unembedding"]["kernel"]))
    assert not np.any(np.asarray(params["layers"]["attention"]["query"]["kernel"]))
    assert _std(params, "layers", "attention", "key", "kernel") == pytest.approx(0.01, rel=0.05)
    assert _std(params, "token_embedding", "embedding") > 0


@pytest.mark.parametrize("out_init,depth,expected",
                         [("gpt2", 8, 0.01 / 4), ("base", 8, 0.01 / 2), ("base", 2, 0.01 / 2)])
def test_mup_output_projection_init_by_named_choice(out_init, depth, expected):
    """CP1's hidden init σ²/m_N has no depth factor (``base``); the first implementation kept GPT-2's
    1/sqrt(2·depth) (``gpt2``). Width 256 over 64: σ = 0.02/2; at depth 8, sqrt(2·8) = 4, sqrt(2·2) = 2."""
    model = dataclasses.replace(MODEL, depth=depth, use_bias=False)
    optim = _optim("mup", {"mup_out_init": out_init})
    params = init_params(model, jax.random.PRNGKey(0), multipliers=parametrization.multipliers(optim, model))
    assert _std(params, "layers", "attention", "out", "kernel") == pytest.approx(expected, rel=0.05)


def test_every_new_choice_at_its_first_value_keeps_the_run_id_and_any_other_value_changes_it():
    base = TrainConfig(optim=OptimConfig(parametrization="completep"))
    first = ["optim.depth_alpha=1.0", "optim.eps_rule=first", "optim.mup_weight_decay=constant",
             "optim.mup_out_init=gpt2", "optim.output_multiplier=1.0", "optim.zero_init_readout=false",
             "optim.zero_init_query=false"]
    assert config_id(override(base, first)) == config_id(base)
    others = ["optim.depth_alpha=0.5", "optim.eps_rule=blocks", "optim.mup_weight_decay=width",
              "optim.mup_out_init=base", "optim.output_multiplier=2", "optim.zero_init_readout=true",
              "optim.zero_init_query=true"]
    assert len({config_id(override(base, [change])) for change in others} | {config_id(base)}) == len(others) + 1


@pytest.mark.parametrize("assignments,field", [
    (["optim.depth_alpha=0.5"], "depth_alpha"),  # standard has no depth rule
    (["optim.parametrization=completep", "optim.depth_alpha=0.3"], "depth_alpha"),
    (["optim.eps_rule=half"], "eps_rule"),
    (["optim.zero_init_readout=true", "model.tie_embeddings=true"], "zero_init_readout"),
    (["optim.output_multiplier=0"], "output_multiplier"),
])
def test_bad_choices_are_refused_naming_the_field(assignments, field):
    with pytest.raises(ValueError, match=field):
        override(TrainConfig(), assignments)


@pytest.mark.parametrize("name", ["mup", "completep"])
def test_at_the_base_shape_the_references_rules_and_base_settings_are_the_standard_model(name):
    """Every new choice is relative to the base shape: there, μP and CompleteP with the references' rules and
    any base setting give the standard model's multipliers and optimizer numbers."""
    model = dataclasses.replace(MODEL, depth=2, width=64)
    options = {**ALIGNED, "output_multiplier": 2.0, "zero_init_readout": True, "zero_init_query": True}
    standard, other = _optim("standard", options), _optim(name, options, alpha=0.5 if name == "completep" else 1.0)
    assert parametrization.multipliers(other, model) == dataclasses.replace(
        parametrization.multipliers(standard, model), branch_init_depth=2)  # the standard's own depth, 2
    assert not optim_lib.grouped(other, model)
    numbers_of = lambda optim: set(optim_lib._group_numbers(optim, model).values())  # noqa: E731
    assert numbers_of(other) == numbers_of(standard)
