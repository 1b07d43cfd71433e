"""Sweeps as they really are: several learning rates, copied run directories, repeated rows, outdated records."""

import dataclasses
import json
import shutil

import numpy as np
import pandas as pd
import pytest

from analysis.__main__ import main
from analysis.errors import AnalysisInputError
from analysis.points import aggregate_seeds
from analysis.results import load_runs
from analysis.summary import Outcome, analyse, summarize
from analysis.synthetic import synthetic_runs
from scaling.store.records import RunRecord

BETTER, WORSE = 1e-3, 2e-3


def record(depth, width, seed, loss, lr=BETTER, steps=100, status="finished", fingerprint="fp", point=None):
    point = point or f"p-L{depth}-d{width}-lr{lr:g}-s{steps}"
    return RunRecord(run_id=f"{point}-seed{seed}", point_id=point, status=status, depth=int(depth), width=int(width),
                     seed=int(seed), params_non_embedding=12 * int(depth) * int(width) ** 2,
                     name=f"L{depth}-d{width}-s{seed}-lr{lr:g}", peak_lr=lr, lr_rule="constant",
                     planned_steps=steps, steps=steps, data_fingerprint=fingerprint,
                     final_eval_loss=None if status != "finished" else float(loss))


def write(root, rec: RunRecord):
    run = root / rec.run_id
    run.mkdir(parents=True)
    (run / "result.json").write_text(rec.to_json())
    return run


def better_rate(depth):
    """The rate that wins at this depth: the lower one for shallow nets, the higher one for deep nets."""
    return BETTER if depth <= 4 else WORSE


def write_sweep(root, both_rates=True, rng=7):
    runs = synthetic_runs(depths=(2, 4, 6, 8), a=3.0, b=0.25, seeds=3, noise=0.003, rng=rng)
    for row in runs.itertuples():
        good = better_rate(row.depth)
        write(root, record(row.depth, row.width, row.seed, row.loss, lr=good))
        if both_rates:
            bad = WORSE if good == BETTER else BETTER
            write(root, record(row.depth, row.width, row.seed, row.loss + 0.3, lr=bad))
    return runs


def test_worse_learning_rate_is_dropped_per_shape_and_named(tmp_path, capsys):
    write_sweep(tmp_path / "both")
    write_sweep(tmp_path / "better_only", both_rates=False)
    both = analyse(load_runs(tmp_path / "both"), n_bootstrap=200)
    alone = analyse(load_runs(tmp_path / "better_only"), n_bootstrap=200)
    assert both.outcome is Outcome.FITTED and alone.outcome is Outcome.FITTED
    for estimate in ("crossing", "paper"):
        fit_both, fit_alone = both.fit(estimate), alone.fit(estimate)
        assert (fit_both.a, fit_both.b) == pytest.approx((fit_alone.a, fit_alone.b), rel=1e-12)
        np.testing.assert_allclose(fit_both.cov, fit_alone.cov, rtol=1e-10)
    assert len(both.runs) == len(alone.runs)
    assert main(["fit", str(tmp_path / "both"), "--bootstrap", "50"]) == 0
    out = capsys.readouterr().out
    for choice in both.choices:
        line = f"L={choice.depth}, d={choice.width}: peak_lr {better_rate(choice.depth):.3g}"
        assert line in out
    assert main(["fit", str(tmp_path / "both"), "--bootstrap", "50", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {c["peak_lr"] for c in data["learning_rates"]} == {BETTER, WORSE}
    assert data["fits"]["crossing"] and data["fits"]["paper"]


def test_runs_at_two_rates_are_never_pooled_as_seeds(tmp_path):
    write_sweep(tmp_path)
    with pytest.raises(AnalysisInputError, match="several learning rates"):
        aggregate_seeds(load_runs(tmp_path).runs)


def test_copied_run_directory_does_not_change_the_seed_count(tmp_path):
    write_sweep(tmp_path, both_rates=False)
    before = analyse(load_runs(tmp_path), n_bootstrap=0)
    original = next(p for p in sorted(tmp_path.iterdir()) if "L2" in p.name)
    shutil.copytree(original, tmp_path / "zz-copy-of-a-run")
    table = load_runs(tmp_path)
    after = analyse(table, n_bootstrap=0)
    assert len(table.runs) == len(before.runs)
    assert table.skipped == {"duplicate run_id": 1}
    assert any("counted once" in note for note in table.notes)
    assert aggregate_seeds(after.runs)["n_seeds"].tolist() == aggregate_seeds(before.runs)["n_seeds"].tolist()


def test_repeated_csv_rows_are_collapsed_with_a_message(tmp_path):
    runs = synthetic_runs(depths=(2, 4), seeds=2, rng=1)
    path = tmp_path / "runs.csv"
    pd.concat([runs, runs.iloc[:3]]).to_csv(path, index=False)
    table = load_runs(path)
    assert len(table.runs) == len(runs)
    assert any("3 repeated identical row(s) counted once" in note for note in table.notes)
    clash = runs.iloc[:1].assign(loss=runs["loss"].iloc[0] + 0.1)
    pd.concat([runs, clash]).to_csv(path, index=False)
    with pytest.raises(AnalysisInputError, match="different losses"):
        load_runs(path)


def test_csv_with_two_rates_selects_per_shape(tmp_path):
    runs = synthetic_runs(depths=(2, 4, 6), seeds=3, noise=0.003, rng=2)
    worse = runs.assign(loss=runs["loss"] + 0.3, peak_lr=WORSE)
    path = tmp_path / "runs.csv"
    pd.concat([runs.assign(peak_lr=BETTER), worse]).to_csv(path, index=False)
    result = analyse(load_runs(path), n_bootstrap=0)
    assert {choice.peak_lr for choice in result.choices} == {BETTER}
    assert all(choice.others == {WORSE: pytest.approx(choice.loss_mean + 0.3, abs=0.01)} for choice in result.choices)


@pytest.mark.parametrize("value, match", [("-0.5", "negative loss"), ("inf", "NaN or infinite loss")])
def test_bad_losses_are_refused_with_file_and_line(tmp_path, value, match):
    path = tmp_path / "runs.csv"
    path.write_text(f"depth,width,params,seed,loss\n2,32,24576,0,3.0\n2,32,24576,1,{value}\n")
    with pytest.raises(AnalysisInputError, match=match) as error:
        load_runs(path)
    assert "runs.csv" in str(error.value) and "line 3" in str(error.value)


def test_negative_loss_in_a_record_is_refused_naming_the_file(tmp_path):
    run = write(tmp_path, record(2, 32, 0, 3.0))
    data = json.loads((run / "result.json").read_text())
    data["final_eval_loss"] = -1.0
    (run / "result.json").write_text(json.dumps(data))
    with pytest.raises(AnalysisInputError, match="final_eval_loss") as error:
        load_runs(tmp_path)
    assert str(run / "result.json") in str(error.value)


def test_different_step_counts_are_refused_unless_one_is_chosen(tmp_path):
    for seed in (0, 1):
        write(tmp_path, record(2, 32, seed, 3.0 + seed / 100))
        write(tmp_path, record(2, 32, seed, 2.9 + seed / 100, steps=600))
    with pytest.raises(AnalysisInputError, match="different numbers of steps.*--steps"):
        load_runs(tmp_path)
    table = load_runs(tmp_path, steps=600)
    assert len(table.runs) == 2 and table.steps == 600 and table.skipped == {"other step count": 2}


def test_fingerprint_for_a_csv_without_one_is_refused(tmp_path):
    path = tmp_path / "runs.csv"
    synthetic_runs(depths=(2, 4), seeds=2).to_csv(path, index=False)
    with pytest.raises(AnalysisInputError, match="no data fingerprint"):
        load_runs(path, fingerprint="abc")


def test_an_old_record_stops_loading_with_the_migration_command(tmp_path):
    """A record of schema version 1 (here one from before the field existed) is never guessed at or
    left out: the one-line error names the command that upgrades it (tests/test_migrate_records.py)."""
    new = record(3, 176, 1, 1.42)
    write(tmp_path, new)
    old = write(tmp_path, new.replace(run_id="old-seed0", seed=0, final_eval_loss=1.41))
    data = json.loads((old / "result.json").read_text())
    for field in ("point_id", "peak_lr", "planned_steps", "schema_version"):
        del data[field]
    (old / "result.json").write_text(json.dumps(data))
    with pytest.raises(AnalysisInputError, match="schema version 1") as error:
        load_runs(tmp_path)
    assert str(error.value).endswith(f"python -m scaling.migrate_records {tmp_path}")


def test_summarize_gives_typed_outcomes(tmp_path):
    runs = synthetic_runs(depths=(2, 4, 6), seeds=3, noise=0.003, rng=4)
    records = [record(r.depth, r.width, r.seed, r.loss) for r in runs.itertuples()]
    assert summarize(records).outcome is Outcome.FITTED
    assert summarize([r for r in records if r.seed == 0]).outcome is Outcome.NO_SEED_NOISE
    assert summarize([r for r in records if r.depth == 2]).outcome is Outcome.TOO_FEW_DEPTHS
    assert summarize([]).outcome is Outcome.NO_FINISHED_RUNS
    mixed = records + [record(2, 40, 0, 3.0, steps=600)]
    assert summarize(mixed).outcome is Outcome.UNUSABLE_INPUT
    as_dicts = summarize([json.loads(r.to_json()) for r in records + records])  # each run counted once
    assert len(as_dicts.runs) == len(records)


def test_diverged_runs_are_listed_per_shape(tmp_path, capsys):
    write_sweep(tmp_path, both_rates=False)
    write(tmp_path, record(4, 48, 5, None, status="diverged"))
    assert main(["fit", str(tmp_path), "--bootstrap", "0"]) == 0
    out = capsys.readouterr().out
    assert "runs that did not finish, per shape:" in out and "L=4, d=48: seed 5 diverged" in out


def test_two_point_fit_prints_no_goodness_of_fit(tmp_path, capsys):
    path = tmp_path / "runs.csv"
    synthetic_runs(depths=(2, 4, 6), seeds=3, noise=0.002, rng=3).to_csv(path, index=False)
    assert main(["fit", str(path), "--bootstrap", "100"]) == 0
    out = capsys.readouterr().out
    assert "0 degrees of freedom: no goodness of fit" in out and "R²" not in out


def test_launcher_summary_uses_the_analysis_and_counts_each_run_once():
    from sweeps.state import RunState, analysis_lines

    runs = synthetic_runs(depths=(2, 4, 6), seeds=3, noise=0.003, rng=5)
    records = [json.loads(record(r.depth, r.width, r.seed, r.loss).to_json()) for r in runs.itertuples()]
    states = [RunState(None, "finished", None, r) for r in records + records[:2]]  # two copies of runs
    states.append(RunState(None, "unreadable", None, {"error": "x/result.json: not valid JSON"}))
    lines = analysis_lines(states, "runs/demo")
    assert lines[0].startswith(f"loaded {len(records)} runs from runs/demo")
    assert any(line.startswith("fit of log d = a + b·L, zero-crossing estimate: runs/demo") for line in lines)
    single = analysis_lines([s for s in states if s.record.get("seed") == 0], "runs/demo")
    assert single[-1] == "to assume a seed noise anyway: python -m analysis fit runs/demo --loss-std 0.02"


def test_a_tokens_per_parameter_ladder_is_one_design(tmp_path):
    """Steps that grow with size, every run planned for 20 tokens per parameter (to within one step), are
    kept together; a run off that ratio, or records without tokens per step, are refused as before."""
    per_step = 4096
    runs = synthetic_runs(depths=(2, 4, 6), seeds=2, noise=0.003, rng=5)
    for row in runs.itertuples():
        params = 12 * row.depth * row.width ** 2
        steps = max(1, round(20 * params / per_step))
        rec = dataclasses.replace(record(row.depth, row.width, row.seed, row.loss, steps=steps),
                                  tokens_per_step=per_step)
        write(tmp_path / "ladder", rec)
    table = load_runs(tmp_path / "ladder")
    assert table.runs["steps"].nunique() > 4 and len(table.runs) == len(runs)
    assert table.tokens_per_param == pytest.approx(20, rel=0.01) and table.steps is None
    assert any("20 training tokens per parameter" in note for note in table.notes)
    assert analyse(table, n_bootstrap=0).outcome is Outcome.FITTED

    first = next((tmp_path / "ladder").iterdir())
    data = json.loads((first / "result.json").read_text())
    data["planned_steps"] = data["planned_steps"] + 3  # three steps off the ratio
    (first / "result.json").write_text(json.dumps(data))
    with pytest.raises(AnalysisInputError, match="different numbers of steps"):
        load_runs(tmp_path / "ladder")
    data["planned_steps"] -= 3
    data["tokens_per_step"] = None  # unknown: the ratio cannot be checked
    (first / "result.json").write_text(json.dumps(data))
    with pytest.raises(AnalysisInputError, match="different numbers of steps"):
        load_runs(tmp_path / "ladder")
