"""What each accelerator can do, per chip: the one table of hardware facts.

Used by the trainer's MFU (its peak FLOP/s, looked up from JAX's
``device_kind``), by the TPU cost model (``sweeps.preflight``: HBM, FLOP/s,
bandwidths, the chip grid) and by the launcher's host logic (chips per host,
which TPU families count TensorCores). Every figure is the vendor's published
one, named in a comment; nothing here was measured on the hardware, except the
CPU entry, which is the dev machine's measured matmul peak.

Units: FLOP/s dense (no sparsity), bytes, bytes/s. ``link_bandwidth`` is one
direction, all links of the chip together (a ring collective sends each byte
once); one link carries ``link_bandwidth / links``.

    hardware.for_device_kind("TPU v5 lite").bf16_flops   # 1.97e14
    hardware.mfu_peak_flops(None, "bfloat16")             # this process's first device's peak
"""

from __future__ import annotations

import dataclasses
import re
import warnings

GIB = 2**30
TPU_CHIPS_PER_HOST = 4  # every host of a multi-host v2, v3, v4, v5e, v5p or v6e slice
DTYPES = ("float32", "bfloat16")  # the compute dtypes of scaling.config.ModelConfig


@dataclasses.dataclass(frozen=True)
class TpuGrid:
    """What only a TPU chip has: its place in a slice's chip grid and libtpu's names for it."""

    dims: int  # chip-grid dimensions in topology names: v5e:4x4 (2), v4:2x2x4 (3)
    cores_per_chip: int  # accelerator-type names count TensorCores (v4-32 = 16 chips)
    accelerator_prefix: str  # accelerator type without its size: "v5litepod-" as in v5litepod-16
    chip_config: str  # libtpu chip config giving one JAX device per chip, as on the TPU VMs

    def __post_init__(self):
        _require(self.dims in (2, 3), "dims", "2 or 3", self.dims)
        _require(self.cores_per_chip in (1, 2), "cores_per_chip", "1 or 2", self.cores_per_chip)
        _require(self.accelerator_prefix.endswith("-"), "accelerator_prefix", "a name ending in '-'",
                 self.accelerator_prefix)

    @property
    def family(self) -> str:
        """The accelerator-type family: ``v5litepod`` for v5e."""
        return self.accelerator_prefix[:-1]


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """Public facts about one accelerator, per chip (units in the module docstring)."""

    name: str  # "v5e", "H100", "cpu"
    platform: str  # JAX's platform: "tpu", "gpu" or "cpu"
    device_kinds: str  # regular expression matching JAX's Device.device_kind of this chip (whole string)
    bf16_flops: float  # dense bfloat16 matmul FLOP/s
    f32_flops: float  # dense float32 matmul FLOP/s at JAX's default precision (see the table's notes)
    hbm_bytes: int  # device memory capacity (0: host memory, CPU)
    hbm_bandwidth: float  # device memory bytes/s
    link_bandwidth: float  # chip-to-chip interconnect (ICI, NVLink) bytes/s, one direction, all links
    links: int  # interconnect links per chip
    chips_per_host: int  # chips of one host (one VM, one HGX board)
    tpu: TpuGrid | None = None

    def __post_init__(self):
        _require(self.platform in ("tpu", "gpu", "cpu"), "platform", "tpu, gpu or cpu", self.platform)
        for field in ("bf16_flops", "f32_flops"):
            _require(getattr(self, field) > 0, field, "> 0 FLOP/s", getattr(self, field))
        for field in ("hbm_bytes", "hbm_bandwidth", "link_bandwidth", "links"):
            _require(getattr(self, field) >= 0, field, ">= 0", getattr(self, field))
        _require(self.chips_per_host >= 1, "chips_per_host", ">= 1", self.chips_per_host)
        _require((self.tpu is not None) == (self.platform == "tpu"), "tpu", "a TpuGrid exactly for TPUs", self.tpu)

    def peak_flops(self, dtype: str = "bfloat16") -> float:
        """Dense matmul FLOP/s per chip for compute ``dtype`` (``float32`` or ``bfloat16``)."""
        _require(dtype in DTYPES, "dtype", " or ".join(DTYPES), dtype)
        return self.bf16_flops if dtype == "bfloat16" else self.f32_flops


def _require(ok: bool, field: str, allowed: str, value) -> None:
    if not ok:
        raise ValueError(f"{field}={value!r} is invalid: allowed {allowed}")


def _tpu(name, kinds, flops, hbm_gib, hbm_bandwidth, ici_bits, grid: TpuGrid) -> Accelerator:
    # TPUs run float32 matmuls at JAX's default precision as single bfloat16 passes: one peak for both.
    return Accelerator(name, "tpu", kinds, flops, flops, hbm_gib * GIB, hbm_bandwidth, ici_bits / 8, 2 * grid.dims,
                       TPU_CHIPS_PER_HOST, grid)


# TPUs, from the Cloud TPU documentation, one page per generation:
#   v4:  https://cloud.google.com/tpu/docs/v4        275 TFLOP/s bf16, 32 GiB HBM2 at 1200 GB/s
#        ICI: 2400 Gbps per chip, from the v4 column of the comparison table in
#        https://cloud.google.com/blog/products/ai-machine-learning/introducing-cloud-tpu-v5p-and-ai-hypercomputer
#   v5e: https://cloud.google.com/tpu/docs/v5e       197 TFLOP/s, 16 GB HBM2 at 819 GB/s, ICI 1600 Gbps
#   v5p: https://cloud.google.com/tpu/docs/v5p       459 TFLOP/s, 95 GB HBM2e at 2765 GB/s, ICI 4800 Gbps
#   v6e: https://cloud.google.com/tpu/docs/v6e       918 TFLOP/s, 32 GB HBM at 1640 GB/s, ICI 3200 Gbps
# ICI in Gbps is one direction, all links of the chip together; the pages' newer "bidirectional GBps"
# rows are twice Gbps/8 (v5e 400, v5p 1200, v6e 800 GB/s). A chip has a neighbour on each side of every
# grid dimension: 4 links on 2-D slices, 6 on 3-D. HBM capacity is counted in GiB because libtpu does
# (it reports 15.75 of 16 GiB usable on v5e). The compiler agrees on v5e's peak: its optimal_seconds
# for a lone matmul is flops / 197e12. Device kinds are what libtpu's devices report (tests/test_preflight.py).
TPU_V4 = _tpu("v4", "TPU v4", 275e12, 32, 1200e9, 2400e9, TpuGrid(3, 2, "v4-", "megacore"))
TPU_V5E = _tpu("v5e", "TPU v5 lite", 197e12, 16, 819e9, 1600e9, TpuGrid(2, 1, "v5litepod-", "default"))
TPU_V5P = _tpu("v5p", "TPU v5", 459e12, 95, 2765e9, 4800e9, TpuGrid(3, 2, "v5p-", "megacore"))
TPU_V6E = _tpu("v6e", "TPU v6 lite", 918e12, 32, 1640e9, 3200e9, TpuGrid(2, 1, "v6e-", "default"))

# NVIDIA GPUs, SXM parts on 8-GPU HGX boards, dense figures (the datasheets' sparse ones halved);
# float32 is TF32, which JAX's default precision uses for float32 matmuls on these GPUs. NVLink is
# the datasheets' bidirectional figure halved. Device kinds as CUDA names the parts.
#   A100: NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM: BF16 312 TFLOPS, TF32 156, HBM2e 2039 GB/s,
#         NVLink 600 GB/s (12 links); 80 GiB (nvidia-smi: 81920 MiB)
#   H100: NVIDIA H100 Tensor Core GPU datasheet, SXM: BF16 989 TFLOPS, TF32 494.5, HBM3 3.35 TB/s,
#         NVLink 900 GB/s (18 links); 80 GiB
#   H200: NVIDIA H200 Tensor Core GPU datasheet, SXM: BF16 989 TFLOPS, TF32 494.5, 141 GB HBM3e at 4.8 TB/s,
#         NVLink 900 GB/s (18 links)
#   B200: NVIDIA HGX B200 datasheet, per GPU: BF16 2.25 PFLOPS, TF32 1.1 PFLOPS, 180 GB HBM3e at 7.7 TB/s,
#         NVLink 5 1.8 TB/s (18 links)
A100 = Accelerator("A100", "gpu", r"NVIDIA A100[- ]SXM4?[- ]80GB", 312e12, 156e12, 80 * GIB, 2039e9, 300e9, 12, 8)
H100 = Accelerator("H100", "gpu", r"NVIDIA H100 80GB HBM3|NVIDIA H100 SXM.*", 989e12, 494.5e12, 80 * GIB, 3350e9,
                   450e9, 18, 8)
H200 = Accelerator("H200", "gpu", r"NVIDIA H200( SXM.*)?", 989e12, 494.5e12, 141 * 10**9, 4800e9, 450e9, 18, 8)
B200 = Accelerator("B200", "gpu", r"NVIDIA B200", 2250e12, 1100e12, 180 * 10**9, 7700e9, 900e9, 18, 8)

# The dev machine's CPU (JAX's device_kind "cpu"): its measured float32 matmul peak, used for both
# dtypes (a CPU has no faster bfloat16 units). Not a property of CPUs in general: set TrainConfig's
# peak_flops for another machine's figure.
CPU = Accelerator("cpu", "cpu", r"cpu", 2.2e11, 2.2e11, 0, 0.0, 0.0, 0, 1)

ACCELERATORS = (TPU_V4, TPU_V5E, TPU_V5P, TPU_V6E, A100, H100, H200, B200, CPU)
TPUS = {accelerator.name: accelerator for accelerator in ACCELERATORS if accelerator.tpu is not None}
# Every TPU accelerator-type family's grid: the table's, and v2 and v3, which nothing here prices but
# the launcher meets in accelerator types (two TensorCores per chip: "System architecture", Cloud TPU docs).
TPU_GRIDS = {**{accelerator.tpu.family: accelerator.tpu for accelerator in TPUS.values()},
             "v2": TpuGrid(2, 2, "v2-", "default"), "v3": TpuGrid(2, 2, "v3-", "default")}


def for_device_kind(device_kind: str) -> Accelerator | None:
    """The table's entry whose ``device_kinds`` matches ``device_kind`` (JAX's name), or None."""
    for accelerator in ACCELERATORS:
        if re.fullmatch(accelerator.device_kinds, device_kind.strip(), flags=re.IGNORECASE):
            return accelerator
    return None


def tpu_grid(family: str) -> TpuGrid | None:
    """The chip grid of a TPU accelerator-type family (``v4``, ``v5litepod``, ``v5p``, ``v6e``, ``v2``, ``v3``),
    or None for a family the table does not know."""
    return TPU_GRIDS.get(family)


_warned: set[str] = set()


def mfu_peak_flops(configured: float | None, dtype: str, device_kind: str | None = None) -> float:
    """The peak FLOP/s per device that MFU divides by: ``configured`` (``TrainConfig.peak_flops``) when
    set, else the table's figure for ``device_kind`` (default: this process's first JAX device) at
    compute ``dtype``. A device kind the table lacks gets the CPU entry's figure, with one warning."""
    if configured is not None:
        return configured
    if device_kind is None:
        import jax

        device_kind = jax.devices()[0].device_kind
    accelerator = for_device_kind(device_kind)
    if accelerator is None:
        if device_kind not in _warned:
            _warned.add(device_kind)
            warnings.warn(f"no peak FLOP/s is known for device kind {device_kind!r} (scaling/hardware.py): MFU "
                          f"uses the CPU entry's {CPU.peak_flops(dtype):.3g}; set peak_flops in the config",
                          RuntimeWarning, stacklevel=2)
        accelerator = CPU
    return accelerator.peak_flops(dtype)


def nominal_peak_flops(configured: float | None) -> float:
    """``configured`` when set, else the CPU entry's float32 figure: the peak a plan quotes before any
    device is seen (``sweeps.launch dry-run``)."""
    return configured if configured is not None else CPU.peak_flops("float32")
