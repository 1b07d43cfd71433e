"""The committed results stay reproducible: each table in results/ is what its command prints today.

The commands are the ones the results' READMEs give, run from the repository
root on the committed run records, so a change in the analysis that would
alter a published number fails here first.

Numbers are compared at a stated relative tolerance, not byte for byte: a
full-precision float in a JSON report carries the last bits of one machine's
arithmetic (another CPU's matrix products sum in another order), while every
other character, and every number to its ninth significant digit, must match.
"""

import json
import math
import re

import pytest

import helpers
from helpers import REPO

# Relative tolerance for a computed number against its committed value: far above float64's
# last-digit noise (~1e-16 relative), far below any change a reader could see (the text reports
# print at most 6 significant digits, the JSON reports 16-17).
REL_TOL = 1e-9
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def _numbers_match(actual: float, expected: float) -> bool:
    return math.isclose(actual, expected, rel_tol=REL_TOL, abs_tol=1e-300)


def same_report(actual: str, expected: str) -> bool:
    """Whether two command outputs agree: the same text around their numbers, numbers within REL_TOL.

    JSON is compared as data (keys, order of lists, strings exactly; numbers within REL_TOL); any other
    text token by token, split at the numbers it contains.
    """
    try:
        return _same_json(json.loads(actual), json.loads(expected))
    except ValueError:
        pass
    actual_parts, expected_parts = NUMBER.split(actual), NUMBER.split(expected)
    actual_numbers, expected_numbers = NUMBER.findall(actual), NUMBER.findall(expected)
    return (actual_parts == expected_parts and len(actual_numbers) == len(expected_numbers)
            and all(_numbers_match(float(a), float(e)) for a, e in zip(actual_numbers, expected_numbers)))


def _same_json(actual, expected) -> bool:
    if isinstance(expected, bool) or expected is None or isinstance(expected, str):
        return type(actual) is type(expected) and actual == expected
    if isinstance(expected, (int, float)):
        return isinstance(actual, (int, float)) and not isinstance(actual, bool) and _numbers_match(actual, expected)
    if isinstance(expected, dict):
        return (isinstance(actual, dict) and list(actual) == list(expected)
                and all(_same_json(actual[key], expected[key]) for key in expected))
    if isinstance(expected, list):
        return (isinstance(actual, list) and len(actual) == len(expected)
                and all(_same_json(a, e) for a, e in zip(actual, expected)))
    raise TypeError(f"unexpected JSON value {expected!r}")


def analysis(*args: str) -> str:
    return helpers.run_module("analysis", *args, check=True).stdout


# Each committed report, and the analysis command (run on its folder) that printed it. The fit's bootstrap
# seed is fixed, so its whole output, intervals included, is deterministic up to the last bits of the
# arithmetic; the hp_transfer outcome holds the best rates, spreads and the pre-registered criterion's
# verdicts of results/hp_transfer/README.md.
REPORTS = [
    ("log_length", "table.csv", ("log-length", "--format", "csv")),
    ("log_length", "table.md", ("log-length",)),
    ("cpu_depth", "fit.txt", ("fit",)),
    ("cpu_depth", "fit.json", ("fit", "--json")),
    ("hp_transfer", "outcome.md", ("hp-transfer",)),
    ("hp_transfer", "outcome.json", ("hp-transfer", "--json")),
]


@pytest.mark.parametrize("folder, committed, command", REPORTS, ids=[f"{f}/{c}" for f, c, _ in REPORTS])
def test_a_committed_report_is_what_its_command_prints(folder, committed, command):
    expected = (REPO / "results" / folder / committed).read_text()
    printed = analysis(command[0], f"results/{folder}", *command[1:])
    assert same_report(printed, expected), (printed, expected)


def test_hp_transfer_sweep_is_complete_and_its_verdicts_are_the_readmes():
    outcome = json.loads((REPO / "results" / "hp_transfer" / "outcome.json").read_text())
    records = list((REPO / "results" / "hp_transfer").glob("*/result.json"))
    assert len(records) == 90 and all(json.loads(r.read_text())["status"] == "finished" for r in records)
    readme = (REPO / "results" / "hp_transfer" / "README.md").read_text()
    for axis, verdict in outcome["criterion"].items():
        assert f"**{axis}: {verdict['verdict']}**" in readme, (axis, verdict)


def _perturb_last_digits(text: str, relative: float) -> str:
    """Every float nudged by `relative` (JSON: its float values; text: numbers with a fraction)."""
    def nudge_json(value):
        if isinstance(value, float):
            return value * (1 + relative)
        if isinstance(value, dict):
            return {key: nudge_json(item) for key, item in value.items()}
        if isinstance(value, list):
            return [nudge_json(item) for item in value]
        return value

    try:
        return json.dumps(nudge_json(json.loads(text)), indent=2) + "\n"
    except ValueError:
        pass

    def nudge(match: re.Match) -> str:
        token = match.group(0)
        if not any(c in token for c in ".eE"):
            return token
        return repr(float(token) * (1 + relative))
    return NUMBER.sub(nudge, text)


@pytest.mark.parametrize("committed", ["fit.json", "fit.txt"])
def test_last_digit_noise_passes_and_a_changed_number_fails(committed):
    expected = (REPO / "results" / "cpu_depth" / committed).read_text()
    noisy = _perturb_last_digits(expected, 4e-16)
    assert noisy != expected or committed == "fit.txt"
    assert same_report(noisy, expected)
    # one reported number moved by one part in a million is a changed result
    first = next(m for m in NUMBER.finditer(expected) if "." in m.group(0) and float(m.group(0)) != 0)
    moved = expected[:first.start()] + repr(float(first.group(0)) * (1 + 1e-6)) + expected[first.end():]
    assert not same_report(moved, expected)
    # and so is a changed word
    assert not same_report(expected.replace("transition", "transitions", 1), expected)


def test_cpu_depth_main_sweep_is_complete():
    """Four depths, three sizes each, three seeds at every point: the design the README reports on."""
    from analysis.results import load_runs

    table = load_runs(REPO / "results" / "cpu_depth")
    seeds = table.runs.groupby(["depth", "width"])["seed"].nunique()
    assert sorted(table.runs["depth"].unique()) == [2, 3, 4, 6]
    assert seeds.groupby(level="depth").size().tolist() == [3, 3, 3, 3]
    assert seeds.min() >= 3, seeds[seeds < 3]
    assert not table.skipped and (table.unfinished is None or table.unfinished.empty)


# The second transfer experiment (results/hp_transfer2/README.md) is launched from main in stages; its
# records arrive over several sessions. Until the first one, there is nothing to re-derive.
HP_TRANSFER2 = REPO / "results" / "hp_transfer2"
HP_TRANSFER2_REPORTS = (("decisions.json", ("hp-transfer2", "--decisions")),
                        ("outcome.json", ("hp-transfer2", "--json")),
                        ("outcome.md", ("hp-transfer2",)))


def hp_transfer2_committed_reports() -> list[tuple[str, str, str]]:
    """(file, committed text, what its command prints now) for each of results/hp_transfer2's committed
    reports: the stage decisions the sweep file read, and the outcome once it is written. Empty while
    the folder holds no record."""
    if not any(HP_TRANSFER2.glob("*/result.json")):
        return []
    found = []
    for name, command in HP_TRANSFER2_REPORTS:
        if (HP_TRANSFER2 / name).is_file():
            found.append((name, (HP_TRANSFER2 / name).read_text(), analysis(command[0], "results/hp_transfer2",
                                                                           *command[1:])))
    return found


def test_hp_transfer2_reports_are_what_their_commands_print():
    reports = hp_transfer2_committed_reports()
    if not reports:
        pytest.skip("results/hp_transfer2 holds no finished record or report yet (its runs are launched from main)")
    for name, committed, printed in reports:
        assert same_report(printed, committed), name


def _rate_with_interval(best: float, low: float, high: float) -> str:
    """``2.03e-3 (0.382–2.83e-3)``: three significant digits, the interval in the best rate's power of ten."""
    power = math.floor(math.log10(best))
    mantissa = lambda value: f"{value / 10 ** power:#.3g}"  # noqa: E731
    return f"{mantissa(best)}e{power} ({mantissa(low)}–{mantissa(high)}e{power})"


def test_hp_transfer2_readme_outcome_is_the_committed_outcome():
    """results/hp_transfer2/README.md, "Outcome": its verdicts, best-rate table and descriptive drifts are
    those of outcome.json (which the test above holds to the command)."""
    outcome_path = HP_TRANSFER2 / "outcome.json"
    if not outcome_path.is_file():
        pytest.skip("results/hp_transfer2 has no outcome yet")
    outcome = json.loads(outcome_path.read_text())
    readme = (HP_TRANSFER2 / "README.md").read_text()
    verdicts = {axis: found["verdict"] for axis, found in outcome["criterion"].items()}
    assert f"**Registered verdicts: {verdicts['width']} along width, {verdicts['depth']} along depth.**" in readme
    shapes = {(row["parametrization"], row["axis"], row["size"]): row for row in outcome["shapes"]}
    for name, axis, label in (("mup", "width", "μP"), ("standard", "width", "standard"),
                              ("completep", "depth", "CompleteP"), ("standard", "depth", "standard")):
        sizes = (128, 256, 512) if axis == "width" else (4, 8, 16)
        cells = [_rate_with_interval(shapes[name, axis, size]["best_rate"], *shapes[name, axis, size]["interval"])
                 for size in sizes]
        row = (f"| {label}, {axis} {' / '.join(map(str, sizes))} | " + " | ".join(cells)
               + f" | {shapes[name, axis, sizes[-1]]['loss_at_best']:.3f} |")
        assert row in readme, row
    for found in outcome["located_drifts"]:
        low, high = found["interval"]
        text = f"**{found['drift']:+.2f} ({low:+.2f} to {high:+.2f})**".replace("-", "−")
        assert text in readme, text
    hours = {row["stage"]: row["hours"] for row in outcome["budget"]}
    assert f"{sum(hours.values()):.2f} wall-clock hours of the 10 stated" in readme
    assert all(f"stage {stage} {value:.2f} h" in readme for stage, value in hours.items())


def test_the_exploratory_base_extension_leaves_the_base_optimum_unlocated_as_its_readme_says():
    """results/hp_transfer2_base_extension/README.md: the 6 runs join the base shape's fit (21 runs) and its
    vertex stays far below every rate tried, so the exploratory verdicts cannot be drawn either."""
    from analysis import hp_transfer2

    extension = REPO / "results" / "hp_transfer2_base_extension"
    assert sorted(json.loads(path.read_text())["code_version"] for path in extension.glob("*/result.json")) == \
        ["82b90a954c24"] * 6
    result = hp_transfer2.outcome(HP_TRANSFER2, [extension])
    base_shape = next(row for row in result["shapes"] if (row["parametrization"], row["size"]) == ("mup", 64))
    assert base_shape["status"] == "unresolved" and base_shape["runs"] == 21
    assert base_shape["best_rate"] < 2.5e-3 / 10  # "ten times below the lowest rate tried"
    assert {axis: found["verdict"] for axis, found in result["criterion"].items()} == {
        "width": "inconclusive", "depth": "inconclusive"}  # stage 3 complete: no axis waits
    readme = (extension / "README.md").read_text()
    assert "still not located" in readme and f"vertex at {base_shape['best_rate']:.1e}".replace("e-0", "e-") in readme
    # The README's table: each new rate's seeds and mean, as the records have them.
    frame = hp_transfer2.runs(extension)
    for rate, label in ((2.5e-3, "2.5e-3"), (3.54e-3, "3.54e-3")):
        losses = frame[frame["peak_lr"] == rate].sort_values("seed")["loss"].tolist()
        row = f"| {label} (new) | " + " | ".join(f"{loss:.4f}" for loss in losses) + f" | {sum(losses) / 3:.4f} |"
        assert row in readme, row


def test_the_base_followup_locates_the_base_shape_and_its_readme_gives_the_exploratory_verdicts():
    """results/hp_transfer2_base_followup/README.md: with both extensions (33 runs at the base shape) the
    base optimum is located, and the README's vertex, verdicts, drifts and table are what the records give."""
    from analysis import hp_transfer2

    folders = [REPO / "results" / "hp_transfer2_base_extension", REPO / "results" / "hp_transfer2_base_followup"]
    assert sorted(json.loads(path.read_text())["code_version"] for path in folders[1].glob("*/result.json")) == \
        ["c9661139b8c7"] * 12
    result = hp_transfer2.outcome(HP_TRANSFER2, folders)
    base_shape = next(row for row in result["shapes"] if (row["parametrization"], row["size"]) == ("mup", 64))
    assert base_shape["status"] == "resolved" and base_shape["runs"] == 33
    readme = (folders[1] / "README.md").read_text()
    assert f"**{_rate_with_interval(base_shape['best_rate'], *base_shape['interval'])}**" in readme
    verdicts = result["criterion"]
    assert (f"**The follow-up's exploratory verdicts: {verdicts['width']['verdict']} along width, "
            f"{verdicts['depth']['verdict']} along depth.**") in readme
    signed = lambda value: f"{value:+.2f}".replace("-", "−")  # noqa: E731
    for axis, name, label in (("width", "mup", "μP"), ("depth", "completep", "CompleteP")):
        found = verdicts[axis]
        ours, theirs, gap = found[f"{name}_interval"], found["standard_interval"], found["gap_interval"]
        row = (f"| {label} {signed(found[f'{name}_drift'])} ({signed(ours[0])} to {signed(ours[1])}) | "
               f"{signed(found['standard_drift'])} ({signed(theirs[0])} to {signed(theirs[1])}) | "
               f"{signed(gap[0])} to {signed(gap[1])} |")
        assert row in readme, row
    frame = hp_transfer2.runs(folders[1])
    for rate in sorted(frame["peak_lr"].unique()):
        losses = frame[frame["peak_lr"] == rate].sort_values("seed")["loss"].tolist()
        label = f"{rate:.2e}".replace("e-0", "e-")
        row = f"| {label} (new) | " + " | ".join(f"{loss:.4f}" for loss in losses) + f" | {sum(losses) / 3:.4f} |"
        assert row in readme, row
