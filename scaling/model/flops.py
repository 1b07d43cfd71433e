"""The one count of a training step's model FLOPs, shared by the dry run, the preflight, the trainer's MFU
and the benchmarks.

Per trained token, forward + backward (the backward pass costs twice the
forward, so training is 3 × forward, and a matmul costs 2 FLOPs per
multiply-add):

- ``layers``: 6·L·(4·d² + 2·d·f), the attention projections (q, k, v, out)
  and the feed-forward (d -> f -> d) of every layer; with f = 4d this is
  6·N, N = 12·L·d² the budget's non-embedding parameters;
- ``unembedding``: 6·V·d for the output projection onto the V real ids
  (counted whether or not it is tied to the embedding; the embedding lookup
  is a gather and costs nothing; ids padding the vocabulary are
  implementation overhead and not counted);
- ``attention``: 12·L·T·d for the scores q·kᵀ and the weighted sum of
  values over all T positions of a sequence (2·T·d each per query and layer,
  forward; a causal mask discards half of the scores but they are computed).

``total`` is what model FLOPs utilisation divides by, as in "PaLM: Scaling
Language Modeling with Pathways" (appendix B), which also counts attention.
Norms, softmaxes, the optimizer and evaluation are not counted.
"""

from __future__ import annotations

import dataclasses

from scaling.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class TrainingFlops:
    """Training FLOPs per token, by part (see the module docstring); ``total`` is their sum."""

    layers: float
    unembedding: float
    attention: float

    @property
    def total(self) -> float:
        return self.layers + self.unembedding + self.attention


def training_flops_per_token(model: ModelConfig, seq_len: int) -> TrainingFlops:
    """Forward + backward FLOPs per trained token of ``model`` on sequences of ``seq_len`` tokens.

    ``total`` = 6·(L·(4·d² + m·d·f) + V·d) + 12·L·T·d, in FLOPs per token, where f is the
    feed-forward width and m its matrix count (2, or 3 for the llama block's SwiGLU).
    """
    if seq_len < 1:
        raise ValueError(f"seq_len={seq_len!r} is invalid: allowed an integer >= 1")
    depth, width = model.depth, model.width
    return TrainingFlops(layers=6.0 * depth * (4 * width**2 + model.ff_matrices * width * model.ff_width),
                         unembedding=6.0 * model.vocab_size * width,
                         attention=12.0 * depth * seq_len * width)


def model_flops_utilization(model: ModelConfig, seq_len: int, tokens_per_second: float, peak_flops: float,
                            devices: int) -> float:
    """Model FLOPs utilisation: model FLOPs per second / (``devices`` × ``peak_flops`` per device).

    The one definition, used by the trainer's logged ``mfu`` (measured
    tokens/s) and the preflight's ``estimated_mfu`` (tokens per step / the
    estimated step time). Model FLOPs are ``training_flops_per_token``'s:
    what the model needs, not what the compiled step executes, so remat's
    recomputed forward passes, skipped causal blocks and padding ids are
    cost or savings of the implementation, never useful work.
    """
    return tokens_per_second * training_flops_per_token(model, seq_len).total / (peak_flops * devices)
