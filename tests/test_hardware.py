"""The one hardware table: documented figures, lookup by JAX's device kind, and the trainer's MFU from it."""

import dataclasses
import warnings

import jax
import pytest

import tiny
from scaling import hardware
from scaling.model.flops import model_flops_utilization
from scaling.store.metrics_log import read_metrics
from sweeps import hosts


def test_chip_table_holds_the_documented_figures_of_four_generations():
    # The Cloud TPU documentation's per-chip figures (one page per generation, cited in scaling/hardware.py),
    # in the cost model's units: HBM in GiB, bf16 FLOP/s, HBM bytes/s, ICI bytes/s in one direction (Gbps / 8).
    documented = {"v4": (32, 275e12, 1200e9, 2400e9 / 8, 3), "v5e": (16, 197e12, 819e9, 1600e9 / 8, 2),
                  "v5p": (95, 459e12, 2765e9, 4800e9 / 8, 3), "v6e": (32, 918e12, 1640e9, 3200e9 / 8, 2)}
    assert set(hardware.TPUS) == set(documented)
    for name, (gib, flops, hbm, ici, dims) in documented.items():
        chip = hardware.TPUS[name]
        assert (chip.hbm_bytes, chip.bf16_flops, chip.hbm_bandwidth, chip.link_bandwidth) == (
            gib * 2**30, flops, hbm, ici), name
        assert (chip.tpu.dims, chip.links) == (dims, 2 * dims), name  # a neighbour each side of each dimension
        assert chip.chips_per_host == hardware.TPU_CHIPS_PER_HOST
    # Accelerator types count TensorCores: a v4 or v5p chip has two (v4-32 is 16 chips), v5e and v6e one.
    assert {name: f"{chip.tpu.accelerator_prefix}{16 * chip.tpu.cores_per_chip}"
            for name, chip in hardware.TPUS.items()} == {
        "v4": "v4-32", "v5e": "v5litepod-16", "v5p": "v5p-32", "v6e": "v6e-16"}


@pytest.mark.parametrize("kind, name", [
    ("TPU v4", "v4"), ("TPU v5 lite", "v5e"), ("TPU v5", "v5p"), ("TPU v6 lite", "v6e"),  # libtpu's names
    ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H200", "H200"),
    ("NVIDIA B200", "B200"), ("cpu", "cpu")])
def test_device_kinds_find_their_accelerator(kind, name):
    assert hardware.for_device_kind(kind).name == name


@pytest.mark.parametrize("kind", ["NVIDIA H100 PCIe", "NVIDIA A100-SXM4-40GB", "TPU v7", "AMD Instinct MI300X"])
def test_parts_the_table_does_not_describe_are_not_guessed(kind):
    # A PCIe H100 or a 40 GB A100 has other figures than the SXM parts in the table.
    assert hardware.for_device_kind(kind) is None


def test_peak_by_dtype_and_the_configured_override():
    assert hardware.H100.peak_flops("bfloat16") == 989e12 and hardware.H100.peak_flops("float32") == 494.5e12
    assert hardware.mfu_peak_flops(None, "bfloat16", "TPU v5 lite") == 197e12
    assert hardware.mfu_peak_flops(None, "float32", "cpu") == hardware.CPU.peak_flops("float32")
    assert hardware.mfu_peak_flops(3e13, "bfloat16", "TPU v5 lite") == 3e13  # the config's figure wins
    with pytest.raises(ValueError, match="dtype"):
        hardware.H100.peak_flops("float16")


def test_an_unknown_device_kind_warns_once_and_falls_back_to_the_cpu_figure(monkeypatch):
    monkeypatch.setattr(hardware, "_warned", set())
    with pytest.warns(RuntimeWarning, match="'Mystery Chip 9'"):
        assert hardware.mfu_peak_flops(None, "bfloat16", "Mystery Chip 9") == hardware.CPU.peak_flops("bfloat16")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second warning for the same kind would raise here
        assert hardware.mfu_peak_flops(None, "bfloat16", "Mystery Chip 9") == hardware.CPU.peak_flops("bfloat16")


def test_entries_are_validated_naming_the_field():
    with pytest.raises(ValueError, match="bf16_flops"):
        dataclasses.replace(hardware.H100, bf16_flops=0.0)
    with pytest.raises(ValueError, match="tpu"):
        dataclasses.replace(hardware.H100, tpu=hardware.TPU_V5E.tpu)
    with pytest.raises(ValueError, match="dims"):
        dataclasses.replace(hardware.TPU_V5E.tpu, dims=4)


def test_the_launchers_host_logic_reads_the_same_table():
    assert hosts.one_host_accelerator_type("v4-32") == "v4-8"  # two TensorCores per chip
    assert hosts.one_host_accelerator_type("v5litepod-16") == "v5litepod-4"
    assert hosts.one_host_accelerator_type("v3-32") == "v3-8"  # older families keep their grids too
    assert set(hosts._CORE_COUNTED) == {"v2", "v3", "v4", "v5p"}


def test_the_trainers_mfu_divides_by_the_devices_peak_from_the_table(tmp_path, monkeypatch):
    # A CPU entry with another peak: the logged MFU must follow it, since the config names none.
    faster = dataclasses.replace(hardware.CPU, bf16_flops=4e12, f32_flops=4e12)
    monkeypatch.setattr(hardware, "ACCELERATORS", tuple(faster if a is hardware.CPU else a
                                                        for a in hardware.ACCELERATORS))
    config = tiny.config()
    assert config.peak_flops is None
    tiny.run(config, tmp_path / "looked-up")
    rows = [row for row in read_metrics(tmp_path / "looked-up") if row.get("mfu") is not None]
    assert rows
    for row in rows:
        expected = model_flops_utilization(config.model, config.data.seq_len, row["tokens_per_second"], 4e12,
                                           jax.device_count())
        assert row["mfu"] == pytest.approx(expected, rel=1e-6)
    # A configured peak overrides the table.
    tiny.run(tiny.config(peak_flops=1e9), tmp_path / "configured")
    row = next(row for row in read_metrics(tmp_path / "configured") if row.get("mfu") is not None)
    assert row["mfu"] == pytest.approx(model_flops_utilization(config.model, config.data.seq_len,
                                                               row["tokens_per_second"], 1e9, jax.device_count()),
                                       rel=1e-6)
