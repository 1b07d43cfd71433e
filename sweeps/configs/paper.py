"""The paper's sweep (Levine et al. 2020, section 5): depths 6 to 48 around their transitions, for TPU pods.

    python -m sweeps.launch dry-run sweeps/configs/paper.py --workdir gs://BUCKET/sweeps
    python -m sweeps.launch preflight sweeps/configs/paper.py --topology v5e:4x4
    python -m scaling.data cache --source hub --hub-name allenai/c4 --hub-config en --max-documents 3500000 \
        --validation-fraction 0.01 --tokenizer hf:gpt2 --cache-dir gs://BUCKET/tokens/c4-gpt2
    python -m sweeps.launch sky sweeps/configs/paper.py --workdir gs://BUCKET/sweeps --accelerator v5litepod-16 \
        --spot --cache-dir gs://BUCKET/tokens/c4-gpt2
    python -m analysis fit gs://BUCKET/sweeps/paper

Grid. Depths {6, 12, 18, 24, 30, 36, 48}, as in the paper; its transitions
come from the adjacent pairs (6,12), (12,18), ..., (36,48). Budgets sit on
one ladder N = 1e6 · 2^(k/2) (factors of √2, so depths meet at equal sizes),
and each depth gets the ladder points in a window around the transitions it
takes part in, placed with the paper's fit (a = 5.039, b = 0.0555,
N_tr(L) = 12·L·e^{2a}·e^{2bL}): depth L_i covers
[N_tr(L_{i-1}) / 3, N_tr(L_i) · 3] (depth 6 from N_tr(6) / 3, depth 48 up to
N_tr(36) · 3, since 48 has no deeper partner). The factor 3 on each side
allows for transitions that move with our data and training length; the
paper's own ΔN is about 20%. This spans N ≈ 1e6 to 2e9 (widths 128 to about
2000), 3 seeds per shape.

Widths are multiples of 64 with 64-channel heads. Multiples of 128 would
suit the TPU's 128-wide matrix units better, but at depth 6 (transition
width ≈ 215) they would leave only widths 128 and 256 near the transition,
a 2× step in width; 64 halves that. Ladder points that round to a width
already taken are reported as skipped.

Data and model. C4 English (allenai/c4, config en) streamed from the hub,
the first 3.5M documents (about 1.5B GPT-2 tokens), tokenized with GPT-2's
BPE (vocabulary 50257 + 4 special ids), 1% of documents held out.
Pre-LN, ReLU, feed-forward 4·d, learned positions, sequences of 1024 tokens,
bfloat16 compute with float32 parameters, full rematerialisation, flash
attention (``model.attention_impl="flash"``: the Pallas splash kernel on
TPU, which never writes the [T, T] scores to memory; not part of the run
id).

Meshes (no part of the run id). ``parallelism="auto"``: each run trains the
way ``preflight --parallelism`` chose for it (data-parallel with parameters
replicated, fully sharded, or packed one run per chip: the cheapest that fits
by both of its estimates; ``sweeps/preflight/parallelism.py``). A run with no
kept choice is data-parallel when its training state (parameters, gradients,
AdamW's moments) is at most a quarter of a v5e chip's HBM, 4 GiB
(``data_parallel_state_bytes``: every run up to about 250M parameters), and
shards parameters and optimizer state with the fsdp axis over all devices
otherwise. Replicated, a small model's matmuls contract over its whole width
on every chip; fully sharded over 8 chips, its gathered matmuls contract
over slivers of the width, which fill a fraction of the matrix unit (libtpu's
estimates for the L6 rows on v5e:2x4: 1.35-1.56× faster steps data-parallel;
``benchmarks/loss_estimates.md``).
The quick preflight then compiles two families of programs (14, not 7).
The fsdp size must divide the widths: on 256 chips fsdp=256 divides none
of them, the state stays unsharded and the large runs do not fit; the
preflight says so and suggests e.g. ``--set mesh.data=4 --set mesh.fsdp=64``.

Training. Every run sees the same 1.31B tokens: 5000 steps × 256 sequences
× 1024 tokens (a fixed token budget, so depths are compared at equal data).
AdamW (0.9, 0.95), weight decay 0.1, clipping at 1.0, 500 warmup steps,
cosine to 10%. The μP-style rule gives matrices 6e-4 · 768/width (GPT-3
Small's rate at its width) and embeddings 6e-4, so the rate follows width
across the 10× range of widths instead of favouring one depth.

Before paying for a pod: `dry-run` prints the FLOPs, and `preflight` compiles
every run for the topology and reports which fit one host's memory
(host-parallel) and which need --pod-wide. Then tokenise the corpus once,
before the pod exists, on any machine with a few CPUs and about 16 GB of
memory (e.g. one CPU VM in the bucket's region): `python -m scaling.data
cache` above streams the 3.5M documents once, writes about 3 GB of uint16
token shards to the bucket, and resumes if interrupted. With
`data.cache_dir` set (a presentation field: run ids do not change), every
run on every host reads only that cache, and only its own rows of each
batch; the data fingerprint comes from the cache's metadata. Without it,
each run would stream and hash the 3.5M documents from the hub again on
every host before training.
"""

import numpy as np

from analysis.projection import FIT_PRESETS, transition_params
from scaling import hardware
from scaling.config import DataConfig, MeshConfig, ModelConfig, OptimConfig, TrainConfig
from sweeps.spec import Sweep

DEPTHS = (6, 12, 18, 24, 30, 36, 48)
WINDOW = 3.0  # each depth's budgets reach this factor beyond the transitions it takes part in
LADDER = 1e6 * 2.0 ** (np.arange(0, 24) / 2)  # 1e6 .. 2.9e9 parameters, factors of √2


def budgets_per_depth(depths=DEPTHS, window=WINDOW, fit=FIT_PRESETS["levine2020"]) -> dict:
    """Ladder budgets (non-embedding parameters) per depth, around the pairs the depth belongs to."""
    transitions = [float(transition_params(depth, fit)) for depth in depths]
    budgets = {}
    for i, depth in enumerate(depths):
        low = transitions[max(i - 1, 0)] / window
        high = transitions[min(i, len(depths) - 2)] * window
        budgets[depth] = tuple(float(n) for n in LADDER if low <= n <= high)
    return budgets


def sweep() -> Sweep:
    base = TrainConfig(
        model=ModelConfig(head_dim=64, vocab_size=50261, max_seq_len=1024, compute_dtype="bfloat16",
                          param_dtype="float32", remat="full", scan_layers=True, attention_impl="flash"),
        data=DataConfig(source="hub", hub_name="allenai/c4", hub_config="en", hub_split="train",
                        max_documents=3_500_000, validation_fraction=0.01, tokenizer="hf:gpt2", seq_len=1024),
        optim=OptimConfig(peak_lr=6e-4, lr_rule="mup", base_width=768, warmup_steps=500, schedule="cosine",
                          end_lr_fraction=0.1, weight_decay=0.1, grad_clip=1.0),
        mesh=MeshConfig(data=1, fsdp=-1, tensor=1),
        steps=5000, batch_size=256, eval_every=1000, eval_batches=16, checkpoint_every=500, log_every=50,
        peak_flops=hardware.TPU_V5E.peak_flops("bfloat16"),  # per chip, for MFU and dry-run's time
        wandb_mode="auto")
    return Sweep(name="paper", base=base, depths=DEPTHS, budgets=budgets_per_depth(), seeds=(0, 1, 2),
                 multiple_of=64, parallelism="auto", data_parallel_state_bytes=hardware.TPU_V5E.hbm_bytes // 4)
