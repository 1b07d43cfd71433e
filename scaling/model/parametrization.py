"""Parametrizations: how initial scales, Adam's numbers and the model's multipliers follow width and depth.

``optim.parametrization`` picks one; every factor is relative to a base shape
(``optim.base_width``, ``optim.base_depth``) at which all three are the same
model, so a rate (and any other base setting) tuned at the base shape means
the same thing in each. With m_N = width/base_width and m_L = depth/base_depth:

``standard``: nothing changes with the shape (``optim.lr_rule`` may still scale
the rates, see ``scaling.model.optim.learning_rates``). The residual branches'
output projections start at init_std/sqrt(2·depth) (GPT-2).

``mup``, μP for Adam ("Tensor Programs V: Tuning Large Neural Networks via
Zero-Shot Hyperparameter Transfer", Yang et al.):
- hidden matrices (the attention's q, k, v, out and the feed-forward's
  kernels, both dimensions growing with width): initial variance ∝ 1/fan_in,
  i.e. std × m_N^(-1/2), and Adam rate ∝ 1/fan_in, i.e. × 1/m_N (Table 3,
  "Hidden weights" column);
- embeddings, biases and norm scales (one dimension growing): initial scale
  and Adam rate constant (Table 3, "Input weights & all biases");
- unembedding: the variant of Table 8 (the formulation "easier to
  implement", equivalent to Table 3 by Lemma J.1, and the one that allows
  tied embeddings): initial scale and Adam rate constant, output multiplied
  by ``optim.output_multiplier``/m_N. Applied to the final hidden state, which
  multiplies the logits and the unembedding's gradient alike, as the ``mup``
  package's ``MuReadout`` does (its ``output_mult`` is the base multiplier, a
  base setting to tune at the base shape; it multiplies the standard model too);
- attention logits q·k/d_head instead of q·k/sqrt(d_head) (Definition 4.1),
  written sqrt(d_base)/d_head so it equals the standard scale at the base
  shape's head size d_base.

``completep`` ("Don't be lazy: CompleteP enables compute-efficient deep
transformers", Dey et al., Table 1, the column of its depth family with
α = ``optim.depth_alpha``, 1 being CompleteP and 0.5 the other member the
paper compares): μP's width rules, and
- each residual branch multiplied by m_L^(-α);
- the residual blocks' Adam rates × m_L^(α-1): hidden matrices (with μP's
  1/m_N), the blocks' norm scales and biases; embeddings, final norm and
  unembedding keep theirs;
- hidden matrices' AdamW weight decay × m_N, keeping the per-step decay
  rate·decay constant across widths (optax, like torch.optim.AdamW, decays by
  rate × weight_decay);
- initial variance of hidden matrices σ²/m_N, with no depth factor: the
  branches' output projections start at init_std/sqrt(2·base_depth) (the
  standard value at the base depth) at every depth, the branch multiplier
  doing the depth scaling.

Where the references differ, or where this project's first implementation
(the one ``results/hp_transfer`` trained) departed from them, the choice is a
field of ``OptimConfig`` whose default is that first implementation, so old
run ids and results stay as they were:

- ``eps_rule``, Adam's epsilon under μP and CompleteP, with f = 1/m_N (μP) or
  1/(m_N·m_L^α) (CompleteP): ``blocks`` multiplies the residual blocks'
  epsilon by f and leaves embeddings, final norm and unembedding at the base
  value (CompleteP's Table 1, last row, for both μP and α: "AdamW ε (residual
  blocks)"); ``all`` multiplies every parameter's by f (the reference code the
  paper links, EleutherAI/nanoGPT-mup branch ``completep``, scales the one
  optimizer-wide epsilon; it scales none under μP alone); ``none`` scales
  nothing (the ``mup`` package's ``MuAdam``; Tensor Programs V gives no
  epsilon rule); ``first``: none under μP and, under CompleteP, f on the blocks
  and 1/m_N on the rest, which matches neither reference (an error of the
  first implementation, kept only so its records re-derive).
- ``mup_weight_decay``: ``width`` multiplies μP's hidden weight decay by m_N
  (the ``mup`` package's ``MuAdamW`` by default, decoupled_wd=False, and
  Table 1's μP column); ``constant`` leaves it (``MuAdamW(decoupled_wd=True)``,
  the reference code's μP branch, and the first implementation). CompleteP
  always scales it (Table 1 and the reference code agree).
- ``mup_out_init``: ``gpt2`` keeps GPT-2's init_std/sqrt(2·depth) on μP's
  output projections (the first implementation: μP has no depth rule, and this
  one factor makes its initialisation change with depth); ``base`` starts them
  at init_std/sqrt(2·base_depth) at every depth, as Table 1's "Hidden Init.
  Var." σ²/m_N without a depth factor, and as the reference code (which has no
  factor at all: the constant is part of the base std).
- ``output_multiplier``: the readout's base multiplier (above).
- ``zero_init_readout``, ``zero_init_query``: start the unembedding and the
  attention's query projections at zero (Tensor Programs V, section D.2, an
  optional recommendation; off in the first implementation). A zero readout
  makes the initial logits uniform; zero queries make the initial attention
  uniform, so neither depends on the width at initialisation.
- ``eps``: the base epsilon, 1e-8 here and 1e-12 in the reference code.
"""

from __future__ import annotations

import dataclasses
import math

from scaling.config import ModelConfig, OptimConfig


@dataclasses.dataclass(frozen=True)
class Multipliers:
    """The model-side numbers of a parametrization: constants of the compiled program.

    ``hidden_init`` multiplies the initial std of every hidden matrix;
    ``branch_init_depth`` is the depth L in the init_std/sqrt(2·L) start of the
    residual branches' output projections (None: the model's own depth);
    ``attention`` multiplies the 1/sqrt(d_head) of the attention logits;
    ``residual`` multiplies each residual branch (attention and feed-forward);
    ``output`` multiplies the final hidden state before the unembedding;
    ``zero_readout`` and ``zero_query`` start the unembedding and the query
    projections at zero. The defaults are the standard parametrization.
    """

    hidden_init: float = 1.0
    branch_init_depth: int | None = None
    attention: float = 1.0
    residual: float = 1.0
    output: float = 1.0
    zero_readout: bool = False
    zero_query: bool = False


@dataclasses.dataclass(frozen=True)
class GroupFactors:
    """Factors on ``peak_lr``, ``weight_decay`` and ``eps`` for one group of parameters."""

    lr: float = 1.0
    weight_decay: float = 1.0
    eps: float = 1.0


def width_multiplier(optim: OptimConfig, model: ModelConfig) -> float:
    """m_N = width / base_width."""
    return model.width / optim.base_width


def depth_multiplier(optim: OptimConfig, model: ModelConfig) -> float:
    """m_L = depth / base_depth."""
    return model.depth / optim.base_depth


def depth_alpha(optim: OptimConfig) -> float:
    """The depth exponent α of ``optim``'s parametrization: ``optim.depth_alpha`` under CompleteP, else 0."""
    return optim.depth_alpha if optim.parametrization == "completep" else 0.0


def base_head_dim(optim: OptimConfig, model: ModelConfig) -> float:
    """The head size, in channels, that ``model``'s head split gives at ``optim.base_width``."""
    if model.num_heads is not None:
        return optim.base_width / model.num_heads
    return optim.base_width / max(1, optim.base_width // model.head_dim)


def multipliers(optim: OptimConfig, model: ModelConfig) -> Multipliers:
    """The model-side multipliers of ``optim.parametrization`` for ``model``'s shape."""
    zeros = {"zero_readout": optim.zero_init_readout, "zero_query": optim.zero_init_query}
    if optim.parametrization == "standard":
        return Multipliers(output=optim.output_multiplier, **zeros)
    m_n = width_multiplier(optim, model)
    mup = Multipliers(hidden_init=1 / math.sqrt(m_n), attention=math.sqrt(base_head_dim(optim, model)
                                                                             / model.attention_head_dim),
                      output=optim.output_multiplier / m_n, **zeros,
                      branch_init_depth=optim.base_depth if optim.mup_out_init == "base" else None)
    if optim.parametrization == "mup":
        return mup
    return dataclasses.replace(mup, branch_init_depth=optim.base_depth,
                               residual=depth_multiplier(optim, model) ** -depth_alpha(optim))


def groups(optim: OptimConfig) -> tuple[str, ...]:
    """The parameter groups whose numbers may differ: ``hidden`` (the blocks' matrices), ``other``, and
    ``block`` (the blocks' norm scales and biases) where their numbers differ from the others': under
    CompleteP, and under μP with ``eps_rule="blocks"``."""
    blocks = optim.parametrization == "completep" or (optim.parametrization == "mup" and optim.eps_rule == "blocks")
    return ("hidden", "block", "other") if blocks else ("hidden", "other")


def _eps_factors(optim: OptimConfig, m_n: float, m_l: float) -> dict[str, float]:
    """Epsilon's factor per group under ``optim.eps_rule`` (the module's docstring gives each rule's source)."""
    shape_factor = 1 / (m_n * m_l ** depth_alpha(optim))  # 1/m_N under μP
    if optim.eps_rule == "none" or (optim.eps_rule == "first" and optim.parametrization == "mup"):
        return {"hidden": 1.0, "block": 1.0, "other": 1.0}
    if optim.eps_rule == "all":
        return {"hidden": shape_factor, "block": shape_factor, "other": shape_factor}
    outside = 1 / m_n if optim.eps_rule == "first" else 1.0  # "first" (CompleteP only here) or "blocks"
    return {"hidden": shape_factor, "block": shape_factor, "other": outside}


def group_factors(optim: OptimConfig, model: ModelConfig) -> dict[str, GroupFactors]:
    """Per group (``groups``): the factors ``optim.parametrization`` puts on the peak rate, weight decay
    and epsilon. Under ``standard`` all are 1 (``lr_rule`` is applied by ``scaling.model.optim``)."""
    if optim.parametrization == "standard":
        return {group: GroupFactors() for group in groups(optim)}
    m_n, m_l = width_multiplier(optim, model), depth_multiplier(optim, model)
    depth_lr = m_l ** (depth_alpha(optim) - 1) if optim.parametrization == "completep" else 1.0
    scaled_decay = optim.parametrization == "completep" or optim.mup_weight_decay == "width"
    eps = _eps_factors(optim, m_n, m_l)
    factors = {"hidden": GroupFactors(lr=depth_lr / m_n, weight_decay=m_n if scaled_decay else 1.0,
                                      eps=eps["hidden"]),
               "block": GroupFactors(lr=depth_lr, eps=eps["block"]),
               "other": GroupFactors(eps=eps["other"])}
    return {group: factors[group] for group in groups(optim)}
