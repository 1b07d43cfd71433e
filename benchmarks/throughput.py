"""Training throughput (tokens/s and FLOP/s) of the real train step, beside a PyTorch peer.

Each config is one (depth L, width d) model trained on random byte tokens:
sequence 128, batch 16, float32, AdamW with global-norm clipping, head size
64 (heads = d/64, at least 1), no dropout, no biases in linear layers. Our
side is exactly ``scaling.model.program.build(...).train_step``, the jitted, sharded,
donated step that ``scaling.run.train.run`` executes, on a one-device mesh, once
with scanned and once with unrolled layers (``ModelConfig.scan_layers``).
The headline ``tokens_per_second`` is the layout we recommend for the depth:
unrolled up to 8 layers (compiling it takes seconds there), scanned beyond.

The peer is nanoGPT's ``model.py`` (PyTorch, eager, CPU). It is never part of
this repository: pass its path with ``--peer PATH`` or ``NANOGPT_MODEL=PATH``;
without one the peer column is left out. Both sides get the same shapes, 2
threads, tied input/output embeddings, GELU, pre-norm, and AdamW(0.9, 0.95,
weight decay 0.1 on matrices) after clipping to norm 1.0. Both use a
vocabulary of 256 (our byte tokenizer has 260 ids; 256 keeps the
unembedding the same size on both sides). Repetitions alternate ours / peer,
so both see the same machine state; the table shows medians, and how many
CPU cores other processes used meanwhile (only rows near 0 are fair).

FLOP counts per trained token (forward + backward = 3 × forward), both from
``scaling.model.flops.training_flops_per_token``, the count the trainer's MFU uses:
- ``useful``: 6·N with N = 12·L·d² (the budget's parameters);
- ``full``: 6·(12·L·d² + d·V) + 12·L·T·d, adding the unembedding matmul and
  attention's scores and weighted values (see ``scaling/model/flops.py``).
Both are divided by the measured float32 matmul peak (a 2048² ``a @ a``
through JAX, best of several).

Every row records the CPU it ran on (``cpu``: model, cores, and whether it has
AVX-512, AVX-512-BF16, AVX-512-VNNI and AMX, from ``benchmarks/cpu_info.py``),
and the table prints it above the rows: figures from CPUs with different
extensions are not comparable.

    python benchmarks/throughput.py                                  # all 5 configs, ours only
    python benchmarks/throughput.py --peer /path/to/nanoGPT/model.py # with the peer column
    python benchmarks/throughput.py --configs 4x256 --json           # one JSON list
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import json
import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before JAX is imported; skips probing for a TPU
import cpu_info  # noqa: E402
from scaling import cli  # noqa: E402
from scaling.cpu_allocator import tune_cpu_allocator  # noqa: E402

# As the command lines do (the main of python -m scaling.train and of sweeps.launch), before
# JAX starts its CPU threads: make glibc keep freed memory for reuse instead
# of unmapping it (one arena, no mmap, a 2 GiB trim threshold), so the step's
# temporaries stop page-faulting; SCALING_MALLOC_TUNING=0 measures without it.
# mallopt is process-wide, so the PyTorch peer, which runs in this process,
# gets the same allocator. Importing scaling.run.train no longer does this.
MALLOC_TUNED = tune_cpu_allocator()
from scaling.run import train  # noqa: E402, F401

THREADS = 2
SEQ_LEN, BATCH, VOCAB, HEAD_SIZE = 128, 16, 256, 64
DEFAULT_CONFIGS = ("2x64", "4x128", "8x128", "4x256", "8x256")


def parse_config(text: str) -> tuple[int, int]:
    """'4x256' -> (depth 4, width 256)."""
    try:
        depth, width = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--configs {text!r}: each must look like DEPTHxWIDTH, e.g. 4x256") from None
    if depth < 1 or width < 1 or (width > HEAD_SIZE and width % HEAD_SIZE):
        raise ValueError(f"--configs {text!r}: depth >= 1, and width a multiple of {HEAD_SIZE} (or below it)")
    return depth, width


def flops_per_token(depth: int, width: int) -> dict:
    """Training FLOPs per token of a benchmark config, from ``scaling.model.flops.training_flops_per_token``:
    ``useful`` = its ``layers`` part (6·12·L·d²), ``full`` = its ``total`` (adds the unembedding and attention)."""
    from scaling.model.flops import training_flops_per_token

    count = training_flops_per_token(train_config(depth, width).model, SEQ_LEN)
    return {"useful": count.layers, "full": count.total}


def matmul_peak_flops(size: int = 2048, repeats: int = 8) -> float:
    """Best float32 FLOP/s of one jitted ``a @ a`` of ``size``² through JAX (2·size³ FLOPs)."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.PRNGKey(0), (size, size), jnp.float32)
    square = jax.jit(lambda x: x @ x)
    square(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        square(a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


UNROLL_UP_TO_DEPTH = 8  # ``--layers both``: report unrolled up to this depth, scanned beyond


def train_config(depth: int, width: int, **model_changes):
    """The benchmark's ``TrainConfig``: byte vocabulary, sequence 128, batch 16, GELU, tied embeddings."""
    from scaling.config import DataConfig, ModelConfig, TrainConfig

    model = ModelConfig(depth=depth, width=width, head_dim=HEAD_SIZE, vocab_size=VOCAB, max_seq_len=SEQ_LEN,
                        activation="gelu", tie_embeddings=True, use_bias=False, dropout=0.0)
    model = dataclasses.replace(model, **model_changes)
    return TrainConfig(model=model, data=DataConfig(seq_len=SEQ_LEN), batch_size=BATCH, steps=10_000,
                       wandb_mode="disabled")


def random_batch(mesh) -> dict:
    """One global batch of random byte tokens, [BATCH, SEQ_LEN] each, placed on ``mesh``."""
    import numpy as np

    from scaling.model import mesh as mesh_lib

    tokens = np.random.default_rng(0).integers(0, VOCAB, (BATCH, SEQ_LEN + 1), dtype=np.int32)
    local = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
             "weights": np.ones((BATCH, SEQ_LEN), np.float32), "input_mask": np.ones((BATCH, SEQ_LEN), np.float32)}
    return mesh_lib.global_batch(local, mesh, BATCH)


class Ours:
    """The trainer's own jitted train step (``scaling.model.program.build``) for one config, on one device."""

    def __init__(self, depth: int, width: int, **model_changes):
        import jax

        from scaling.model import mesh as mesh_lib
        from scaling.model import program as program_lib
        from scaling.config import MeshConfig

        self.config = train_config(depth, width, **model_changes)
        mesh = mesh_lib.make_mesh(MeshConfig(), jax.devices()[:1])
        program = program_lib.build(self.config, mesh)
        self.model = program.model
        self.batch = random_batch(mesh)
        self.hparams = jax.device_put(program_lib.hyperparameters(self.config), mesh_lib.replicated(mesh))
        self.step = program.train_step
        self.fresh_state = lambda: program.init(jax.random.PRNGKey(0))  # the same initial state every call
        self.state = self.fresh_state()
        self.run(2)  # compile and warm up

    def run(self, steps: int) -> float:
        """Seconds for ``steps`` train steps, waiting for the last one to finish."""
        import jax

        start = time.perf_counter()
        for _ in range(steps):
            self.state, metrics = self.step(self.state, self.batch, self.hparams)
        jax.block_until_ready((self.state, metrics))
        if not bool(metrics["finite"]):
            raise RuntimeError("our train step produced a non-finite loss")
        return time.perf_counter() - start


def load_peer(path: str):
    """Import nanoGPT's model.py from ``path`` as a module (it is never vendored here)."""
    spec = importlib.util.spec_from_file_location("nanogpt_peer_model", path)
    if spec is None or not os.path.isfile(path):
        raise ValueError(f"--peer {path!r}: no such file (expected nanoGPT's model.py)")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Peer:
    """nanoGPT's GPT with the same shapes, AdamW and clipping, eager PyTorch on CPU."""

    def __init__(self, module, depth: int, width: int):
        import torch

        torch.manual_seed(0)
        config = module.GPTConfig(block_size=SEQ_LEN, vocab_size=VOCAB, n_layer=depth,
                                  n_head=max(1, width // HEAD_SIZE), n_embd=width, dropout=0.0, bias=False)
        with contextlib.redirect_stdout(io.StringIO()):  # it prints parameter counts
            self.model = module.GPT(config)
            self.optimizer = self.model.configure_optimizers(0.1, 3e-3, (0.9, 0.95), "cpu")
        self.model.train()
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ_LEN + 1), generator=torch.Generator().manual_seed(0))
        self.inputs, self.targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        self.run(2)

    def run(self, steps: int) -> float:
        """Seconds for ``steps`` forward/backward/clip/AdamW steps."""
        import torch

        start = time.perf_counter()
        for _ in range(steps):
            _, loss = self.model(self.inputs, self.targets)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
        if not torch.isfinite(loss):
            raise RuntimeError("the peer produced a non-finite loss")
        return time.perf_counter() - start


def machine_busy_seconds() -> float:
    """Non-idle CPU seconds of the whole machine since boot, from Linux's /proc/stat (0.0 elsewhere)."""
    try:
        with open("/proc/stat") as stat:
            ticks = [int(field) for field in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return 0.0
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # minus idle and iowait


def own_busy_seconds() -> float:
    """CPU seconds (user + system, all threads) this process has used."""
    times = os.times()
    return times.user + times.system


def steps_per_repeat(depth: int, width: int, seconds: float = 1.0) -> int:
    """Enough steps for about ``seconds`` of work at ~120 GFLOP/s (at least 3)."""
    step_flops = flops_per_token(depth, width)["full"] * BATCH * SEQ_LEN
    return max(3, round(seconds * 1.2e11 / step_flops))


def measure(depth: int, width: int, peer_module, repeats: int, peak: float, layers: str = "both") -> dict:
    """Interleaved timings of our step(s) and the peer's for one config; medians in tokens/s.

    ``layers``: ``scan``, ``unrolled``, or ``both``. ``tokens_per_second`` is
    the layout ``--layers`` picked; with ``both`` it is the one we recommend
    for the depth (unrolled up to ``UNROLL_UP_TO_DEPTH``, where compiling it
    is cheap), and the other is reported beside it.
    """
    recommended = "scan" if depth > UNROLL_UP_TO_DEPTH else "unrolled"
    chosen = recommended if layers == "both" else layers
    layouts = ("scan", "unrolled") if layers == "both" else (layers,)
    runners = {layout: Ours(depth, width, scan_layers=layout == "scan") for layout in layouts}
    if peer_module is not None:
        runners["peer"] = Peer(peer_module, depth, width)
    steps = steps_per_repeat(depth, width)
    rates = {name: [] for name in runners}
    # CPU cores other processes used meanwhile: on a shared machine the peer's
    # OpenMP threads suffer more from contention than XLA's, so only rows
    # with ~0 are fair comparisons.
    start_wall, start_machine, start_own = time.perf_counter(), machine_busy_seconds(), own_busy_seconds()
    for _ in range(repeats):
        for name, runner in runners.items():
            rates[name].append(steps * BATCH * SEQ_LEN / runner.run(steps))
    others = ((machine_busy_seconds() - start_machine) - (own_busy_seconds() - start_own)) / (
        time.perf_counter() - start_wall)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    rate = medians[chosen]
    flops = flops_per_token(depth, width)
    row = {"depth": depth, "width": width, "heads": max(1, width // HEAD_SIZE), "scan_layers": chosen == "scan",
           "seq_len": SEQ_LEN, "batch": BATCH, "vocab": VOCAB, "steps_per_repeat": steps, "repeats": repeats,
           "tokens_per_second": rate, "tokens_per_second_all": rates[chosen],
           "useful_flops_per_token": flops["useful"], "full_flops_per_token": flops["full"],
           "useful_flops_per_second": rate * flops["useful"], "full_flops_per_second": rate * flops["full"],
           "matmul_peak_flops": peak, "useful_fraction_of_peak": rate * flops["useful"] / peak,
           "full_fraction_of_peak": rate * flops["full"] / peak, "other_processes_cores": max(others, 0.0),
           "glibc_malloc_tuned": MALLOC_TUNED}
    for layout in layouts:
        row[f"tokens_per_second_{'scanned' if layout == 'scan' else 'unrolled'}"] = medians[layout]
    if peer_module is not None:
        row.update(peer_tokens_per_second=medians["peer"], peer_tokens_per_second_all=rates["peer"],
                   peer_useful_flops_per_second=medians["peer"] * flops["useful"],
                   ratio_to_peer=rate / medians["peer"])
    return row


def print_table(rows: list[dict]) -> None:
    peak = rows[0]["matmul_peak_flops"]
    print(f"CPU: {rows[0]['cpu']['summary']}")
    print(f"float32 matmul peak (2048² a @ a through JAX): {peak / 1e9:.0f} GFLOP/s; {os.cpu_count()} cores; "
          "'others': CPU cores used by other processes while a row was timed")
    with_peer = "peer_tokens_per_second" in rows[0]
    both = "tokens_per_second_scanned" in rows[0] and "tokens_per_second_unrolled" in rows[0]
    header = f"{'L':>3} {'d':>4} {'layers':>8} {'tok/s':>9} {'useful GF/s':>12} {'%peak':>6} {'full GF/s':>10} {'%peak':>6}"
    if both:
        header += f" {'scan tok/s':>11} {'unroll tok/s':>13}"
    if with_peer:
        header += f" {'peer tok/s':>11} {'ours/peer':>10}"
    print(header + f" {'others':>7}")
    for r in rows:
        line = (f"{r['depth']:>3} {r['width']:>4} {'scanned' if r['scan_layers'] else 'unrolled':>8} "
                f"{r['tokens_per_second']:>9,.0f} "
                f"{r['useful_flops_per_second'] / 1e9:>12.1f} {100 * r['useful_fraction_of_peak']:>5.0f}% "
                f"{r['full_flops_per_second'] / 1e9:>10.1f} {100 * r['full_fraction_of_peak']:>5.0f}%")
        if both:
            line += f" {r['tokens_per_second_scanned']:>11,.0f} {r['tokens_per_second_unrolled']:>13,.0f}"
        if with_peer:
            line += f" {r['peer_tokens_per_second']:>11,.0f} {r['ratio_to_peer']:>10.2f}"
        print(line + f" {r['other_processes_cores']:>7.2f}")


def main() -> None:
    parser = cli.doc_parser(__doc__)
    parser.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS), metavar="LxD",
                        help="depth x width pairs (default: %(default)s)")
    parser.add_argument("--peer", default=os.environ.get("NANOGPT_MODEL"),
                        help="path to nanoGPT's model.py (default: $NANOGPT_MODEL; none: no peer column)")
    parser.add_argument("--layers", choices=("both", "scan", "unrolled"), default="both",
                        help="our layer stack: nn.scan, unrolled, or both (then tokens_per_second is unrolled up "
                             f"to depth {UNROLL_UP_TO_DEPTH}, scanned beyond) (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repetitions per config (median)")
    parser.add_argument("--json", action="store_true", help="print a JSON list, one object per config")
    args = parser.parse_args()
    try:
        configs = [parse_config(text) for text in args.configs]
        if args.repeats < 1:
            raise ValueError(f"--repeats {args.repeats}: must be >= 1")
        peer_module = None
        if args.peer:
            import torch

            torch.set_num_threads(THREADS)
            peer_module = load_peer(args.peer)
    except (ValueError, ImportError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    peak = matmul_peak_flops()
    rows = []
    for depth, width in configs:
        rows.append(measure(depth, width, peer_module, args.repeats, peak, args.layers))
        peak = max(peak, matmul_peak_flops())  # re-measured: a busy machine can spoil one measurement
    for row in rows:  # every row against the best peak seen in this run
        row["matmul_peak_flops"] = peak
        row["useful_fraction_of_peak"] = row["useful_flops_per_second"] / peak
        row["full_fraction_of_peak"] = row["full_flops_per_second"] / peak
        row["cpu"] = cpu_info.describe()  # beside every figure: never compare rows across kinds of CPU
    busy = [f"{r['depth']}x{r['width']}" for r in rows if r["other_processes_cores"] > 0.25]
    if busy:
        print(f"warning: other processes used the CPU while timing {', '.join(busy)}; those numbers and ratios "
              "are unreliable", file=sys.stderr)
    if args.json:
        print(json.dumps(rows))
    else:
        print_table(rows)


if __name__ == "__main__":
    from scaling.entry import prepare_process

    prepare_process()  # as every command line does first: no TPU probe on a CPU machine; the storage emulator
    main()
