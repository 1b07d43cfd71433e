"""Synthetic sweep results with planted transitions, for tests and the demo notebook.

The loss of depth L at size N (parameters) is a power law shared by all
depths plus a depth term built so that adjacent depths cross exactly at the
planted transition size N_tr(L) = 12·L·e^{2(a + bL)}:

    loss_L(N) = E + A·(N / 1e6)^(-alpha) - slope·Σ_{L' < L} (ln N - ln N_tr(L'))

where the sum runs over the sweep's depths shallower than L. For adjacent
depths the difference loss_shallow - loss_deep = slope·(ln N - ln N_tr(L_shallow)):
the deeper net is worse below its partner's planted transition and better
above it, so the planted transition width of L is e^{a + bL} channels.
Each run adds Gaussian seed noise of ``noise`` nats per token.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.shapes import non_embedding_params, width_at


def planted_width(depth, a: float, b: float):
    """Planted transition width e^{a + bL} (channels) of depth L (layers)."""
    return np.exp(a + b * np.asarray(depth, dtype=float))


def planted_params(depth, a: float, b: float):
    """Planted transition size 12·L·e^{2(a + bL)} (parameters) of depth L (layers)."""
    depth = np.asarray(depth, dtype=float)
    return non_embedding_params(depth, planted_width(depth, a, b))


def expected_loss(depth: int, params, depths, a: float, b: float, slope: float = 0.05,
                  floor: float = 1.5, scale: float = 2.0, exponent: float = 0.1):
    """Noise-free synthetic loss (nats per token) of depth L at size N (parameters)."""
    log_n = np.log(np.asarray(params, dtype=float))
    shallower = [d for d in depths if d < depth]
    depth_term = sum(log_n - math.log(planted_params(d, a, b)) for d in shallower) if shallower else 0.0
    return floor + scale * np.exp(-exponent * (log_n - math.log(1e6))) - slope * depth_term


def synthetic_runs(depths=(2, 4, 6, 8), a: float = 3.0, b: float = 0.25, seeds: int = 3,
                   sizes_per_depth: int = 9, size_ratio: float = 1.6, noise: float = 0.003,
                   slope: float = 0.05, rng: int | np.random.Generator = 0) -> pd.DataFrame:
    """Per-run table (depth, width, params, seed, loss) with planted transitions.

    Each depth gets ``sizes_per_depth`` widths spaced by ``size_ratio`` in N,
    centred on the geometric midpoint of its own and the previous depth's
    planted sizes, so the grid straddles both crossings it takes part in.
    Widths are rounded to whole channels and params = 12·L·d² recomputed from
    them. ``noise`` is the seed standard deviation in nats per token.
    """
    rng = np.random.default_rng(rng)
    depths = sorted(int(d) for d in depths)
    rows = []
    for index, depth in enumerate(depths):
        own = math.log(planted_params(depth, a, b))
        previous = math.log(planted_params(depths[index - 1], a, b)) if index else own
        centre = 0.5 * (own + previous)
        steps = np.arange(sizes_per_depth) - (sizes_per_depth - 1) / 2.0
        targets = np.exp(centre + steps * math.log(size_ratio))
        widths = np.unique(np.maximum(1, np.round(width_at(targets, depth))).astype(int))
        for width in widths:
            params = float(non_embedding_params(depth, width))
            mean = expected_loss(depth, params, depths, a, b, slope=slope)
            for seed in range(seeds):
                rows.append({"depth": depth, "width": int(width), "params": params, "seed": seed,
                             "loss": float(mean + rng.normal(0.0, noise))})
    return pd.DataFrame(rows)
