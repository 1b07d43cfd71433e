"""Smoke sweep: the whole pipeline in a few minutes on a laptop CPU.

    python -m sweeps.launch run sweeps/configs/smoke.py --workdir runs

Depths 1 and 2 × budgets N = 12·L·d² of 2e4, 6e4 and 2e5 parameters × one
seed: six byte-level causal LMs on the built-in corpus (Python 3.11 docs).
Each trains 500 steps of 16 × 64 tokens (512K tokens) and is evaluated on
8 held-out batches (8K tokens). Widths are multiples of 16 with 16-channel
heads. The learning-rate rule is μP-style ('mup': hidden matrices get
3e-3 · 64/width, embeddings and norms 3e-3).

It shows the machinery, not the science: at these sizes the shallower net
should win at every budget (the "too deep for its size" regime), and one
seed cannot tell significant gaps from noise, so the summary says the
transition analysis needs more seeds. For that, see cpu_depth.py.
It takes a few minutes on 2 CPU cores, start-up and summary included.
"""

from scaling.config import DataConfig, ModelConfig, OptimConfig, TrainConfig
from sweeps.spec import Sweep


def sweep() -> Sweep:
    base = TrainConfig(
        model=ModelConfig(head_dim=16, max_seq_len=64),
        data=DataConfig(source="builtin", seq_len=64),
        optim=OptimConfig(peak_lr=3e-3, lr_rule="mup", base_width=64, warmup_steps=50),
        steps=500, batch_size=16, eval_every=0, eval_batches=8, checkpoint_every=250, log_every=25,
        wandb_mode="offline")
    return Sweep(name="smoke", base=base, depths=(1, 2), budgets=(2e4, 6e4, 2e5), seeds=(0,), multiple_of=16)
