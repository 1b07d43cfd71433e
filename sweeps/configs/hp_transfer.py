"""Does the best learning rate stay put across widths under μP, and across depths under CompleteP?

    nohup python -m sweeps.launch run sweeps/configs/hp_transfer.py --workdir results > hp_transfer.log 2>&1 &
    python -m sweeps.launch status sweeps/configs/hp_transfer.py --workdir results   # loss per run

Loss against peak learning rate, after "Tensor Programs V" (its first
figure) and "Don't be lazy: CompleteP enables compute-efficient deep
transformers": widths 64, 128, 256 at depth 2 and depths 2, 4, 8 at width
64 (4× ranges that share the base shape 2 × 64), each under the standard
parametrization, μP and CompleteP (``optim.parametrization``; base width 64,
base depth 2, where the three are the same model), at six peak rates a
factor 2 apart, one seed. 5 shapes × 3 parametrizations × 6 rates = 90 runs.

``results/hp_transfer/README.md`` holds the pre-registered criterion, the
design and its cost, and how the outcome is read off the records.

Training setup: byte-level causal LM on the built-in corpus, pre-LN, ReLU,
feed-forward 4·d, heads of 16 channels, learned positions, sequences of 128
tokens; 600 steps of 16 sequences (1.2M tokens, 0.17 epoch: no text seen
twice), AdamW (0.9, 0.95), weight decay 0.1, clipping at 1.0, 60 warmup
steps, cosine decay to 10%; evaluated at the end on 38 batches of 16
held-out sequences (77,824 tokens).
"""

from scaling.config import DataConfig, ModelConfig, OptimConfig, TrainConfig
from sweeps.spec import Sweep, Variant

STEPS, BATCH, SEQ_LEN = 600, 16, 128
EVAL_BATCHES = 38
BASE_WIDTH, BASE_DEPTH = 64, 2
# Widths at the base depth and depths at the base width: two 4× ranges through the base shape.
WIDTHS = {BASE_DEPTH: (64, 128, 256), 4: (BASE_WIDTH,), 8: (BASE_WIDTH,)}
LEARNING_RATES = (1.25e-3, 2.5e-3, 5e-3, 1e-2, 2e-2, 4e-2)
PARAMETRIZATIONS = ("standard", "mup", "completep")


def base_config() -> TrainConfig:
    """The setup every run shares; depth, width, the peak rate and the parametrization vary."""
    return TrainConfig(
        model=ModelConfig(head_dim=16, max_seq_len=SEQ_LEN),
        data=DataConfig(source="builtin", seq_len=SEQ_LEN),
        optim=OptimConfig(peak_lr=1e-2, lr_rule="constant", base_width=BASE_WIDTH, base_depth=BASE_DEPTH,
                          warmup_steps=STEPS // 10, schedule="cosine", end_lr_fraction=0.1, weight_decay=0.1,
                          grad_clip=1.0),
        steps=STEPS, batch_size=BATCH, eval_every=0, eval_batches=EVAL_BATCHES, eval_at_start=False,
        checkpoint_every=STEPS, keep_checkpoints=1, log_every=50, wandb_mode="offline")


def sweep() -> Sweep:
    variants = tuple(Variant(name, (f"optim.parametrization={name}",)) for name in PARAMETRIZATIONS)
    return Sweep(name="hp_transfer", base=base_config(), depths=tuple(WIDTHS), widths=WIDTHS, seeds=(0,),
                 lr_grid=LEARNING_RATES, multiple_of=16, variants=variants)
