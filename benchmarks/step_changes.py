"""Three side-by-side CPU measurements behind the throughput benchmark's ratios to the PyTorch peer.

``--part matmuls``: each matrix product of the benchmark's train step at a
width (forward ``[tokens, d] @ [d, 4d]`` and the rest, backward weight
gradients ``[d, tokens] @ [tokens, ·]``) timed alone, jitted JAX against
``torch.mm`` on the same arrays with 2 threads, alternating, medians. It says
how fast XLA's CPU matmul kernels are against the peer's at the shapes that
make up 80% of a 4×256 step: a bound on how close the whole step can come.

``--part causal-blocks``: the train step of ``benchmarks/throughput.py``
built twice in one process, with the XLA attention's causal query blocks
(``scaling.model.attention.causal_query_blocks``) and with one block (the whole
[T, T] square, as before), timed alternately, 2 steps at a time, medians.
One process and alternating rounds keep the machine's drift out of the ratio.

``--part weight-grad``: the same side-by-side build for the dense layers'
weight gradient (``scaling.model.cpu_matmul``): ``xᵀ`` written out before
``xᵀ @ dy`` (today's CPU step) against the product XLA:CPU forms with a
transposed operand (the step before). It also trains both 50 steps from the
same state and batch (a random batch it memorises: the loss falls towards 0)
and prints the largest absolute difference of their losses. First it times
the weight-gradient products alone, folded and written out, beside torch.

``--part composition``: where, between one layer and the whole step, the
gap to the peer opens. In one process, alternating, for ours and for
nanoGPT (needs ``--peer``): the forward and backward pass of one layer alone
(``scaling.model.transformer.Block``, gradients for its parameters and its input, against
a random output gradient), of the model (``scaling.model.loss.loss_and_grads``; the
peer's ``loss.backward()``), and the whole train step (the benchmark's).
Ours also times ``depth`` layers chained in one program without the
embedding and loss. Each row gives ms and the peer's time over ours (above
1: ours is faster).

    python benchmarks/step_changes.py --part matmuls --width 256
    python benchmarks/step_changes.py --part causal-blocks --configs 2x64 4x128 4x256 --rounds 20
    python benchmarks/step_changes.py --part weight-grad --configs 2x64 4x128 4x256 --rounds 20
    python benchmarks/step_changes.py --part composition --configs 4x256 --peer /path/to/nanoGPT/model.py
"""

from __future__ import annotations

import os
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


def _built_each_way(module, switch: str, values: dict, depth: int, width: int) -> dict:
    """The benchmark's train step built once per value of ``module.switch`` (read while tracing), by label."""
    from scaling.model import program as program_lib

    built, setting = {}, getattr(module, switch)
    try:
        for label, value in values.items():
            setattr(module, switch, value)
            program_lib.forget_programs()  # a fresh trace: the switch is read while tracing
            built[label] = throughput.Ours(depth, width, scan_layers=depth > throughput.UNROLL_UP_TO_DEPTH)
    finally:
        setattr(module, switch, setting)
    return built


def _alternating_ms(built: dict, rounds: int) -> dict:
    """ms per step of each built step, timed in turn, 2 steps at a time, ``rounds`` times: label -> list."""
    times = {label: [] for label in built}
    for _ in range(rounds):
        for label, ours in built.items():
            times[label].append(ours.run(2) / 2 * 1e3)
    return times


def causal_blocks(depth: int, width: int, rounds: int) -> dict:
    """Median ms per train step with causal query blocks and with the whole square, built and timed in turn."""
    from scaling.model import attention

    built = _built_each_way(attention, "CAUSAL_QUERY_BLOCKS", {"square": 1, "blocked": attention.CAUSAL_QUERY_BLOCKS},
                            depth, width)
    times = _alternating_ms(built, rounds)
    square, blocked = statistics.median(times["square"]), statistics.median(times["blocked"])
    return {"config": f"{depth}x{width}", "blocks": attention.causal_query_blocks(throughput.SEQ_LEN),
            "square_ms": square, "blocked_ms": blocked, "speedup": square / blocked}


def weight_grad_products(width: int, repeats: int) -> list[dict]:
    """ms of the dense layers' weight gradients ``xᵀ @ dy`` at ``width``: as autodiff hands them to XLA:CPU
    (the transpose folded into the product), with ``xᵀ`` written out first, and ``torch.mm``, alternating."""
    import jax
    import numpy as np
    import torch

    torch.set_num_threads(throughput.THREADS)
    tokens = throughput.BATCH * throughput.SEQ_LEN
    folded = jax.jit(lambda x, dy: x.T @ dy)
    written_out = jax.jit(lambda x, dy: jax.lax.optimization_barrier(x.T) @ dy)
    rng = np.random.default_rng(0)
    rows = []
    for inner, outer, what in ((width, 4 * width, "feed-forward in"), (4 * width, width, "feed-forward out"),
                               (width, width, "q, k, v or output projection")):
        x, dy = rng.standard_normal((tokens, inner), np.float32), rng.standard_normal((tokens, outer), np.float32)
        torch_x, torch_dy = torch.from_numpy(x), torch.from_numpy(dy)
        folded(x, dy).block_until_ready(), written_out(x, dy).block_until_ready()
        times = {"folded": [], "written_out": [], "torch": []}
        for _ in range(repeats):
            times["folded"] += _times_ms(lambda: folded(x, dy).block_until_ready(), 1)
            times["written_out"] += _times_ms(lambda: written_out(x, dy).block_until_ready(), 1)
            times["torch"] += _times_ms(lambda: torch_x.t() @ torch_dy, 1)
        row = {key: statistics.median(value) for key, value in times.items()}
        rows.append({"shape": f"[{tokens},{inner}]T @ [{tokens},{outer}]", "what": what, **row})
    return rows


def weight_grad(depth: int, width: int, rounds: int, loss_steps: int = 50) -> dict:
    """Median ms per train step with the written-out weight-gradient transpose and without, built and timed
    in turn, and the largest absolute difference of their losses over ``loss_steps`` steps."""
    import numpy as np

    from scaling.model import cpu_matmul

    built = _built_each_way(cpu_matmul, "TRANSPOSED_WEIGHT_GRAD_ON_CPU", {"plain": False, "transposed": True},
                            depth, width)
    times = _alternating_ms(built, rounds)
    losses = {label: [] for label in built}
    for label, ours in built.items():
        state = ours.fresh_state()
        for _ in range(loss_steps):
            state, metrics = ours.step(state, ours.batch, ours.hparams)
            losses[label].append(float(metrics["loss"]))
    plain, transposed = np.array(losses["plain"]), np.array(losses["transposed"])
    plain_ms, transposed_ms = statistics.median(times["plain"]), statistics.median(times["transposed"])
    return {"config": f"{depth}x{width}", "plain_ms": plain_ms, "transposed_ms": transposed_ms,
            "speedup": plain_ms / transposed_ms,
            "loss_max_abs_diff": float(np.max(np.abs(transposed - plain))), "last_loss": float(plain[-1]),
            "loss_steps": loss_steps}


def composition(depth: int, width: int, peer_path: str, rounds: int) -> list[dict]:
    """ms of one layer, ``depth`` chained layers (ours only), the model's gradients and the train step,
    ours and the peer's, timed alternately in this process (medians of ``rounds``)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    from scaling.model.loss import loss_and_grads
    from scaling.model.transformer import Block

    torch.set_num_threads(throughput.THREADS)
    config = throughput.train_config(depth, width).model
    shape = (throughput.BATCH, throughput.SEQ_LEN, width)
    rng = np.random.default_rng(0)
    x, out_grad = (jnp.asarray(rng.standard_normal(shape, np.float32)) for _ in range(2))
    mask = jnp.ones(shape[:2], jnp.float32)

    class Layers(nn.Module):
        count: int

        @nn.compact
        def __call__(self, x):
            for index in range(self.count):
                x, _ = Block(config, name=f"layer_{index}")(x, mask)
            return x

    def layers_grads(count):
        layers = Layers(count)
        params = nn.unbox(layers.init(jax.random.PRNGKey(0), x)["params"])
        grads = jax.jit(jax.grad(lambda p, x: jnp.sum(layers.apply({"params": p}, x) * out_grad), argnums=(0, 1)))
        return lambda: jax.block_until_ready(grads(params, x))

    ours = throughput.Ours(depth, width, scan_layers=depth > throughput.UNROLL_UP_TO_DEPTH)
    model_grads = jax.jit(lambda params, batch: loss_and_grads(ours.model, params, batch)[2])
    peer = throughput.Peer(throughput.load_peer(peer_path), depth, width)
    peer_block = peer.model.transformer.h[0]
    peer_x, peer_out_grad = (torch.from_numpy(np.array(a)) for a in (x, out_grad))
    peer_x.requires_grad_(True)

    def peer_layer():
        peer.model.zero_grad(set_to_none=True)
        peer_x.grad = None
        (peer_block(peer_x) * peer_out_grad).sum().backward()

    def peer_model():
        _, loss = peer.model(peer.inputs, peer.targets)
        peer.model.zero_grad(set_to_none=True)
        loss.backward()

    measured = {
        "one layer": (layers_grads(1), peer_layer),
        f"{depth} layers chained": (layers_grads(depth), None),
        "model gradients": (lambda: jax.block_until_ready(model_grads(ours.state["params"], ours.batch)), peer_model),
        "train step": (lambda: ours.run(1), lambda: peer.run(1)),
    }
    times = {(what, side): [] for what, pair in measured.items() for side, f in zip(("ours", "peer"), pair) if f}
    for function in (f for pair in measured.values() for f in pair if f):
        function()  # compile and warm up
    for _ in range(rounds):
        for what, pair in measured.items():
            for side, function in zip(("ours", "peer"), pair):
                if function:
                    times[(what, side)] += _times_ms(function, 1, calls=2)
    rows = []
    for what in measured:
        ours_ms = statistics.median(times[(what, "ours")])
        peer_ms = statistics.median(times[(what, "peer")]) if (what, "peer") in times else None
        rows.append({"config": f"{depth}x{width}", "what": what, "ours_ms": ours_ms, "peer_ms": peer_ms,
                     "peer_over_ours": None if peer_ms is None else peer_ms / ours_ms})
    return rows


def main() -> None:
    parser = cli.doc_parser(__doc__)
    parser.add_argument("--part", choices=("matmuls", "causal-blocks", "weight-grad", "composition"), required=True,
                        help="which measurement (see above)")
    parser.add_argument("--width", type=int, default=256, help="model width for --part matmuls and weight-grad's products (default: 256)")
    parser.add_argument("--configs", nargs="+", default=["2x64", "4x128", "4x256"], metavar="LxD",
                        help="depth x width pairs for the parts that build steps (default: %(default)s)")
    parser.add_argument("--peer", default=os.environ.get("NANOGPT_MODEL"),
                        help="nanoGPT's model.py, for --part composition (default: $NANOGPT_MODEL)")
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
    if args.part == "composition":
        if not args.peer:
            print("error: --part composition needs --peer PATH (nanoGPT's model.py) or NANOGPT_MODEL", file=sys.stderr)
            sys.exit(2)
        print(f"{'L x d':>7} {'what':>20} {'ours ms':>8} {'peer ms':>8} {'peer/ours':>9}")
        for depth, width in configs:
            for row in composition(depth, width, args.peer, args.rounds):
                peer_ms = "" if row["peer_ms"] is None else f"{row['peer_ms']:.1f}"
                ratio = "" if row["peer_over_ours"] is None else f"{row['peer_over_ours']:.3f}"
                print(f"{row['config']:>7} {row['what']:>20} {row['ours_ms']:>8.1f} {peer_ms:>8} {ratio:>9}")
        return
    if args.part == "weight-grad":
        print(f"{'weight gradient':>24} {'of':>30} {'folded ms':>9} {'written out ms':>14} {'torch ms':>8}")
        for row in weight_grad_products(args.width, args.rounds):
            print(f"{row['shape']:>24} {row['what']:>30} {row['folded']:>9.2f} {row['written_out']:>14.2f} "
                  f"{row['torch']:>8.2f}")
        print(f"{'L x d':>7} {'plain ms':>8} {'transposed ms':>13} {'speedup':>7} {'max |loss diff|':>15} {'last loss':>9}")
        for depth, width in configs:
            row = weight_grad(depth, width, args.rounds)
            print(f"{row['config']:>7} {row['plain_ms']:>8.1f} {row['transposed_ms']:>13.1f} {row['speedup']:>7.3f} "
                  f"{row['loss_max_abs_diff']:>15.2e} {row['last_loss']:>9.4f}")
        return
    print(f"{'L x d':>7} {'blocks':>6} {'square ms':>9} {'blocked ms':>10} {'speedup':>7}")
    for depth, width in configs:
        row = causal_blocks(depth, width, args.rounds)
        print(f"{row['config']:>7} {row['blocks']:>6} {row['square_ms']:>9.1f} {row['blocked_ms']:>10.1f} "
              f"{row['speedup']:>7.3f}")


if __name__ == "__main__":
    from scaling.entry import prepare_process

    prepare_process()  # as every command line does first: no TPU probe on a CPU machine; the storage emulator
    main()
