"""One depth pair whose losses cross at a planted size: the test fixture of the transition estimates, the
analysis command line and the pair figures (the sweep-wide synthetic runs are ``analysis.synthetic``)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.shapes import width_at


def planted_pair_runs(shallow: int, deep: int, planted_params: float, rng: np.random.Generator,
                      sizes: int = 11, size_ratio: float = math.sqrt(2.0), seeds: int = 3,
                      noise_shallow: float = 0.02, noise_deep: float = 0.04, slope: float = 0.1,
                      offset: float = 0.0) -> pd.DataFrame:
    """Per-run table of one depth pair whose losses cross exactly at ``planted_params`` (parameters).

    Both depths share the size ladder N_k = N_tr·ratio^(k - sizes//2 + offset)
    (``offset`` in ladder steps), a shared power law in N, and
    loss_shallow - loss_deep = slope·(ln N - ln N_tr) nats per token. Each
    run adds Gaussian seed noise of its depth's std (nats per token); widths
    are left fractional so the planted size is exact.
    """
    rows = []
    steps = np.arange(sizes) - sizes // 2 + offset
    for depth, noise in ((shallow, noise_shallow), (deep, noise_deep)):
        params = planted_params * size_ratio ** steps
        loss = 2.0 + 3.0 * (params / 1e6) ** -0.15
        if depth == deep:
            loss = loss - slope * (np.log(params) - math.log(planted_params))
        for width, size, mean in zip(width_at(params, depth), params, loss):
            for seed in range(seeds):
                rows.append({"depth": depth, "width": float(width), "params": float(size), "seed": seed,
                             "loss": float(mean + rng.normal(0.0, noise))})
    return pd.DataFrame(rows)
