"""CPU-scale depth-efficiency sweep: depths 1, 2, 4 around where their loss curves meet.

    python -m sweeps.launch run sweeps/configs/cpu_mini.py --workdir runs
    python -m analysis fit runs/cpu_mini

Why this grid: on a byte-level LM at batch 32 × 128 tokens, the L=1/2/4 loss
curves meet at N ≈ 1e6-3e6 (the shallower net wins by a wide margin up to
N ≈ 3e5), and with one shared learning rate depth 4 is unstable and one or
two seeds cannot separate the curves. So this sweep:
- trains depths 1, 2 and 4, each on a ladder of budgets N = 12·L·d² spaced
  by factors of 2, placed where its adjacent pairs meet: L=1 at 2.5e5-2e6
  (the 1-vs-2 crossing), L=2 at 2.5e5-4e6 (both pairs), L=4 at 5e5-4e6 (the
  2-vs-4 crossing). Depth 8 is left out: its transition with depth 4 lies
  beyond 1e7, about half an hour per run on a CPU;
- uses the μP-style rule (optim.lr_rule='mup'): attention and feed-forward
  matrices get 3e-3 · 128/width, embeddings and norms 3e-3, so wide shallow
  nets and narrow deep ones each get a rate suited to their width;
- runs 3 seeds per shape, so the analysis can pool the seed noise;
- trains every run for 400 steps of 32 × 128 tokens (1.6M tokens, a
  quarter epoch of the built-in corpus, so no text is seen twice) and
  evaluates on 36 held-out batches (147K tokens, nearly the whole held-out
  split) at the midpoint and at the end;
- keeps widths multiples of 16 with 16-channel heads.
39 runs in all, trained cheapest first so results arrive early.

Cost: 6.4e14 training FLOPs (``dry-run``), about 3 hours on a quiet 2-core
machine (a step takes about 0.02 s + 0.38 s per 1e6 parameters there), which
is what sets 400 steps; ``--set steps=600`` trains longer under new run ids.
``--shard 0/2`` and ``--shard 1/2`` on two machines sharing the workdir halve
the wall time.

What it can show: the 1-vs-2 transition width and, if depth 4 overtakes
depth 2 below 4e6, the 2-vs-4 one; two transitions are the minimum for a
(zero-dof) fit of log d = a + b·L. The constants will not match the paper's
(different data, tokenizer, training length).
"""

from scaling.config import DataConfig, ModelConfig, OptimConfig, TrainConfig
from sweeps.spec import Sweep

LADDER = (2.5e5, 5e5, 1e6, 2e6, 4e6)  # non-embedding parameters N = 12·L·d²


def sweep() -> Sweep:
    base = TrainConfig(
        model=ModelConfig(head_dim=16, max_seq_len=128),
        data=DataConfig(source="builtin", seq_len=128),
        optim=OptimConfig(peak_lr=3e-3, lr_rule="mup", base_width=128, warmup_steps=50, grad_clip=1.0),
        steps=400, batch_size=32, eval_every=200, eval_batches=36, checkpoint_every=100, log_every=20,
        wandb_mode="offline")
    budgets = {1: LADDER[:4], 2: LADDER, 4: LADDER[1:]}
    return Sweep(name="cpu_mini", base=base, depths=(1, 2, 4), budgets=budgets, seeds=(0, 1, 2),
                 multiple_of=16)
