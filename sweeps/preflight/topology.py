"""The slice shapes each TPU generation comes in, so that a mistyped ``--topology`` is refused before compiling.

libtpu describes a chip grid of any size as compile-only devices, but not
every grid is a slice one can rent: ``v5e:3x3`` is no slice at all (the
preflight used to check one host of it, a 2x2, and pass), and ``v5e:1x3``
makes libtpu raise a long runtime error. The shapes, from the Cloud TPU
documentation (one page per generation, and "TPU types and topologies"):

* v5e and v6e (2-D torus, 256-chip pods): 1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16
  and 16x16, and no others (no custom 2-D topologies).
* v4 and v5p (3-D): the small slices 2x2x1, 2x2x2, 2x2x4 and 2x4x4, and from
  64 chips on AxBxC with A <= B <= C, each a multiple of 4, up to the largest
  single slice: 16x16x16 (4096 chips, a whole v4 pod) and 16x16x24 (6144
  chips, v5p's largest single-slice shape).

Nothing here imports JAX: the check runs before anything is compiled.
"""

from __future__ import annotations

import math

# Every 2-D slice shape, as the generation's documentation lists them.
_TWO_D = ((1, 1), (2, 2), (2, 4), (4, 4), (4, 8), (8, 8), (8, 16), (16, 16))
# 3-D slices under 64 chips; larger ones follow the multiple-of-4 rule below.
_SMALL_THREE_D = ((2, 2, 1), (2, 2, 2), (2, 2, 4), (2, 4, 4))
# The most chips in one 3-D slice of each generation.
LARGEST_SLICE_CHIPS = {"v4": 4096, "v5p": 6144}
TWO_D_SHAPES = {"v5e": _TWO_D, "v6e": _TWO_D}


def _name(shape) -> str:
    return "x".join(map(str, shape))


def is_slice_shape(generation: str, shape: tuple[int, ...]) -> bool:
    """Whether ``shape`` (chips per grid dimension) is a slice ``generation`` comes in."""
    if generation in TWO_D_SHAPES:
        return tuple(shape) in TWO_D_SHAPES[generation]
    if generation in LARGEST_SLICE_CHIPS:
        if tuple(shape) in _SMALL_THREE_D:
            return True
        return (len(shape) == 3 and list(shape) == sorted(shape) and all(size % 4 == 0 for size in shape)
                and math.prod(shape) <= LARGEST_SLICE_CHIPS[generation])
    raise ValueError(f"no slice shapes are known for TPU generation {generation!r}")


def allowed_shapes(generation: str) -> str:
    """The slice shapes of ``generation`` in words, for an error message (one line)."""
    if generation in TWO_D_SHAPES:
        return ", ".join(_name(shape) for shape in TWO_D_SHAPES[generation])
    largest = LARGEST_SLICE_CHIPS[generation]
    return (", ".join(_name(shape) for shape in _SMALL_THREE_D)
            + f", or AxBxC with A <= B <= C multiples of 4 up to {largest} chips (e.g. 4x4x4, 4x4x8, 8x8x16)")
