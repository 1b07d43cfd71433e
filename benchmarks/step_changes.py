"""Two side-by-side CPU measurements behind the throughput benchmark's ratios to the PyTorch peer.

``--part matmuls``: each matrix product of the benchmark's train step at a
width (forward ``[tokens, d] @ [d, 4d]`` and the rest, backward weight
gradients ``[d, tokens] @ [tokens, ·]``) timed alone, jitted JAX against
``torch.mm`` on the same arrays with 2 threads, alternating, medians. It says
how fast XLA's CPU matmul kernels are against the peer's at the shapes that
make up 80% of a 4×256 step: a bound on how close the whole step can come.

``--part causal-blocks``: the train step of ``benchmarks/throughput.py``
built twice in one process, with the XLA attention's causal query blocks
(``scaling.attention.causal_query_blocks``) and with one block (the whole
[T, T] square, as before), timed alternately, 2 steps at a time, medians.
One process and alternating rounds keep the machine's drift out of the ratio.

    python benchmarks/step_changes.py --part matmuls --width 256
    python benchmarks/step_changes.py --part causal-blocks --configs 2x64 4x128 4x256 --rounds 20
"""

from __future__ import annotations

import statistics
import sys
import time

import throughput  # first: it configures JAX and the allocator as the benchmark does

from scaling import cli


def _times_ms(function, repeats: int, calls: int = 20) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            function()
        times.append((time.perf_counter() - start) / calls * 1e3)
    return times


def matmuls(width: int, repeats: int) -> list[dict]:
    """Milliseconds of each of the step's product shapes at ``width``: JAX (jitted) and torch.mm, side by side."""
    import jax
    import numpy as np
    import torch

    torch.set_num_threads(throughput.THREADS)
    tokens = throughput.BATCH * throughput.SEQ_LEN
    shapes = [(tokens, width, 4 * width, "feed-forward in"), (tokens, 4 * width, width, "feed-forward out"),
              (tokens, width, width, "q, k, v or output projection"),
              (width, tokens, 4 * width, "weight gradient, feed-forward in"),
              (width, tokens, width, "weight gradient, projection")]
    rng = np.random.default_rng(0)
    rows = []
    for m, k, n, what in shapes:
        a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
        product = jax.jit(lambda a, b: a @ b)
        product(a, b).block_until_ready()
        torch_a, torch_b = torch.from_numpy(a), torch.from_numpy(b)
        ours, peer = [], []
        for _ in range(repeats):  # alternating, so both see the same machine
            ours += _times_ms(lambda: product(a, b).block_until_ready(), 1)
            peer += _times_ms(lambda: torch_a @ torch_b, 1)
        ours_ms, peer_ms = statistics.median(ours), statistics.median(peer)
        rows.append({"shape": f"{m}x{k} @ {k}x{n}", "what": what, "jax_ms": ours_ms, "torch_ms": peer_ms,
                     "jax_gflops": 2 * m * k * n / ours_ms / 1e6, "torch_gflops": 2 * m * k * n / peer_ms / 1e6,
                     "jax_over_torch_speed": peer_ms / ours_ms})
    return rows


def causal_blocks(depth: int, width: int, rounds: int) -> dict:
    """Median ms per train step with causal query blocks and with the whole square, built and timed in turn."""
    from scaling import attention
    from scaling import program as program_lib

    built = {}
    blocks = attention.CAUSAL_QUERY_BLOCKS
    try:
        for label, limit in (("square", 1), ("blocked", blocks)):
            attention.CAUSAL_QUERY_BLOCKS = limit
            program_lib.forget_programs()  # a fresh trace: the limit is read while tracing
            built[label] = throughput.Ours(depth, width, scan_layers=depth > throughput.UNROLL_UP_TO_DEPTH)
    finally:
        attention.CAUSAL_QUERY_BLOCKS = blocks
    times = {label: [] for label in built}
    for _ in range(rounds):
        for label, ours in built.items():
            times[label].append(ours.run(2) / 2 * 1e3)
    square, blocked = statistics.median(times["square"]), statistics.median(times["blocked"])
    return {"config": f"{depth}x{width}", "blocks": attention.causal_query_blocks(throughput.SEQ_LEN),
            "square_ms": square, "blocked_ms": blocked, "speedup": square / blocked}


def main() -> None:
    parser = cli.doc_parser(__doc__)
    parser.add_argument("--part", choices=("matmuls", "causal-blocks"), required=True,
                        help="which measurement (see above)")
    parser.add_argument("--width", type=int, default=256, help="model width for --part matmuls (default: 256)")
    parser.add_argument("--configs", nargs="+", default=["2x64", "4x128", "4x256"], metavar="LxD",
                        help="depth x width pairs for --part causal-blocks (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=20, help="alternating rounds (default: 20)")
    args = parser.parse_args()
    if args.rounds < 1 or args.width < 1:
        print("error: --rounds and --width must be >= 1", file=sys.stderr)
        sys.exit(2)
    if args.part == "matmuls":
        print(f"{'product':>24} {'what':>34} {'JAX ms':>7} {'torch ms':>8} {'JAX GF/s':>8} {'torch GF/s':>10} "
              f"{'JAX speed / torch':>17}")
        for row in matmuls(args.width, args.rounds):
            print(f"{row['shape']:>24} {row['what']:>34} {row['jax_ms']:>7.2f} {row['torch_ms']:>8.2f} "
                  f"{row['jax_gflops']:>8.0f} {row['torch_gflops']:>10.0f} {row['jax_over_torch_speed']:>17.2f}")
        return
    try:
        configs = [throughput.parse_config(text) for text in args.configs]
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    print(f"{'L x d':>7} {'blocks':>6} {'square ms':>9} {'blocked ms':>10} {'speedup':>7}")
    for depth, width in configs:
        row = causal_blocks(depth, width, args.rounds)
        print(f"{row['config']:>7} {row['blocks']:>6} {row['square_ms']:>9.1f} {row['blocked_ms']:>10.1f} "
              f"{row['speedup']:>7.3f}")


if __name__ == "__main__":
    main()
