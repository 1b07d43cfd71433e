"""CPU-scale depth-efficiency experiment: depths 2, 3, 4, 6 at N ≈ 6e5, 1.2e6 and 2.4e6, three seeds each.

This file holds what every stage of the experiment shares (``base_config``)
and the main sweep (``sweep``). The stages run in this order:

    python -m sweeps.launch run sweeps/configs/cpu_depth_lr.py --workdir results     # stage 0: learning rates
    python -m sweeps.launch run sweeps/configs/cpu_depth.py --workdir results --only '*-s0'   # stage 1: scout
    python -m sweeps.launch run sweeps/configs/cpu_depth.py --workdir results        # stage 2: all seeds
    python -m analysis fit results/cpu_depth --json

The main sweep: three sizes per depth on a ×2 ladder, N ≈ 6e5, 1.2e6 and
2.4e6, three seeds each. Widths are given per depth (multiples of the 16-
channel head) rather than solved from shared budgets, because the analysis
compares a pair at the shallower depth's sizes and interpolates the deeper
depth only within its own range (plus 5%): each deeper depth's sizes must
reach at least as low and as high as the shallower one's. Depth 6 therefore
runs at d = 80 and 192 (N = 4.6e5 and 2.65e6) at the ends. The seed-0 runs
at N ≈ 1.2e6 are the stage-0 calibration runs at the chosen rate (same
config, same run id).

``results/cpu_depth/README.md`` holds the design, the pre-registered success
criterion, what each stage found and the commands behind every number.

Shared training setup: byte-level causal LM on the built-in corpus, pre-LN,
ReLU, feed-forward 4·d, 16-channel heads, learned positions, sequences of 128
tokens. Every run sees the same 4.1M tokens (1000 steps × 32 × 128; 0.57
epoch of the corpus, so no text is seen twice) and is evaluated on 38
batches of 32 held-out sequences (155,648 tokens: all but 7 of the 1,223
held-out windows) at the midpoint and the end. AdamW (0.9, 0.95), weight
decay 0.1, clipping at 1.0, 100 warmup steps, cosine decay to 10%.
"""

from scaling.config import DataConfig, ModelConfig, OptimConfig, TrainConfig
from sweeps.spec import Sweep

STEPS, BATCH, SEQ_LEN = 1000, 32, 128
EVAL_BATCHES = 38  # 38 × 32 = 1,216 of the 1,223 held-out windows of 128 tokens


def base_config(peak_lr: float = 2e-3) -> TrainConfig:
    """The training setup every stage shares; only depth, width, seed and the peak rate vary."""
    return TrainConfig(
        model=ModelConfig(head_dim=16, max_seq_len=SEQ_LEN),
        data=DataConfig(source="builtin", seq_len=SEQ_LEN),
        optim=OptimConfig(peak_lr=peak_lr, lr_rule="constant", warmup_steps=100, schedule="cosine",
                          end_lr_fraction=0.1, weight_decay=0.1, grad_clip=1.0),
        steps=STEPS, batch_size=BATCH, eval_every=STEPS // 2, eval_batches=EVAL_BATCHES,
        checkpoint_every=250, log_every=20, wandb_mode="offline")


# N = 12·L·d²: depth 2: 6.1e5, 1.20e6, 2.46e6; depth 3: 5.9e5, 1.12e6, 2.36e6;
# depth 4: 6.0e5, 1.23e6, 2.41e6; depth 6: 4.6e5, 1.18e6, 2.65e6.
WIDTHS = {2: (160, 224, 320), 3: (128, 176, 256), 4: (112, 160, 224), 6: (80, 128, 192)}
# The best stage-0 rate of each depth (results/cpu_depth/README.md, "Stage 0: learning rates").
PEAK_LR = {2: 4e-3, 3: 2e-3, 4: 4e-3, 6: 4e-3}


def sweep() -> Sweep:
    return Sweep(name="cpu_depth", base=base_config(), depths=tuple(WIDTHS), widths=WIDTHS, seeds=(0, 1, 2),
                 peak_lr_by_depth=PEAK_LR, multiple_of=16)
