"""The second transfer experiment: its staged sweep file and its analysis (``python -m analysis hp-transfer2``)."""

import dataclasses
import json
import math
import runpy

import numpy as np
import pytest

from analysis import __main__ as analysis_cli
from analysis import hp_transfer2 as design
from analysis.errors import AnalysisInputError
from helpers import REPO
from sweeps import spec

SWEEP_FILE = REPO / "sweeps" / "configs" / "hp_transfer2.py"


def _sweep(decisions_path):
    """The sweep file's sweep, reading its decisions from ``decisions_path`` instead of results/."""
    sweep = runpy.run_path(str(SWEEP_FILE))["sweep"]
    sweep.__globals__["DECISIONS"] = decisions_path
    return sweep()


def test_without_decisions_the_sweep_is_stage_one_the_base_tuning(tmp_path):
    runs = _sweep(tmp_path / "absent.json").expand().runs
    assert len(runs) == len({run.run_id for run in runs}) == 4 * 2 * 5 * 3
    assert {(run.depth, run.width) for run in runs} == {(2, 64)}
    settings = {(run.config.optim.output_multiplier, run.config.optim.zero_init_readout) for run in runs}
    assert settings == {(m, z) for m in (0.5, 1.0, 2.0, 4.0) for z in (False, True)}
    assert sorted({run.config.optim.peak_lr for run in runs}) == [5e-3, 7.07e-3, 1e-2, 1.41e-2, 2e-2]
    optim = runs[0].config.optim
    assert (optim.eps, optim.eps_rule, optim.mup_weight_decay, optim.mup_out_init) == (1e-12, "blocks", "width", "base")
    assert runs[0].config.model.heads == 2 and runs[0].name.startswith("base-m")


def test_decisions_expand_stage_two_centred_where_each_optimum_is_expected(tmp_path):
    decisions = tmp_path / "decisions.json"
    decisions.write_text(json.dumps({"base": {"tag": "base-m2-zero", "output_multiplier": 2.0,
                                              "zero_init_readout": True, "base_index": 1, "base_rate": 1.41e-2},
                                     "extensions": [{"parametrization": "standard", "axis": "width", "size": 512,
                                                     "indices": [-8, -9]}]}))
    sweep = _sweep(decisions)
    runs = [run for run in sweep.expand().runs if not run.name.startswith("base-")]
    assert len(runs) == 180 + 6
    rates = lambda tag: sorted({r.config.optim.peak_lr for r in runs if r.name.startswith(tag + "-L")})  # noqa: E731
    assert rates("mup-w512") == [design.lattice_rate(k) for k in (-1, 0, 1, 2, 3)]
    assert rates("standard-w512") == [design.lattice_rate(k) for k in (-7, -6, -5, -4, -3)]  # 1 - 2·3 = -5
    assert rates("standard-L16") == [design.lattice_rate(k) for k in (-4, -3, -2, -1, 0)]  # 1 - 3 = -2
    assert rates("standard-w512-x") == [design.lattice_rate(-9), design.lattice_rate(-8)]
    deep = next(r for r in runs if r.name.startswith("completep-L16"))
    assert (deep.depth, deep.width, deep.config.optim.parametrization) == (16, 64, "completep")
    assert (deep.config.optim.output_multiplier, deep.config.optim.zero_init_readout) == (2.0, True)
    assert sweep.pack == 15


def test_a_variant_restricted_to_a_shape_outside_the_grid_is_refused():
    base = spec.load_sweep(REPO / "sweeps" / "configs" / "hp_transfer.py").base
    with pytest.raises(ValueError, match="not in the sweep's grid"):
        spec.Sweep(name="x", base=base, depths=(2,), widths={2: (64,)},
                   variants=(spec.Variant("a", shapes=((2, 128),)),))


# ---------------------------------------------------------------- planted records
def _write(root, tag, parametrization, depth, width, seed, lr, loss):
    name = f"{tag}-L{depth}-d{width}-s{seed}-lr{spec.lr_tag(lr)}"
    run = root / "hp_transfer2" / name
    run.mkdir(parents=True)
    rule = "constant" if parametrization == "standard" else f"parametrization={parametrization}"
    record = {"status": "finished", "name": name, "run_id": name, "sweep": "hp_transfer2", "depth": depth,
              "width": width, "params_non_embedding": 12 * depth * width ** 2, "schema_version": 2,
              "point_id": name.replace(f"-s{seed}", ""), "lr_rule": rule, "peak_lr": lr, "planned_steps": 10,
              "seed": seed, "final_eval_loss": loss, "tokens": 1000, "steps": 10, "wall_seconds": 1.0,
              "data_fingerprint": "fp"}
    (run / "result.json").write_text(json.dumps(record))


def _loss(lr, best, seed, offset=0.0):
    """A parabola in log2(rate) with its vertex at ``best``, plus a small seed-dependent wobble."""
    return 2.0 + offset + 0.05 * (math.log2(lr) - math.log2(best)) ** 2 + 0.002 * ((seed * 7919) % 5 - 2)


# Planted drifts of the optimum, log2-rate per doubling of the size (each keeps the deepest or widest shape's
# optimum inside its pre-registered grid).
PLANTED = {("standard", "width"): -1.0, ("mup", "width"): 0.0, ("standard", "depth"): -0.5, ("completep", "depth"): 0.0}


def _plant(root, stage2=True, drifts=None):
    """Stage 1: base-m2-zero is best (the others 0.05 nats worse), its optimum at 1e-2. Stage 2: each
    (parametrization, axis)'s optimum moves by ``drifts`` (default ``PLANTED``) per doubling."""
    drifts = {**PLANTED, **(drifts or {})}
    for multiplier in design.BASE_MULTIPLIERS:
        for init in design.READOUT_INITS:
            offset = 0.0 if (multiplier, init) == (2.0, "zero") else 0.05
            for k in design.BASE_STEPS:
                for seed in design.SEEDS:
                    lr = design.lattice_rate(k)
                    _write(root, design.base_tag(multiplier, init), "mup", 2, 64, seed, lr,
                           _loss(lr, 1e-2, seed, offset))
    if not stage2:
        return
    for axis, names in design.COMPARED.items():
        for name in names:
            for size in (design.WIDTHS if axis == "width" else design.DEPTHS)[1:]:
                doublings = math.log2(size / (64 if axis == "width" else 2))
                best = 1e-2 * 2 ** (drifts[name, axis] * doublings)
                depth, width = (2, size) if axis == "width" else (size, 64)
                for k in design.stage2_indices(0, name, axis, size):
                    for seed in design.SEEDS:
                        lr = design.lattice_rate(k)
                        _write(root, design.shape_tag(name, axis, size), name, depth, width, seed, lr,
                               _loss(lr, best, seed))


def test_stage_one_alone_gives_the_base_choice_and_incomplete_verdicts(tmp_path):
    _plant(tmp_path, stage2=False)
    decided = design.decisions(tmp_path / "hp_transfer2")
    assert decided["base"] == {"tag": "base-m2-zero", "output_multiplier": 2.0, "zero_init_readout": True,
                               "base_index": 0, "base_rate": 1e-2}
    assert decided["extensions"] is None
    result = design.outcome(tmp_path / "hp_transfer2")
    assert {axis: v["verdict"] for axis, v in result["criterion"].items()} == {"width": "incomplete",
                                                                               "depth": "incomplete"}
    assert "waiting" in design.markdown(result)


def test_planted_optima_give_the_planted_verdicts_and_intervals_around_them(tmp_path):
    _plant(tmp_path, drifts={("completep", "depth"): -0.35})
    result = design.outcome(tmp_path / "hp_transfer2")
    verdicts = result["criterion"]
    assert verdicts["width"]["verdict"] == "holds"
    assert verdicts["depth"]["verdict"] == "fails"  # CompleteP's optimum planted to move by -0.35 per doubling
    assert verdicts["depth"]["completep_drift"] == pytest.approx(-0.35, abs=0.05)
    assert verdicts["width"]["mup_interval"][0] <= 0.0 <= verdicts["width"]["mup_interval"][1]
    assert verdicts["width"]["standard_drift"] == pytest.approx(-1.0, abs=0.05)
    wide = next(row for row in result["shapes"] if (row["parametrization"], row["size"]) == ("standard", 512))
    assert wide["best_rate"] == pytest.approx(1e-2 / 8, rel=0.05)
    assert wide["interval"][0] < wide["best_rate"] < wide["interval"][1]
    assert design.decisions(tmp_path / "hp_transfer2")["extensions"] == []


def test_a_standard_curve_that_also_stays_put_makes_the_axis_fail(tmp_path):
    """Both drifts within the tolerance: nothing for CompleteP to improve on."""
    _plant(tmp_path, drifts={("standard", "depth"): -0.1})
    assert design.outcome(tmp_path / "hp_transfer2")["criterion"]["depth"]["verdict"] == "fails"


def test_an_optimum_beyond_the_grid_is_unresolved_and_gets_the_extension(tmp_path):
    _plant(tmp_path)
    for path in (tmp_path / "hp_transfer2").glob("mup-w512-*"):
        record = json.loads((path / "result.json").read_text())
        record["final_eval_loss"] = _loss(record["peak_lr"], 1e-2 * 2 ** 2.5, record["seed"])  # 5 steps up
        (path / "result.json").write_text(json.dumps(record))
    result = design.outcome(tmp_path / "hp_transfer2")
    assert result["criterion"]["width"]["verdict"] == "inconclusive"
    assert design.decisions(tmp_path / "hp_transfer2")["extensions"] == [
        {"parametrization": "mup", "axis": "width", "size": 512, "indices": [3, 4]}]


def test_the_descriptive_drift_uses_only_the_located_shapes_and_never_a_verdict(tmp_path):
    _plant(tmp_path, drifts={("standard", "depth"): -0.5})
    for pattern in ("mup-w512-*", "mup-w256-*"):  # both optima moved 5 lattice steps above their grids
        for path in (tmp_path / "hp_transfer2").glob(pattern):
            record = json.loads((path / "result.json").read_text())
            record["final_eval_loss"] = _loss(record["peak_lr"], 1e-2 * 2 ** 2.5, record["seed"])
            (path / "result.json").write_text(json.dumps(record))
    result = design.outcome(tmp_path / "hp_transfer2")
    located = {(row["parametrization"], row["axis"]): row for row in result["located_drifts"]}
    assert located["mup", "width"]["sizes"] == [64, 128]
    assert located["mup", "width"]["drift"] == pytest.approx(0.0, abs=0.05)
    assert located["standard", "depth"]["sizes"] == [2, 4, 8, 16]
    assert located["standard", "depth"]["drift"] == pytest.approx(-0.5, abs=0.05)
    low, high = located["standard", "depth"]["interval"]
    assert low < located["standard", "depth"]["drift"] < high
    registered = {(row["parametrization"], row["axis"]): row for row in result["drifts"]}
    assert ("mup", "width") not in registered and registered["standard", "depth"]["drift"] == pytest.approx(
        located["standard", "depth"]["drift"])  # all four located: the same slope as the registered one
    assert result["criterion"]["width"]["verdict"] == "inconclusive"
    text = design.markdown(result)
    assert "Descriptive, not part of the criterion" in text and "| mup | width | 64, 128 |" in text
    fits = {("mup", "width", size): None for size in design.WIDTHS}
    assert design.located_drift(fits, "mup", "width") is None  # fewer than 2 located shapes: nothing to draw


def test_the_vertex_and_its_bootstrap_are_those_of_a_least_squares_parabola():
    x = np.log2([1e-3, 2e-3, 4e-3, 8e-3])
    vertex, lowest = design._vertices(x, 1.0 + (x - np.log2(3e-3)) ** 2)
    assert 2 ** vertex[0] == pytest.approx(3e-3) and lowest[0] == pytest.approx(1.0)
    assert np.isnan(design._vertices(x, -(x ** 2))[0][0])  # opens downward: no optimum


def test_the_command_prints_tables_json_decisions_and_draws_the_figure(tmp_path, capsys):
    _plant(tmp_path)
    folder = str(tmp_path / "hp_transfer2")
    assert analysis_cli.main(["hp-transfer2", folder, "--figure", str(tmp_path / "f.png")]) == 0
    assert "criterion along width: holds" in capsys.readouterr().out
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert analysis_cli.main(["hp-transfer2", folder, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["criterion"]["width"]["verdict"] == "holds"
    assert analysis_cli.main(["hp-transfer2", folder, "--decisions"]) == 0
    assert json.loads(capsys.readouterr().out)["base"]["tag"] == "base-m2-zero"


@pytest.mark.parametrize("slope,indices", [(-0.02, [-3, -4]), (0.02, [3, 4])])
def test_a_curve_opening_downward_is_extended_beyond_its_lower_loss_end(tmp_path, slope, indices):
    """No vertex to go by: the README's rule takes the end with the lower mean loss. A concave curve tilted
    so that its low-rate end is lower (``slope`` < 0) extends below the grid, the other way above it."""
    _plant(tmp_path)
    for path in (tmp_path / "hp_transfer2").glob("mup-w256-*"):
        record = json.loads((path / "result.json").read_text())
        x = math.log2(record["peak_lr"] / 1e-2)
        record["final_eval_loss"] = 2.0 - slope * x - 0.01 * x ** 2 + 0.001 * record["seed"]
        (path / "result.json").write_text(json.dumps(record))
    assert design.decisions(tmp_path / "hp_transfer2")["extensions"] == [
        {"parametrization": "mup", "axis": "width", "size": 256, "indices": indices}]


def test_a_noisy_curve_with_its_vertex_inside_is_extended_beyond_the_end_nearer_the_vertex(tmp_path):
    """Vertex inside the grid's upper half, but seed noise turns over a quarter of the resamples downward
    (unresolved): the extension goes above the grid, the end nearer the vertex."""
    _plant(tmp_path)
    noise = {0: 0.03, 1: -0.03, 2: 0.0}
    for path in (tmp_path / "hp_transfer2").glob("mup-w256-*"):
        record = json.loads((path / "result.json").read_text())
        k = design.lattice_index(record["peak_lr"])
        record["final_eval_loss"] = 2.0 + 0.01 * (k / 2 - 0.6) ** 2 + noise[(record["seed"] + k) % 3]
        (path / "result.json").write_text(json.dumps(record))
    wide = next(row for row in design.outcome(tmp_path / "hp_transfer2")["shapes"]
                if (row["parametrization"], row["size"]) == ("mup", 256))
    assert wide["status"] == "unresolved" and wide["downward_resamples"] > 0.05
    assert design.decisions(tmp_path / "hp_transfer2")["extensions"] == [
        {"parametrization": "mup", "axis": "width", "size": 256, "indices": [3, 4]}]


def test_the_exploratory_base_extension_joins_the_base_fit_and_leaves_the_registered_outcome_alone(
        tmp_path, capsys):
    """The chosen base setting's optimum planted a factor 2^1.75 below 1e-2, beyond its grid:
    unresolved, so both registered verdicts are inconclusive. Its extension's two lower rates, in a sweep of their
    own, locate it; only then do the exploratory verdicts read the drifts."""
    _plant(tmp_path)
    best = 1e-2 * 2 ** -1.75
    for path in (tmp_path / "hp_transfer2").glob("base-m2-zero-*"):
        record = json.loads((path / "result.json").read_text())
        record["final_eval_loss"] = _loss(record["peak_lr"], best, record["seed"])
        (path / "result.json").write_text(json.dumps(record))
    registered = design.outcome(tmp_path / "hp_transfer2")
    assert {v["verdict"] for v in registered["criterion"].values()} == {"inconclusive"}
    assert "mup 64" in registered["criterion"]["width"]["why"]
    extension = tmp_path / "extension"
    for k in (-3, -4):
        for seed in design.SEEDS[:2]:
            lr = design.lattice_rate(k)
            _write(extension, "base-m2-zero-x", "mup", 2, 64, seed, lr, _loss(lr, best, seed))
    waiting = design.outcome(tmp_path / "hp_transfer2", [extension / "hp_transfer2"])
    assert waiting["criterion"]["width"]["verdict"] == "incomplete"  # a seed of each rate still missing
    for k in (-3, -4):
        lr = design.lattice_rate(k)
        _write(extension, "base-m2-zero-x", "mup", 2, 64, 2, lr, _loss(lr, best, 2))
    explored = design.outcome(tmp_path / "hp_transfer2", [extension / "hp_transfer2"])
    assert explored["exploratory"]["added_runs"] == 6
    assert explored["chosen"] == registered["chosen"] and explored["base"] == registered["base"]
    base_shape = next(row for row in explored["shapes"] if (row["parametrization"], row["size"]) == ("mup", 64))
    assert base_shape["status"] == "resolved" and base_shape["runs"] == 21
    assert base_shape["best_rate"] == pytest.approx(best, rel=0.05)
    # The base optimum sits 1.75 log2 below the planted μP shapes' (flat at 1e-2): μP's drift turns positive.
    assert explored["criterion"]["width"]["verdict"] != "inconclusive"
    assert explored["criterion"]["width"]["mup_drift"] > 0.25
    assert design.outcome(tmp_path / "hp_transfer2") == registered  # the registered reading is unchanged
    assert analysis_cli.main(["hp-transfer2", str(tmp_path / "hp_transfer2"), "--base-extension",
                              str(extension / "hp_transfer2"), "--figure", str(tmp_path / "x.png")]) == 0
    assert capsys.readouterr().out.startswith("EXPLORATORY, not the registered outcome")
    assert (tmp_path / "x.png").stat().st_size > 0
    with pytest.raises(AnalysisInputError, match="no finished run of a base extension"):
        design.outcome(tmp_path / "hp_transfer2", [tmp_path / "hp_transfer2"])  # a folder without its runs
    assert analysis_cli.main(["hp-transfer2", str(tmp_path / "hp_transfer2"), "--decisions", "--base-extension",
                              str(extension / "hp_transfer2")]) == 2
    assert "drop --base-extension" in capsys.readouterr().err


@pytest.mark.parametrize("sweep_file", ["hp_transfer2_base_extension.py", "hp_transfer2_base_followup.py"])
def test_the_base_extension_sweeps_extend_stage_ones_choice_downward_and_change_nothing_else(sweep_file):
    """On the committed stage-1 records: the chosen setting is the sweep's; the extension's rates are the
    ones the stage-3 rule gives its curve, the follow-up's the next 4 lattice rates below them (README,
    "Follow-up"); each run's config is a stage-1 run's but for the rate and names."""
    records = REPO / "results" / "hp_transfer2"
    chosen = design.decisions(records)["base"]
    extension = runpy.run_path(str(REPO / "sweeps" / "configs" / sweep_file))
    assert design.base_tag(*extension["CHOSEN"]) == chosen["tag"]
    frame = design.runs(records)
    points = frame[frame["tag"] == chosen["tag"]]
    assert not design.fit(points, chosen["tag"]).resolved  # why the extension exists
    first = design.extension_indices(design.fit(points, chosen["tag"]), points, list(design.BASE_STEPS))
    lowest = min(first)
    assert list(extension["INDICES"]) == (first if sweep_file == "hp_transfer2_base_extension.py"
                                          else [lowest - k for k in range(1, 5)])
    added, _ = spec.load_sweep(REPO / "sweeps" / "configs" / sweep_file).expand()
    stage1, _ = spec.load_sweep(SWEEP_FILE).expand()
    assert sorted(run.config.optim.peak_lr for run in added) == sorted(
        design.lattice_rate(k) for k in extension["INDICES"] for _ in design.SEEDS)
    for run in added:
        seed_name = run.name.replace(f"{chosen['tag']}-x-", chosen["tag"] + "-").rsplit("-lr", 1)[0]
        twin = next(other for other in stage1 if other.name == f"{seed_name}-lr{spec.lr_tag(chosen['base_rate'])}")
        at_base_rate = dataclasses.replace(run.config.optim, peak_lr=chosen["base_rate"])
        assert dataclasses.replace(run.config, optim=at_base_rate, name=twin.config.name,
                                   sweep_name=twin.config.sweep_name) == twin.config


def test_the_budget_counts_each_pack_once_by_stage(tmp_path):
    _plant(tmp_path)
    for path in (tmp_path / "hp_transfer2").glob("mup-w512-*"):  # one pack that took an hour, resumed or not
        record = json.loads((path / "result.json").read_text())
        (path / "result.json").write_text(json.dumps({**record, "wall_seconds": 3600.0}))
    _write(tmp_path, "mup-w512-x", "mup", 2, 512, 0, design.lattice_rate(5), 2.1)
    rows = {row["stage"]: row for row in design.budget(tmp_path / "hp_transfer2")}
    assert (rows[1]["packs"], rows[2]["packs"], rows[3]["packs"]) == (8, 12, 1)
    assert rows[1]["hours"] == pytest.approx(8 / 3600) and rows[3]["hours"] == pytest.approx(1 / 3600)
    assert rows[2]["hours"] == pytest.approx(1 + 11 / 3600)
    assert rows[2]["budgeted_hours"] == 6.45
    assert "| 2 | 12 | 1.00 | 6.45 |" in design.markdown(design.outcome(tmp_path / "hp_transfer2"))
