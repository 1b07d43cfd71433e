"""What a TPU chip's matrix units do per clock cycle, and so its clock: the facts the two step estimates need
beyond ``scaling.hardware`` (``sweeps.preflight.roofline_corrections``, ``sweeps.preflight.compiler_estimate``).

    clock = peak bf16 FLOP/s / (2 FLOPs per multiply-add × MXUs per chip × MXU width²)

Per generation, from the Cloud TPU documentation (one page per generation, as
cited in ``sweeps.preflight.roofline``): v4 and v5p have 2 TensorCores per chip, v5e and
v6e one; each TensorCore has 4 matrix-multiply units (MXUs), 128×128 up to v5p
and 256×256 on v6e. That gives v5e 197e12 / (2 × 4 × 128²) = 1.50 GHz, v4
1.05 GHz (the TPU v4 paper, "TPU v4: An Optically Reconfigurable
Supercomputer for Machine Learning...", gives 1050 MHz), v5p 1.75 GHz and v6e
1.75 GHz. The v6e page has read both "2" and "4" MXUs per TensorCore; libtpu's
own cost model settles it: it estimates a 4096³ bf16 matmul on v6e at 301,616
cycles, fewer than two 256² MXUs could do it in (524,288), and 87% of what four
can. libtpu counts its ``estimated_cycles`` in these cycles: on v5e it puts the
same matmul at 1,083,068 cycles, 97% of peak at 1.50 GHz
(``tests/test_estimates.py`` compiles it again).
"""

from __future__ import annotations

import dataclasses

from sweeps.preflight.topology import CHIPS


@dataclasses.dataclass(frozen=True)
class MatrixUnits:
    """A chip's matrix-multiply units: how many (all TensorCores together) and their width (a width × width array)."""

    count: int
    width: int

    def __post_init__(self):
        if self.count < 1 or self.width < 1:
            raise ValueError(f"MatrixUnits: count {self.count} and width {self.width} must be >= 1")

    @property
    def flops_per_cycle(self) -> int:
        """bf16 FLOPs per clock cycle at peak: 2 per multiply-add of every cell of every MXU."""
        return 2 * self.count * self.width**2


MATRIX_UNITS = {"v4": MatrixUnits(2 * 4, 128), "v5e": MatrixUnits(4, 128), "v5p": MatrixUnits(2 * 4, 128),
                "v6e": MatrixUnits(4, 256)}


def clock_hz(generation: str) -> float | None:
    """The TensorCore clock of a TPU generation in Hz (v5e: 1.50e9), None for one whose matrix units are not known."""
    units = MATRIX_UNITS.get(generation)
    if units is None or generation not in CHIPS:
        return None
    return CHIPS[generation].bf16_flops / units.flops_per_cycle


def mxu_width(generation: str) -> int | None:
    """The side of one matrix unit (128 up to v5p, 256 on v6e); None for an unknown generation."""
    units = MATRIX_UNITS.get(generation)
    return units.width if units else None
