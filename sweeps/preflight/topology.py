"""TPU slices: the shapes each generation comes in, a slice named like ``v5e:4x4``, and its compile-only devices.

libtpu describes a chip grid of any size as compile-only devices, but not
every grid is a slice one can rent: ``v5e:3x3`` is no slice at all (the
preflight used to check one host of it, a 2x2, and pass), and ``v5e:1x3``
makes libtpu raise a long runtime error. So a mistyped ``--topology`` is
refused before compiling. The shapes, from the Cloud TPU documentation (one
page per generation, and "TPU types and topologies"):

* v5e and v6e (2-D torus, 256-chip pods): 1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16
  and 16x16, and no others (no custom 2-D topologies).
* v4 and v5p (3-D): the small slices 2x2x1, 2x2x2, 2x2x4 and 2x4x4, and from
  64 chips on AxBxC with A <= B <= C, each a multiple of 4, up to the largest
  single slice: 16x16x16 (4096 chips, a whole v4 pod) and 16x16x24 (6144
  chips, v5p's largest single-slice shape).

The chips' facts are ``scaling.hardware``'s. Only ``topology_devices`` needs
JAX (and libtpu); the rest runs before anything is compiled.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import math
import os

from scaling import hardware
from scaling.hardware import TPU_CHIPS_PER_HOST, Accelerator

CHIPS = hardware.TPUS  # generation -> its chip, for every generation the preflight can compile for

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


@dataclasses.dataclass(frozen=True)
class Topology:
    """A TPU slice named like ``v5e:4x4``: generation and chip grid."""

    name: str
    generation: str
    shape: tuple[int, ...]

    @property
    def chip(self) -> Accelerator:
        return CHIPS[self.generation]

    @property
    def chips(self) -> int:
        return math.prod(self.shape)

    @property
    def hosts(self) -> int:
        """TPU VMs of the slice: one for up to 8 chips in a 2-D grid (v5e:2x4) or 4 in 3-D, else 4 chips each."""
        single_host = 8 if self.chip.tpu.dims == 2 else TPU_CHIPS_PER_HOST
        return 1 if self.chips <= single_host else self.chips // TPU_CHIPS_PER_HOST

    def one_host(self) -> "Topology":
        """The 2x2 (2x2x1) slice of one host's chips: what each run gets in host-parallel mode."""
        shape = (2, 2) if self.chip.tpu.dims == 2 else (2, 2, 1)
        return Topology(f"{self.generation}:{_name(shape)}", self.generation, shape)


def parse_topology(name: str) -> Topology:
    """``"v5e:4x4"`` -> Topology; ValueError naming the allowed forms otherwise."""
    generation, _, grid = name.partition(":")
    if generation not in CHIPS:
        raise ValueError(f"--topology {name!r}: unknown TPU generation {generation!r}; allowed "
                         f"{', '.join(CHIPS)} (e.g. v5e:4x4, v4:2x2x4, v5p:2x2x2, v6e:4x4)")
    dims = CHIPS[generation].tpu.dims
    example = "x".join(["4"] * dims)
    try:
        shape = tuple(int(part) for part in grid.split("x"))
    except ValueError:
        shape = ()
    if len(shape) != dims or min(shape) < 1:
        raise ValueError(f"--topology {name!r}: {generation} slices are named by a {dims}-D chip grid, "
                         f"e.g. {generation}:{example}")
    if not is_slice_shape(generation, shape):
        raise ValueError(f"--topology {name!r}: {generation} has no {_name(shape)} slice; "
                         f"its slices are {allowed_shapes(generation)}")
    return Topology(name, generation, shape)


def checked_topology(topology: Topology, pod_wide: bool = False) -> Topology:
    """The slice each run is compiled for: the whole slice pod-wide or on one host, else one host's chips.

    In host-parallel mode (the launcher's default on a multi-host slice) every
    host trains its own runs on its own 2x2 chips, so that is the mesh to check.
    """
    return topology if pod_wide or topology.hosts == 1 else topology.one_host()


def libtpu_installed() -> bool:
    """True when the TPU compiler is importable (the ``tpu`` extra is installed)."""
    return importlib.util.find_spec("libtpu") is not None


@contextlib.contextmanager
def _quiet_libtpu_start(topology: Topology):
    # Off a TPU VM, libtpu looks for the VM's metadata and prints errors about
    # missing TPU_* variables. Naming a slice of the wanted kind silences that;
    # variables a real TPU VM sets are left alone. ALLOW_MULTIPLE_LIBTPU_LOAD
    # lets the preflight run beside a training job that holds libtpu's lock.
    grid = topology.chip.tpu
    names = {"TPU_SKIP_MDS_QUERY": "1", "TPU_WORKER_HOSTNAMES": "localhost", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
             "TPU_ACCELERATOR_TYPE": f"{grid.accelerator_prefix}{topology.chips * grid.cores_per_chip}"}
    added = [key for key in names if key not in os.environ]
    os.environ.update({key: names[key] for key in added})
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def topology_devices(topology: Topology) -> list:
    """Compile-only JAX devices of the slice, one per chip, with their host (process) numbers."""
    from jax.experimental import topologies

    # Hosts own 2x2 chips on multi-host v4, v5e, v5p and v6e slices. (A single-host
    # 2x4 slice counts as two hosts here; that only makes the batch check stricter.)
    per_host = tuple(min(2, size) for size in topology.shape[:2]) + (1,)
    with _quiet_libtpu_start(topology):
        return list(topologies.get_topology_desc(
            platform="tpu", topology_name=f"{topology.generation}:{_name(topology.shape)}",
            chip_config_name=topology.chip.tpu.chip_config, chips_per_host_bounds=per_host, num_slices=1).devices)
