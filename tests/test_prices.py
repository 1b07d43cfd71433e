"""Prices of accelerator time: SkyPilot's downloaded catalog, a user's --prices file, the shipped table, and
the dollars that dry-run prints (with the device's own peak when no preflight has run)."""

import datetime
import json
import os
import re

import pytest

from sweeps import launch
from sweeps.preflight import prices, sweep_cost

# SkyPilot's GCP catalog, schema v8 (sky/catalog/data_fetchers/fetch_gcp.py writes these columns): a VM row,
# TPU slices priced whole (v5litepod: chips; v5p: TensorCores, two per chip), GPUs priced per row of
# AcceleratorCount, one region outside the US, SkyPilot's $700 placeholder for a v6e price it could not find,
# and a row without a spot price.
CATALOG_V8 = """\
InstanceType,vCPUs,MemoryGiB,AcceleratorName,AcceleratorCount,GpuInfo,Region,AvailabilityZone,Price,SpotPrice
a3-highgpu-1g,26.0,234.0,,,,us-central1,us-central1-a,1.18251,0.36117
,,,H100,1,"{'Gpus': [{'MemoryInfo': {'SizeInMiB': 81920}}]}",us-central1,us-central1-a,4.20076,2.9926
,,,H100,8,"{'Gpus': [{'MemoryInfo': {'SizeInMiB': 81920}}]}",us-east4,us-east4-a,78.37241,17.8848
,,,H100,1,"{'Gpus': [{'MemoryInfo': {'SizeInMiB': 81920}}]}",europe-west4,europe-west4-b,12.73552,2.9112
,,,tpu-v5litepod-8,1,tpu-v5litepod-8,us-central1,us-central1-a,9.6,1.95941
,,,tpu-v5litepod-8,1,tpu-v5litepod-8,us-east5,us-east5-a,9.6,4.8
,,,tpu-v5litepod-8,1,tpu-v5litepod-8,europe-west4,europe-west4-a,12.48,3.55986
,,,tpu-v5litepod-4,1,tpu-v5litepod-4,us-west4,us-west4-a,4.8,1.92
,,,tpu-v5p-8,1,tpu-v5p-8,us-central1,us-central1-a,16.8,3.3428
,,,tpu-v6e-8,1,tpu-v6e-8,us-central2,us-central2-b,700.0,700.0
,,,tpu-v6e-8,1,tpu-v6e-8,us-central1,us-central1-a,21.6,4.35366
,,,tpu-v3-8,1,tpu-v3-8,us-east1,us-east1-d,8.0,
"""
# An older schema SkyPilot left behind: never read when a newer one is there.
CATALOG_V7 = CATALOG_V8.replace("9.6,", "99.0,")


def write_catalog(home, version="v8", text=CATALOG_V8, date=datetime.datetime(2025, 1, 2, 12)):
    path = home / ".sky" / "catalogs" / version / "gcp" / "vms.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (date.timestamp(), date.timestamp()))
    return path


def test_skypilots_downloaded_catalog_is_read_per_chip_in_us_regions(tmp_path):
    write_catalog(tmp_path, "v7", CATALOG_V7)
    path = write_catalog(tmp_path)
    table = prices.load_prices(home=str(tmp_path))
    assert str(path) in table.source and table.date == "modified 2025-01-02"
    v5e = table.price("v5e")
    assert v5e.on_demand == pytest.approx((1.20, 1.20))  # 9.6 a slice of 8 chips; the v7 file and Europe unread
    assert v5e.spot == pytest.approx((1.95941 / 8, 0.60))
    assert table.price("v5p").on_demand == pytest.approx((4.20, 4.20))  # 8 TensorCores = 4 chips
    assert table.price("v6e").on_demand == pytest.approx((2.70, 2.70))  # the $700 placeholder left out
    assert table.price("v6e").spot == pytest.approx((4.35366 / 8,) * 2)
    h100 = table.price("h100")  # any case
    assert h100.on_demand == pytest.approx((4.20076, 78.37241 / 8)) and h100.spot == pytest.approx((2.2356, 2.9926))
    assert table.price("v3").spot is None and table.price("a3-highgpu-1g") is None  # no spot; VMs are not devices


def test_a_prices_file_comes_first_and_a_catalog_without_its_columns_is_refused(tmp_path):
    write_catalog(tmp_path)
    mine = tmp_path / "mine.csv"
    mine.write_text("# my negotiated rates\ndevice,on_demand,spot\nv5e,0.90,0.20-0.45\nH100,3.00,\n")
    table = prices.load_prices(str(mine), home=str(tmp_path))
    assert table.source == f"--prices {mine}" and table.date.startswith("modified ")
    assert table.price("v5e").on_demand == (0.90, 0.90) and table.price("v5e").spot == (0.20, 0.45)
    assert table.price("H100").spot is None
    # A SkyPilot catalog may be given as --prices too.
    assert prices.load_prices(str(write_catalog(tmp_path / "copy"))).price("v5e").on_demand == pytest.approx((1.2, 1.2))


def test_without_a_catalog_the_shipped_table_names_its_source_and_date(tmp_path):
    (tmp_path / ".sky").mkdir()  # SkyPilot installed, its catalog not yet downloaded
    table = prices.load_prices(home=str(tmp_path))
    assert "sweeps/preflight/price_table.py" in table.source and "SkyPilot" in table.source
    assert re.fullmatch(r"read \d{4}-\d\d-\d\d", table.date)
    # v5e on demand: $1.20 a chip-hour in most US regions, $1.416 in us-south1 (a range, as v5p's is).
    assert table.price("v5e").on_demand == (1.20, 1.416) and table.price("v5e").spot == (0.24493, 0.60)
    # A damaged SkyPilot catalog is SkyPilot's problem, not the user's: the shipped table, saying why.
    write_catalog(tmp_path, text="InstanceType,Price\n")
    table = prices.load_prices(home=str(tmp_path))
    assert "sweeps/preflight/price_table.py" in table.source and "missing column AcceleratorName" in table.source


@pytest.mark.parametrize("text, message", [
    ("name,price\nv5e,1.2\n", "missing column device, on_demand"),
    ("device,on_demand,spot\nv5e,1.2,0.5\nH100,4.2,cheap\n", "data line 3: column spot: 'cheap'"),
    ("device,on_demand,spot\nv5e,-1,\n", "data line 2: column on_demand: '-1'"),
    ("device,on_demand,spot\nv5e,2-1,\n", "column on_demand: '2-1'"),
    ("device,on_demand\n,1.2\n", "data line 2: column device is empty"),
    ("device,on_demand\n", "no prices"),
    ("InstanceType,AcceleratorName,Price\n,tpu-v5litepod-8,9.6\n",
     "missing column AcceleratorCount, Region, SpotPrice"),
])
def test_a_bad_prices_file_is_one_line_naming_the_file_and_column(tmp_path, text, message):
    bad = tmp_path / "bad.csv"
    bad.write_text(text)
    with pytest.raises(prices.PriceError) as caught:
        prices.load_prices(str(bad), home=str(tmp_path))
    assert str(bad) in str(caught.value) and message in str(caught.value) and "\n" not in str(caught.value)


def test_cost_prices_both_ends_of_a_range_of_hours():
    table = prices.parse_price_csv("device,on_demand,spot\nv5e,1.20,0.25-0.60\n", "test", "today")
    cost = prices.cost(table, "v5e", (10.0, 20.0))
    assert cost["usd_on_demand"] == pytest.approx([12.0, 24.0]) and cost["usd_spot"] == pytest.approx([2.5, 12.0])
    line = prices.cost_line(cost, "v5e", table)
    assert "$12.00–24.00 on demand ($1.20/chip-hour of v5e)" in line and "$2.50–12.00 spot" in line
    assert prices.cost(table, "H100", 5.0) is None and "no price for 'H100'" in prices.cost_line(None, "H100", table)
    # Hours the preflight could not count (an uncounted loop) leave the price unknown, never a smaller number.
    assert prices.cost(table, "v5e", None) is None and prices.cost_line(None, "v5e", table).startswith("price: unknown")


# A sweep that names no device (peak_flops left at the CPU default), 2 runs.
SWEEP = '''
from scaling.config import DataConfig, ModelConfig, TrainConfig
from sweeps.spec import Sweep

def sweep():
    base = TrainConfig(model=ModelConfig(head_dim=16, max_seq_len=64), data=DataConfig(seq_len=64),
                       batch_size=8, steps=1000{extra})
    return Sweep(name="priced", base=base, depths=(2,), widths={{2: (64, 128)}})
'''


def dry_run_json(tmp_path, capsys, *options, extra=""):
    path = tmp_path / "sweep.py"
    path.write_text(SWEEP.format(extra=extra))
    assert launch.main(["dry-run", str(path), "--workdir", str(tmp_path / "runs"), "--json", *options]) == 0
    return json.loads(capsys.readouterr().out)


def test_dry_run_uses_the_named_devices_own_peak_and_prices_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no SkyPilot catalog: the shipped table
    guessed = dry_run_json(tmp_path, capsys)  # peak_flops=2.2e11, no device: a CPU-sized guess, no price
    assert guessed["device"] is None and guessed["cost"] is None
    h100 = dry_run_json(tmp_path, capsys, "--device", "h100")
    assert h100["device"] == "H100"
    assert h100["device_hours"] == pytest.approx(h100["flops"] / (sweep_cost.GUESSED_UTILISATION * 989e12) / 3600)
    assert h100["cost"]["usd_on_demand"][0] == pytest.approx(h100["device_hours"] * 4.20076)
    # A sweep whose peak_flops is v5e's is priced as v5e without being told.
    v5e = dry_run_json(tmp_path, capsys, extra=", peak_flops=1.97e14")
    assert v5e["device"] == "v5e" and v5e["cost"]["price_on_demand"] == [1.20, 1.416]
    mine = tmp_path / "mine.csv"
    mine.write_text("device,on_demand,spot\nv5e,2.00,\n")
    assert dry_run_json(tmp_path, capsys, "--prices", str(mine), extra=", peak_flops=1.97e14")["cost"][
        "usd_on_demand"][0] == pytest.approx(v5e["device_hours"] * 2.0)


def test_dry_run_prints_the_price_and_refuses_bad_input_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    write_catalog(tmp_path)
    path = tmp_path / "sweep.py"
    path.write_text(SWEEP.format(extra=""))
    assert launch.main(["dry-run", str(path), "--workdir", str(tmp_path / "runs"), "--device", "v5e"]) == 0
    out = capsys.readouterr().out
    assert "at 30% of peak_flops=1.97e+14 FLOP/s (v5e), a guess" in out
    price = next(line for line in out.splitlines() if line.startswith("price: "))
    assert "$1.20/chip-hour of v5e" in price and "SkyPilot catalog" in price and "modified 2025-01-02" in price
    bad = tmp_path / "bad.csv"
    bad.write_text("device,on_demand\nv5e,free\n")
    for options, message in ((["--prices", str(bad)], f"{bad}: data line 2: column on_demand"),
                             (["--device", "tpu9"], "--device 'tpu9': unknown device")):
        assert launch.main(["dry-run", str(path), "--workdir", str(tmp_path / "runs"), *options]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1
