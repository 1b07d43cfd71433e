"""Two preflight reports of one sweep side by side: each run's step-time range and the sweep's cost.

    python benchmarks/preflight_compare.py benchmarks/paper_preflight/before.txt benchmarks/paper_preflight/after.txt

Each file is what ``python -m sweeps.launch preflight SWEEP --topology T`` printed (its table, not
``--json``). For every run of seed 0 found in both, the two ends of its step-time range (the corrected
roofline and the compiler's estimate, in ms) before and after, their ratio at the slow end, and a mark
where either end got slower; then each report's closing lines (chip-hours, MFU, price). Exit status 0.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

_RANGE = re.compile(r"^(L\d+-d\d+-s0)\s.*?\s(\d[\d.e-]*)\.\.(\d[\d.e-]*)\s")
_SUMMARY = ("sweep on", "range of the two estimates", "price:", "programs (")


def step_ranges(text: str) -> dict[str, tuple[float, float]]:
    """{run name: (low, high) step seconds} for the seed-0 rows of a preflight table."""
    found = {}
    for line in text.splitlines():
        match = _RANGE.match(line)
        if match:
            found[match.group(1)] = (float(match.group(2)), float(match.group(3)))
    return found


def summary(text: str) -> list[str]:
    """The report's closing lines: runs and chip-hours, the two estimates' range, the price, the programs."""
    return [line for line in text.splitlines() if line.startswith(_SUMMARY)]


def compare(before: str, after: str) -> str:
    """A markdown table of every run in both reports, and both reports' summaries."""
    old, new = step_ranges(before), step_ranges(after)
    lines = ["| run | before: ms | after: ms | slow end before/after | |", "|---|---:|---:|---:|---|"]
    for name in (n for n in old if n in new):
        (lo0, hi0), (lo1, hi1) = old[name], new[name]
        slower = "slower" if lo1 > lo0 * 1.0005 or hi1 > hi0 * 1.0005 else ""
        lines.append(f"| {name} | {lo0 * 1e3:,.1f}..{hi0 * 1e3:,.1f} | {lo1 * 1e3:,.1f}..{hi1 * 1e3:,.1f} "
                     f"| {hi0 / hi1:.2f}× | {slower} |")
    for label, text in (("before", before), ("after", after)):
        lines += ["", f"{label}:", *(f"    {line}" for line in summary(text))]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path, help="the earlier preflight's printed report")
    parser.add_argument("after", type=Path, help="the later one")
    args = parser.parse_args(argv)
    for path in (args.before, args.after):
        if not path.is_file():
            print(f"error: {path} is not a file", file=sys.stderr)
            return 2
    print(compare(args.before.read_text(), args.after.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
