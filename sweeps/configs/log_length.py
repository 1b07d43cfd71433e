"""Log-length attention scaling and length generalisation on FIRST and PARITY.

    python -m sweeps.launch run sweeps/configs/log_length.py --workdir results
    python -m analysis log-length results/log_length        # table (and --figure PATH)

After "Overcoming a Theoretical Limitation of Self-Attention" (Chiang and
Cholak, 2022), sections 4.1 and 4.4: train a small post-LN transformer
encoder on bit strings of one length n and test it on strings of length
1000, with standard attention (logits / sqrt(d)) against log-length scaled
attention (logits · log(n + 1) / sqrt(d), n + 1 tokens with CLS).

Settings the paper gives, followed: as many layers and heads as its exact
solutions (2 layers; FIRST 1 head, PARITY 2 heads), d_model = 16,
d_FFNN = 64, LayerNorm after each residual connection, PyTorch's default
initialization (``init_scheme="torch"``), Adam at 3e-4, no dropout, input
CLS·w with the label read at CLS through a two-way output (the sigmoid
layer), 100 training strings per epoch.
Settings the paper leaves open, chosen here: a fixed set of 100 training
strings per seed (200 epochs of 10 steps of 10 strings = 2,000 steps);
PyTorch's Adam (betas 0.9/0.999, eps 1e-8, no weight decay, no clipping,
constant rate); biases in every linear layer, initialised to zero; learned
position embeddings for 1001 positions (N(0, 1), as nn.Embedding); a test
set of 1,000 strings of length 1000 (the paper's figure uses 100 per epoch),
the same for every run.

Grid: FIRST at n = 10, 30, 100, 300 with 10 seeds per arm (5 at n = 300,
for time); PARITY at n = 30, 100 with 5 seeds per arm. 90 runs.

Second grid, FIRST as the paper's authors trained it (``first-authors-*``, their
published script first.py): no learned position table but a fixed code marking
position 1, a fresh random string at every step, one string per step for
10,000 steps; FIRST at n = 10, 30, 100, 300, 20 seeds per arm (as the paper's
curves average 20 trials), tested on the same 1,000 strings of length 1000.
160 runs.
"""

from scaling.config import AttentionScale, DataConfig, ModelConfig, OptimConfig, TrainConfig, choices
from sweeps.spec import Sweep, Variant

TEST_LENGTH = 1000
TEST_STRINGS = 1000
TRAIN_STRINGS = 100
EPOCHS = 200
BATCH = 10
ARMS = choices(AttentionScale)  # standard, log_length
# task -> (heads, training lengths, seeds)
TASKS = {"first": (1, (10, 30, 100, 300), tuple(range(10))),
         "parity": (2, (30, 100), tuple(range(5)))}
# The planned grid (10 seeds per FIRST arm) did not fit the 1.5 h of a shared
# 2-core machine: one n = 300 run cost ~110 s against ~32 s at n = 10, so the
# longest length gets fewer seeds (see results/log_length/README.md).
SEEDS_OVERRIDE = {("first", 300): tuple(range(5))}


def base_config() -> TrainConfig:
    return TrainConfig(
        model=ModelConfig(depth=2, width=16, num_heads=1, ff_multiplier=4, max_seq_len=TEST_LENGTH + 1,
                          objective="masked", norm="post", activation="relu", position="learned",
                          use_bias=True, init_scheme="torch"),
        data=DataConfig(source="first", seq_len=TEST_LENGTH + 1, synthetic_min_length=10,
                        synthetic_max_length=10, synthetic_eval_min_length=TEST_LENGTH,
                        synthetic_eval_max_length=TEST_LENGTH, synthetic_train_size=TRAIN_STRINGS),
        optim=OptimConfig(peak_lr=3e-4, warmup_steps=0, schedule="constant", weight_decay=0.0, beta1=0.9,
                          beta2=0.999, eps=1e-8, grad_clip=0.0),
        steps=EPOCHS * TRAIN_STRINGS // BATCH, batch_size=BATCH, eval_every=0, eval_batches=TEST_STRINGS // BATCH,
        # One evaluation at length 1000 costs about as much as 1,000 training steps at n = 10: only the final one.
        eval_at_start=False, checkpoint_every=EPOCHS * TRAIN_STRINGS // BATCH, keep_checkpoints=1, log_every=50,
        wandb_mode="disabled")


# FIRST as its authors trained it (the training script published with the paper,
# first.py in github.com/ndnlp/parity): a fixed position code that only marks
# position 1 (``model.position=first_indicator``), a fresh random string at every
# step (no fixed training set), one string per step, 100 epochs of 100 steps.
AUTHORS_LENGTHS = (10, 30, 100, 300)
AUTHORS_SEEDS = tuple(range(20))
AUTHORS_STEPS = 10_000
AUTHORS_OVERRIDES = ("model.position=first_indicator", "data.synthetic_train_size=0", "batch_size=1",
                     f"steps={AUTHORS_STEPS}", f"eval_batches={TEST_STRINGS}", f"checkpoint_every={AUTHORS_STEPS}",
                     "log_every=100")


def variants() -> tuple[Variant, ...]:
    out = []
    for task, (heads, lengths, seeds) in TASKS.items():
        for n in lengths:
            for arm in ARMS:
                out.append(Variant(tag=f"{task}-n{n}-{arm}", seeds=SEEDS_OVERRIDE.get((task, n), seeds), overrides=(
                    f"data.source={task}", f"data.synthetic_min_length={n}", f"data.synthetic_max_length={n}",
                    f"model.num_heads={heads}", f"model.attention_scale={arm}")))
    for n in AUTHORS_LENGTHS:
        for arm in ARMS:
            out.append(Variant(tag=f"first-authors-n{n}-{arm}", seeds=AUTHORS_SEEDS, overrides=(
                "data.source=first", f"data.synthetic_min_length={n}", f"data.synthetic_max_length={n}",
                "model.num_heads=1", f"model.attention_scale={arm}", *AUTHORS_OVERRIDES)))
    return tuple(out)


def sweep() -> Sweep:
    return Sweep(name="log_length", base=base_config(), depths=(2,), widths={2: (16,)}, seeds=(0,),
                 multiple_of=16, variants=variants())
