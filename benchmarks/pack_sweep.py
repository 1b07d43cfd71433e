"""A sweep file for timing packs on a CPU: one shape (L2, d64) × 3 seeds × 2 learning rates, 300 steps.

    farm-bench -n 3 --warmup 1 --timeout 3000 \
      --vs "sh -c 'rm -rf /tmp/alone && exec python -m sweeps.launch run benchmarks/pack_sweep.py --workdir /tmp/alone --no-progress'" \
      -- sh -c 'rm -rf /tmp/packed && exec python -m sweeps.launch run benchmarks/pack_sweep.py --workdir /tmp/packed --pack 6 --no-progress'

A is the six runs as one pack, B the same runs one after another (the
default), each from an empty work directory, start-up and summary included;
the ratio A/B below 1 means packing is faster. Batches of 16 × 128 bytes of
the built-in corpus, no evaluation between steps, checkpoints every 100 steps.
"""

from scaling.config import DataConfig, ModelConfig, OptimConfig, TrainConfig
from sweeps.spec import Sweep


def sweep() -> Sweep:
    base = TrainConfig(
        model=ModelConfig(head_dim=16, max_seq_len=128),
        data=DataConfig(source="builtin", seq_len=128),
        optim=OptimConfig(peak_lr=3e-3, warmup_steps=30),
        steps=300, batch_size=16, eval_every=0, eval_batches=4, checkpoint_every=100, log_every=25,
        wandb_mode="disabled")
    return Sweep(name="pack_sweep", base=base, depths=(2,), widths={2: (64,)}, seeds=(0, 1, 2),
                 lr_grid=(1e-3, 3e-3), multiple_of=16)
