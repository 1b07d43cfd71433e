"""What accelerator time costs in US dollars, on demand and spot, and where the figures come from.

Sources, first found wins:

1. ``--prices FILE``: the user's own CSV, one device per line (``v5e``, ``H100``, ...), US dollars per
   device-hour (per chip for TPUs, per GPU) on demand and spot, each a number or a ``LOW-HIGH`` range,
   spot may be empty; ``#`` starts a comment line::

       device,on_demand,spot
       v5e,1.20,0.24-0.60
       H100,4.20,

   A SkyPilot catalog file (``vms.csv``, below) is accepted too.
2. SkyPilot's own catalog, where SkyPilot has downloaded it: ``~/.sky/catalogs/<schema>/gcp/vms.csv``
   (``sky.catalog.common``: ``CATALOG_DIR`` / ``CATALOG_SCHEMA_VERSION``; the newest schema present is
   read). Its columns (schema v5 to v8): ``InstanceType, vCPUs, MemoryGiB, AcceleratorName,
   AcceleratorCount, GpuInfo, Region, AvailabilityZone, Price, SpotPrice``. Accelerator rows have no
   ``InstanceType``; a TPU row prices a whole slice (``tpu-v5litepod-8``: 8 chips; ``tpu-v4-8`` and
   ``tpu-v5p-8`` count TensorCores, two per chip), a GPU row ``AcceleratorCount`` GPUs. The file's date
   is its modification time (SkyPilot rewrites it when it refreshes the catalog).
3. The table shipped with the project (``sweeps.preflight.price_table``), which names its source and the date it
   was read.

Only US regions are read from a catalog (all regions for a device offered nowhere in the US); a price is
the range from the cheapest region to the dearest. GPU prices are the GPUs alone, without the host VM.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import glob
import io
import math
import os
import re

from scaling import hardware
from sweeps.preflight import price_table

# Peak dense bf16 FLOP/s per device, for dry-run's time when no preflight has run. TPUs: the Cloud TPU
# pages (as scaling/hardware.py's table); GPUs: NVIDIA's data sheets (SXM parts, without sparsity).
# Dense bfloat16 peak per device (scaling.hardware's table), by the names prices use.
PEAK_FLOPS = {**{chip.name: chip.bf16_flops for chip in hardware.ACCELERATORS if chip.platform != "cpu"},
              "A100-80GB": hardware.A100.bf16_flops}

CATALOG_GLOB = os.path.join(".sky", "catalogs", "v*", "gcp", "vms.csv")
CATALOG_COLUMNS = ("InstanceType", "AcceleratorName", "AcceleratorCount", "Region", "Price", "SpotPrice")
# SkyPilot's fetch_gcp.py writes this slice price for a v6e price it could not find (TPU_V6E_MAX_PRICE).
SKYPILOT_MISSING_V6E_PRICE = 700.0
# TPU generation of a catalog name (tpu-<name>-<cores or chips>) and its TensorCores per chip.
TPU_NAMES = {"v5litepod": ("v5e", 1), "v6e": ("v6e", 1), "v5p": ("v5p", 2), "v4": ("v4", 2),
             "v3": ("v3", 2), "v2": ("v2", 2)}
US_REGION_PREFIX = "us-"


class PriceError(ValueError):
    """A price file that cannot be read: one line naming the file, the line and the column."""


@dataclasses.dataclass(frozen=True)
class DevicePrice:
    """US dollars per device-hour: (cheapest, dearest) on demand and spot (None: not offered)."""

    device: str
    on_demand: tuple[float, float]
    spot: tuple[float, float] | None = None

    def __post_init__(self):
        for name in ("on_demand", "spot"):
            value = getattr(self, name)
            if value is None and name == "spot":
                continue
            if not (len(value) == 2 and all(math.isfinite(v) and v > 0 for v in value) and value[0] <= value[1]):
                raise ValueError(f"{name}={value!r} is invalid for {self.device}: allowed (low, high) dollars per "
                                 "hour with 0 < low <= high")


@dataclasses.dataclass(frozen=True)
class PriceTable:
    """Prices per device kind, with where they come from (``source``) and when they were read (``date``)."""

    prices: dict
    source: str
    date: str
    gpu_note: str = "GPU prices are the GPUs alone; their host VM is billed on top"

    def price(self, device: str | None) -> DevicePrice | None:
        """The price of ``device`` (case-insensitive), None if the table has none."""
        if not device:
            return None
        return {name.lower(): price for name, price in self.prices.items()}.get(device.lower())

    def describe(self) -> str:
        return f"{self.source}, {self.date}"


def _range(text: str) -> tuple[float, float]:
    low, sep, high = text.strip().partition("-")
    values = (float(low), float(high) if sep else float(low))
    if not all(math.isfinite(v) and v > 0 for v in values) or values[0] > values[1]:
        raise ValueError("not a positive number or LOW-HIGH range")
    return values


def parse_price_csv(text: str, source: str, date: str) -> PriceTable:
    """A table from the ``device,on_demand,spot`` format; ``PriceError`` naming ``source``, line and column."""
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    reader = csv.DictReader(io.StringIO("\n".join(lines)))
    missing = [name for name in ("device", "on_demand") if name not in (reader.fieldnames or [])]
    if missing:
        raise PriceError(f"{source}: missing column {', '.join(missing)}; expected a header line "
                         "'device,on_demand,spot' (US dollars per device-hour) or a SkyPilot vms.csv")
    prices = {}
    for number, row in enumerate(reader, start=2):
        device = (row.get("device") or "").strip()
        if not device:
            raise PriceError(f"{source}: data line {number}: column device is empty")
        values = {}
        for column in ("on_demand", "spot"):
            cell = (row.get(column) or "").strip()
            if not cell and column == "spot":
                values[column] = None
                continue
            try:
                values[column] = _range(cell)
            except ValueError:
                raise PriceError(f"{source}: data line {number}: column {column}: {cell!r} is not a positive "
                                 "number of dollars per device-hour or a LOW-HIGH range") from None
        prices[device] = DevicePrice(device, values["on_demand"], values["spot"])
    if not prices:
        raise PriceError(f"{source}: no prices (a header line and no devices)")
    return PriceTable(prices, source, date)


def _file_date(path: str) -> str:
    return datetime.datetime.fromtimestamp(os.path.getmtime(path)).date().isoformat()


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError) as error:
        raise PriceError(f"{path}: cannot be read: {error}") from None


def read_price_file(path: str) -> PriceTable:
    """The prices of a ``--prices`` file: the ``device,on_demand,spot`` format or a SkyPilot ``vms.csv``."""
    text = _read(path)
    header = next((line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")), "")
    if "AcceleratorName" in header:
        return read_skypilot_catalog(path, text)
    return parse_price_csv(text, f"--prices {path}", f"modified {_file_date(path)}")


def find_skypilot_catalog(home: str | None = None) -> str | None:
    """SkyPilot's downloaded GCP catalog under ``home`` (default ``~``): the newest schema version, or None."""
    home = home if home is not None else os.path.expanduser("~")

    def version(path: str) -> int:
        match = re.search(r"[/\\]v(\d+)[/\\]gcp[/\\]vms\.csv$", path)
        return int(match.group(1)) if match else -1

    found = [path for path in glob.glob(os.path.join(home, CATALOG_GLOB)) if version(path) >= 0]
    return max(found, key=version) if found else None


def _device_and_count(name: str, count: float) -> tuple[str, float] | None:
    """("v5e", 8) for ``tpu-v5litepod-8``; ("H100", 8) for an H100 row of 8 GPUs; None for others."""
    if name.startswith("tpu-"):
        parts = name.split("-")
        if len(parts) != 3 or parts[1] not in TPU_NAMES or not parts[2].isdigit():
            return None
        generation, cores_per_chip = TPU_NAMES[parts[1]]
        return generation, int(parts[2]) / cores_per_chip
    return (name, count) if count and count > 0 else None


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value > 0 else None


def read_skypilot_catalog(path: str, text: str | None = None, region_prefix: str = US_REGION_PREFIX) -> PriceTable:
    """Per-device prices from a SkyPilot ``vms.csv`` (columns ``CATALOG_COLUMNS``), ranges over the regions
    starting with ``region_prefix`` (all regions for a device offered in none of them)."""
    text = _read(path) if text is None else text
    reader = csv.DictReader(io.StringIO(text))
    missing = [name for name in CATALOG_COLUMNS if name not in (reader.fieldnames or [])]
    if missing:
        raise PriceError(f"{path}: not a SkyPilot catalog: missing column {', '.join(missing)}")
    found: dict[str, dict[bool, dict[str, list[float]]]] = {}  # device -> in region? -> column -> prices
    for number, row in enumerate(reader, start=2):
        name = (row["AcceleratorName"] or "").strip()
        if (row["InstanceType"] or "").strip() or not name:
            continue  # a VM type, not an accelerator
        try:
            count = float(row["AcceleratorCount"] or "nan")
        except ValueError:
            raise PriceError(f"{path}: line {number}: column AcceleratorCount: {row['AcceleratorCount']!r} is "
                             "not a number") from None
        device = _device_and_count(name, count)
        if device is None:
            continue
        in_region = (row["Region"] or "").startswith(region_prefix)
        for column in ("Price", "SpotPrice"):
            price = _number(row[column])
            if price is None or (device[0] == "v6e" and price == SKYPILOT_MISSING_V6E_PRICE):
                continue
            found.setdefault(device[0], {}).setdefault(in_region, {}).setdefault(column, []).append(
                price / device[1])
    prices = {}
    for device, by_region in found.items():
        columns = by_region.get(True) or by_region[False]
        if "Price" not in columns:
            continue
        spot = columns.get("SpotPrice")
        prices[device] = DevicePrice(device, (min(columns["Price"]), max(columns["Price"])),
                                     (min(spot), max(spot)) if spot else None)
    if not prices:
        raise PriceError(f"{path}: a SkyPilot catalog without accelerator prices (no AcceleratorName rows "
                         "with a Price)")
    return PriceTable(prices, f"SkyPilot catalog {path} ({region_prefix}* regions)", f"modified {_file_date(path)}")


def shipped_table() -> PriceTable:
    """The project's own table (``sweeps.preflight.price_table``), with its source and the date it was read."""
    return parse_price_csv(price_table.TABLE, price_table.SOURCE, f"read {price_table.READ_ON}")


def load_prices(prices_file: str | None = None, home: str | None = None) -> PriceTable:
    """The prices to use: ``prices_file`` (``--prices``), else SkyPilot's catalog under ``home``, else the
    shipped table. A bad ``--prices`` file raises ``PriceError``; an unreadable SkyPilot catalog is passed
    over for the shipped table (it is SkyPilot's, not the user's input), with the reason in ``source``."""
    if prices_file:
        return read_price_file(prices_file)
    catalog = find_skypilot_catalog(home)
    if catalog:
        try:
            return read_skypilot_catalog(catalog)
        except PriceError as error:
            table = shipped_table()
            return dataclasses.replace(table, source=f"{table.source} (SkyPilot's catalog unusable: {error})")
    return shipped_table()


def cost(table: PriceTable, device: str | None, device_hours) -> dict | None:
    """Dollars for ``device_hours`` (a number or a (low, high) range) of ``device``; None without a price.

    Returns {"device", "device_hours": [low, high], "usd_on_demand": [low, high], "usd_spot": [low, high]
    or None, "price_on_demand", "price_spot" (dollars per device-hour), "price_source"}.
    """
    price = table.price(device)
    if price is None or device_hours is None:
        return None
    hours = (device_hours, device_hours) if isinstance(device_hours, (int, float)) else tuple(device_hours)
    if any(value is None for value in hours):
        return None

    def dollars(rate):
        return None if rate is None else [hours[0] * rate[0], hours[1] * rate[1]]

    return {"device": price.device, "device_hours": list(hours), "usd_on_demand": dollars(price.on_demand),
            "usd_spot": dollars(price.spot), "price_on_demand": list(price.on_demand),
            "price_spot": list(price.spot) if price.spot else None, "price_source": table.describe()}


def _span(values, form: str) -> str:
    low, high = values
    return f"{low:{form}}" if math.isclose(low, high, rel_tol=5e-3) else f"{low:{form}}–{high:{form}}"


def _money(values) -> str:
    return _span(values, ",.0f" if max(values) >= 100 else ",.2f")


def cost_line(priced: dict | None, device: str | None, table: PriceTable) -> str:
    """One line: dollars on demand and spot with the per-hour prices, or why there are none."""
    if priced is None and table.price(device) is not None:
        return f"price: unknown, as the hours are; prices: {table.describe()}"
    if priced is None:
        known = ", ".join(table.prices)
        if not device:
            return f"price: no device named (--device KIND prices it, e.g. --device v5e; known: {known})"
        return f"price: no price for {device!r} in {table.describe()} (it prices {known}; --prices FILE for your own)"
    unit = "chip" if is_tpu(priced["device"]) else "GPU"
    spot = (f"${_money(priced['usd_spot'])} spot (${_span(priced['price_spot'], '.3f')}/{unit}-hour)"
            if priced["usd_spot"] else "no spot price")
    note = f"; {table.gpu_note}" if unit == "GPU" else ""
    return (f"price: ${_money(priced['usd_on_demand'])} on demand (${_span(priced['price_on_demand'], '.2f')}"
            f"/{unit}-hour of {priced['device']}), {spot}; prices: {table.describe()}{note}")


def is_tpu(device: str) -> bool:
    """Whether ``device`` names a TPU generation (priced per chip) rather than a GPU."""
    return device in {generation for generation, _ in TPU_NAMES.values()}


def device_for_peak(peak_flops: float | None) -> str | None:
    """The first device kind whose peak FLOP/s (``PEAK_FLOPS``) is ``peak_flops``, None if none is (or if
    ``peak_flops`` is None: the trainer then looks its peak up from the device it runs on)."""
    if peak_flops is None:
        return None
    return next((name for name, peak in PEAK_FLOPS.items() if math.isclose(peak, peak_flops, rel_tol=1e-3)), None)
