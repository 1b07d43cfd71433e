"""Parametrizations: how initial scales, Adam's numbers and the model's multipliers follow width and depth.

``optim.parametrization`` picks one; every factor is relative to a base shape
(``optim.base_width``, ``optim.base_depth``) at which all three are the same
model, so a rate tuned at the base shape means the same thing in each.
With m_N = width/base_width and m_L = depth/base_depth:

``standard``: nothing changes with the shape (``optim.lr_rule`` may still scale
the rates, see ``scaling.model.optim.learning_rates``). The residual branches' output
projections start at init_std/sqrt(2·depth) (GPT-2) in every parametrization
except ``completep``.

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
  by 1/m_N. Applied to the final hidden state, which multiplies the logits
  and the unembedding's gradient alike, as the ``mup`` package's MuReadout does;
- attention logits q·k/d_head instead of q·k/sqrt(d_head) (Definition 4.1),
  written sqrt(d_base)/d_head so it equals the standard scale at the base
  shape's head size d_base.
Not applied: zero-initialised queries and readout (section D.2, optional),
and any epsilon or weight-decay rule (Table 3 gives none; the CompleteP
authors' reference code does scale epsilon by 1/m_N under μP too).

``completep`` ("Don't be lazy: CompleteP enables compute-efficient deep
transformers", Dey et al., the α = 1 member of its depth-parametrisation
family): μP's width rules, and
- each residual branch multiplied by m_L^(-α) = base_depth/depth;
- hidden matrices' Adam rate × m_L^(α-1) = 1 (no depth factor at α = 1), and
  the hidden layers' norm scales and biases likewise;
- hidden matrices' AdamW weight decay × m_N, keeping the per-step decay
  rate·decay constant across widths (optax, like torch.optim.AdamW, decays by
  rate × weight_decay);
- Adam epsilon × 1/m_N for the embeddings, unembedding and final norm, and ×
  1/(m_N·m_L^α) for everything inside the residual blocks;
- initial variance of hidden matrices σ²/m_N, with no depth factor: the
  branches' output projections start at init_std/sqrt(2·base_depth) (the
  standard value at the base depth) at every depth, the branch multiplier
  doing the depth scaling.
Read from the paper's Table 1 as its authors implement it in the reference
code the paper links (EleutherAI/nanoGPT-mup, branch ``completep``, whose
epsilon split follows the paper's Eq. 40); the paper's PDF itself was not at
hand to check each entry against.
"""

from __future__ import annotations

import dataclasses
import math

from scaling.config import ModelConfig, OptimConfig

COMPLETEP_ALPHA = 1.0  # CompleteP's depth exponent: residual branches × (depth/base_depth)^(-α)


@dataclasses.dataclass(frozen=True)
class Multipliers:
    """The model-side numbers of a parametrization: constants of the compiled program.

    ``hidden_init`` multiplies the initial std of every hidden matrix;
    ``branch_init_depth`` is the depth L in the init_std/sqrt(2·L) start of the
    residual branches' output projections (None: the model's own depth);
    ``attention`` multiplies the 1/sqrt(d_head) of the attention logits;
    ``residual`` multiplies each residual branch (attention and feed-forward);
    ``output`` multiplies the final hidden state before the unembedding. The
    defaults are the standard parametrization.
    """

    hidden_init: float = 1.0
    branch_init_depth: int | None = None
    attention: float = 1.0
    residual: float = 1.0
    output: float = 1.0


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


def base_head_dim(optim: OptimConfig, model: ModelConfig) -> float:
    """The head size, in channels, that ``model``'s head split gives at ``optim.base_width``."""
    if model.num_heads is not None:
        return optim.base_width / model.num_heads
    return optim.base_width / max(1, optim.base_width // model.head_dim)


def multipliers(optim: OptimConfig, model: ModelConfig) -> Multipliers:
    """The model-side multipliers of ``optim.parametrization`` for ``model``'s shape."""
    if optim.parametrization == "standard":
        return Multipliers()
    m_n = width_multiplier(optim, model)
    mup = Multipliers(hidden_init=1 / math.sqrt(m_n), attention=math.sqrt(base_head_dim(optim, model)
                                                                             / model.attention_head_dim),
                      output=1 / m_n)
    if optim.parametrization == "mup":
        return mup
    return dataclasses.replace(mup, branch_init_depth=optim.base_depth,
                               residual=depth_multiplier(optim, model) ** -COMPLETEP_ALPHA)


def groups(optim: OptimConfig) -> tuple[str, ...]:
    """The parameter groups whose numbers may differ: ``hidden`` (the blocks' matrices), ``other``, and
    under CompleteP ``block`` (the blocks' norm scales and biases, whose epsilon has a depth factor)."""
    return ("hidden", "block", "other") if optim.parametrization == "completep" else ("hidden", "other")


def group_factors(optim: OptimConfig, model: ModelConfig) -> dict[str, GroupFactors]:
    """Per group (``groups``): the factors ``optim.parametrization`` puts on the peak rate, weight decay
    and epsilon. Under ``standard`` all are 1 (``lr_rule`` is applied by ``scaling.model.optim``)."""
    if optim.parametrization == "standard":
        return {group: GroupFactors() for group in groups(optim)}
    m_n = width_multiplier(optim, model)
    if optim.parametrization == "mup":
        return {"hidden": GroupFactors(lr=1 / m_n), "other": GroupFactors()}
    m_l = depth_multiplier(optim, model)
    depth_lr = m_l ** (COMPLETEP_ALPHA - 1)
    block_eps = 1 / (m_n * m_l ** COMPLETEP_ALPHA)
    return {"hidden": GroupFactors(lr=depth_lr / m_n, weight_decay=m_n, eps=block_eps),
            "block": GroupFactors(lr=depth_lr, eps=block_eps),
            "other": GroupFactors(eps=1 / m_n)}
