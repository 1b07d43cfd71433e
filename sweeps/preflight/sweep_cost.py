"""``dry-run``'s time and price of the runs it would train.

The time comes from the best figures at hand, in this order:
1. the speed the sweep's finished runs reached in wall time (measured, compiling and evaluation included);
2. the preflight's estimated seconds per step of each run (``sweeps.preflight.estimate_store``), for the runs it
   estimated: step time × steps × the chips of the mesh it compiled for (training steps only);
3. for the other runs, a utilisation of the device's own peak: the sweep's ``expected_mfu`` range, else
   ``GUESSED_UTILISATION``, a guess. The device is ``--device`` (its peak from ``sweeps.preflight.prices.PEAK_FLOPS``),
   else the TPU generation the preflight compiled for, else the device whose peak the sweep's
   ``peak_flops`` is; its peak is that device's, or ``peak_flops`` when no device is known.

The device-hours are priced on demand and spot with ``sweeps.preflight.prices`` (``--prices FILE``, SkyPilot's
catalog, or the shipped table).
"""

from __future__ import annotations

import dataclasses

from scaling import hardware
from sweeps.preflight import estimate_store, prices

# Assumed utilisation when nothing better is known: no finished run, no preflight, no expected_mfu.
GUESSED_UTILISATION = 0.3


@dataclasses.dataclass(frozen=True)
class Plan:
    """Device-hours of the runs to train, as (fast end, slow end), how they were found, and their price."""

    device_hours: tuple[float, float]
    how: str
    device: str | None
    preflight_runs: int
    cost: dict | None
    price_line: str

    @property
    def is_range(self) -> bool:
        return self.device_hours[0] != self.device_hours[1]

    def duration(self) -> str:
        """"3.2 device-hours", or a range in device-minutes."""
        fast, slow = self.device_hours
        return f"{slow:.3g} device-hours" if not self.is_range else f"{fast * 60:.0f}–{slow * 60:.0f} device-minutes"


def canonical_device(name: str | None) -> str | None:
    """``--device``'s spelling of a known device kind (case-insensitive); ValueError naming the allowed ones."""
    if name is None:
        return None
    for known in prices.PEAK_FLOPS:
        if known.lower() == name.strip().lower():
            return known
    raise ValueError(f"--device {name!r}: unknown device; allowed {', '.join(prices.PEAK_FLOPS)}")


def plan(todo, sweep, measured_speed: float | None, estimates: dict, device: str | None,
         table: prices.PriceTable) -> Plan:
    """The ``Plan`` of training ``todo`` (``RunSpec``s) of ``sweep``.

    ``measured_speed``: FLOP/s the finished runs reached (None if none finished); ``estimates``: run id ->
    kept preflight estimate; ``device``: ``--device`` (canonical) or None to infer it.
    """
    estimated = [run for run in todo if run.run_id in estimates]
    if device is None and estimated:
        device = estimate_store.device_of(estimates[estimated[0].run_id]) or None
    if device is None:
        device = prices.device_for_peak(sweep.base.peak_flops)
    peak = prices.PEAK_FLOPS.get(device, hardware.nominal_peak_flops(sweep.base.peak_flops))
    peak_text = f"peak_flops={peak:.3g} FLOP/s" + (f" ({device})" if device else "")
    flops = sum(run.flops for run in todo)
    if measured_speed:
        hours = flops / measured_speed / 3600
        how = "the speed this sweep's finished runs reached in wall time (compiling and evaluation included)"
        return _priced((hours, hours), how, device, 0, table)
    from_preflight = sum(estimates[run.run_id]["estimated_step_seconds"] * run.config.steps
                         * (estimates[run.run_id].get("chips") or 1) for run in estimated) / 3600
    rest = sum(run.flops for run in todo if run.run_id not in estimates)
    if sweep.expected_mfu:
        low, high = sweep.expected_mfu
        fast, slow = rest / (high * peak) / 3600, rest / (low * peak) / 3600
        guess = f"{high:.0%}–{low:.0%} model FLOP utilisation of {peak_text} (the sweep's expected_mfu)"
    else:
        fast = slow = rest / (GUESSED_UTILISATION * peak) / 3600
        guess = f"{GUESSED_UTILISATION:.0%} of {peak_text}, a guess"
    if estimated:
        entry = estimates[estimated[0].run_id]
        source = (f"the preflight's estimated step times (sweeps/preflight/estimate_store.py; "
                  f"{entry.get('slice')}, {str(entry.get('written', ''))[:10]})")
        how = source if len(estimated) == len(todo) else (
            f"{source} for {len(estimated)} of {len(todo)} runs, the others at {guess}")
        how += "; training steps only: compilation and evaluation add to this"
    else:
        how = f"{guess}; compilation and evaluation add to this"
    return _priced((from_preflight + fast, from_preflight + slow), how, device, len(estimated), table)


def _priced(hours: tuple[float, float], how: str, device, preflight_runs: int, table) -> Plan:
    cost = prices.cost(table, device, hours)
    return Plan(hours, how, device, preflight_runs, cost, prices.cost_line(cost, device, table))
