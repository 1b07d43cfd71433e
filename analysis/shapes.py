"""Shape arithmetic: N = 12·L·d² non-embedding parameters of a transformer of
depth L and width d, and its inverse d = sqrt(N / (12·L)).

12·d² per layer is 4·d² of attention projections and 8·d² of a 4d-wide
feed-forward block, biases and norms left out ("Scaling Laws for Neural
Language Models", section 2.1). Both functions broadcast over numpy arrays.
"""

from __future__ import annotations

import numpy as np


def non_embedding_params(depth, width):
    """N = 12·L·d² (parameters) for depth L (layers) and width d (channels)."""
    return 12.0 * np.asarray(depth, dtype=float) * np.asarray(width, dtype=float) ** 2


def width_at(params, depth):
    """Width d = sqrt(N / (12·L)) in channels for size N (parameters) at depth L (layers)."""
    return np.sqrt(np.asarray(params, dtype=float) / (12.0 * np.asarray(depth, dtype=float)))
