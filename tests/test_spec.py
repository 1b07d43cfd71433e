"""Sweep specs: expansion, names and ids, variants, budgets, per-depth rates, shards and validation."""

import dataclasses
import json
import random

import pytest

import tiny
from helpers import REPO
from scaling import hardware
from sweeps import launch, spec
from sweeps.spec import Sweep


write_sweep = tiny.write_sweep  # (directory, name, grid, ...): a sweep file of the tiny runs


def write_sweep_text(grid):
    """The ``sweep`` function of a test sweep file with this grid, without writing the file."""
    namespace = {}
    exec(tiny.sweep_text("unit", grid, "unit.py"), namespace)
    return namespace["sweep"]


def test_expansion_names_ids_and_configs():
    sweep = write_sweep_text("depths=(1, 2), budgets=(2e4, 6e4), seeds=(0, 3), lr_grid=(1e-3, 3.5e-3)")()
    runs = sweep.expand().runs
    assert len(runs) == 2 * 2 * 2 * 2
    assert runs[0].name == "L1-d48-s0-lr1e-03" and "L2-d48-s3-lr3.5e-03" in {r.name for r in runs}
    assert len({r.run_id for r in runs}) == len(runs)
    for run in runs:
        assert run.config.sweep_name == "unit" and run.config.name == run.name
        assert (run.config.model.depth, run.config.model.width, run.config.seed) == (run.depth, run.width, run.seed)
        assert run.name.endswith(f"-lr{spec.lr_tag(run.config.optim.peak_lr)}")
    # Ids are a pure function of the resolved config: expanding again gives the same ones.
    assert [r.run_id for r in sweep.expand().runs] == [r.run_id for r in runs]
    # Presentation fields keep run ids, anything that changes training changes them.
    quiet = spec.with_overrides(sweep, ["log_every=7"])
    longer = spec.with_overrides(sweep, ["steps=13"])
    assert [r.run_id for r in quiet.expand().runs] == [r.run_id for r in runs]
    assert not {r.run_id for r in longer.expand().runs} & {r.run_id for r in runs}


def test_variants_cross_the_grid_with_their_own_overrides_and_seeds():
    base = write_sweep_text("depths=(1,), widths={1: (16,)}, seeds=(0, 1, 2)")()
    variants = (spec.Variant("a", ("model.attention_scale=log_length",)),
                spec.Variant("b", ("steps=13", "data.seq_len=32"), seeds=(5,)))
    sweep = Sweep(name="unit", base=base.base, depths=(1,), widths={1: (16,)}, seeds=(0, 1, 2), variants=variants)
    runs = sweep.expand().runs
    assert [r.name for r in runs] == ["a-L1-d16-s0", "a-L1-d16-s1", "a-L1-d16-s2", "b-L1-d16-s5"]
    assert all(r.config.model.attention_scale == "log_length" for r in runs[:3])
    assert (runs[3].config.steps, runs[3].config.data.seq_len, runs[3].seed) == (13, 32, 5)
    assert len({r.run_id for r in runs}) == 4
    assert sweep.to_dict()["variants"][1] == {"tag": "b", "overrides": ["steps=13", "data.seq_len=32"], "seeds": [5]}
    # A sweep without variants describes itself (and hashes) as before variants existed.
    assert "variants" not in base.to_dict()
    with pytest.raises(ValueError, match="seed"):
        spec.Variant("c", ("seed=3",))
    with pytest.raises(ValueError, match="distinct"):
        Sweep(name="unit", base=base.base, depths=(1,), widths={1: (16,)}, variants=variants[:1] * 2)


def test_log_length_sweep_expands_to_the_documented_grid():
    """Two grids: learned positions on a fixed set of 100 strings (2,000 steps of 10), and FIRST as its
    authors trained it (indicator positions, a fresh string at each of 10,000 steps of 1)."""
    runs = spec.load_sweep(REPO / "sweeps" / "configs" / "log_length.py").expand().runs
    cells = {}
    for run in runs:
        c = run.config
        key = (c.model.position, c.data.source, c.data.synthetic_max_length, c.model.attention_scale)
        cells.setdefault(key, []).append(run.seed)
        assert c.data.synthetic_min_length == c.data.synthetic_max_length
        assert c.data.synthetic_eval_min_length == c.data.synthetic_eval_max_length == 1000
        assert c.eval_batches * c.batch_size == 1000  # the same 1,000 test strings for every run
        assert c.model.heads == (1 if c.data.source == "first" else 2)
        shape = (c.model.depth, c.model.width, c.model.ff_width, c.model.norm, c.optim.peak_lr)
        assert shape == (2, 16, 64, "post", 3e-4)
        if c.model.position == "learned":
            assert c.steps * c.batch_size == 200 * c.data.synthetic_train_size == 200 * 100
        else:
            assert (c.model.position, c.data.source, c.data.synthetic_train_size) == ("first_indicator", "first", 0)
            assert (c.steps, c.batch_size) == (10_000, 1)
    learned = {key[1:]: seeds for key, seeds in cells.items() if key[0] == "learned"}
    authors = {key[1:]: seeds for key, seeds in cells.items() if key[0] == "first_indicator"}
    assert len(learned) == 12 and len(authors) == 8
    assert all(len(seeds) == (5 if task == "parity" or n == 300 else 10) for (task, n, _), seeds in learned.items())
    assert all(sorted(seeds) == list(range(20)) for seeds in authors.values())
    assert len({run.run_id for run in runs}) == len(runs) == 90 + 160


@pytest.mark.parametrize("sweep_file", ["smoke.py", "cpu_mini.py", "paper.py"])
def test_realised_sizes_are_within_rounding_of_their_budgets(sweep_file, monkeypatch):
    from scaling.data import pipeline as data

    def no_data(*_):
        raise AssertionError("expanding a sweep must not build the data pipeline")

    monkeypatch.setattr(data, "build", no_data)
    sweep = spec.load_sweep(REPO / "sweeps" / "configs" / sweep_file)
    runs, skipped = sweep.expand()
    assert runs
    for run in runs:
        ratio = max(run.params / run.budget, run.budget / run.params)
        step = sweep.multiple_of  # the ideal width is within one step: N is off by at most d / (d - step)
        assert ratio <= (2.0 if run.width <= step else run.width / (run.width - step)), run.name
        assert run.params == 12 * run.depth * run.width ** 2
        assert run.width % sweep.base.model.head_dim == 0
    # Every (depth, budget) pair gave a run or is reported as skipped.
    for depth in sweep.depths:
        budgets = sweep.budgets[depth] if isinstance(sweep.budgets, dict) else sweep.budgets
        given = {r.budget for r in runs if r.depth == depth} | {s.budget for s in skipped if s.depth == depth}
        assert given == set(budgets)


def test_too_small_budget_is_reported_not_fatal(tmp_path, capsys):
    sweep = write_sweep_text("depths=(1, 8), budgets=(50, 1e5)")()
    runs, skipped = sweep.expand()
    assert {(s.depth, s.budget) for s in skipped} == {(1, 50.0), (8, 50.0)}
    assert all("too small" in s.reason for s in skipped)
    assert {(r.depth, r.budget) for r in runs} == {(1, 1e5), (8, 1e5)}
    sweep_file = write_sweep(tmp_path, "small", "depths=(1, 8), budgets=(50, 1e5)")
    assert launch.main(["list", str(sweep_file), "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "skipped: depth 8, budget 50: budget params=50 is too small for depth=8" in out
    assert "L8-d32-s0" in out


def test_shards_are_disjoint_cover_the_sweep_and_balance_cost():
    runs = write_sweep_text("depths=(1, 2, 4), budgets=(3e4, 1e5, 3e5, 1e6), seeds=(0, 1)")().expand().runs
    assert len(runs) == 24
    for count in (2, 3):
        shares = [spec.shard(runs, index, count) for index in range(count)]
        ids = [run.run_id for share in shares for run in share]
        assert len(ids) == len(set(ids)) == len(runs)  # disjoint, and together the whole sweep
        loads = [sum(run.flops for run in share) for share in shares]
        assert max(loads) - min(loads) <= max(run.flops for run in runs)
        shuffled = random.Random(count).sample(runs, len(runs))  # a host's view never depends on order
        assert [{r.run_id for r in spec.shard(shuffled, i, count)} for i in range(count)] == [
            {r.run_id for r in share} for share in shares]
    assert spec.shard(runs, 0, 1) == runs


def test_sweep_validation():
    base = write_sweep_text("depths=(1,), widths={1: (16,)}")().base
    bad = [dict(depths=(1, 1), budgets=(1e5,)), dict(depths=(1,), budgets=(-1.0,)),
           dict(depths=(1, 2), widths={1: (16,)}), dict(depths=(1,), budgets=(1e5,), seeds=()),
           dict(depths=(1,), widths={1: (24,)}),  # 24 channels do not split into 16-channel heads
           dict(depths=(0,), budgets=(1e5,))]
    for fields in bad:
        with pytest.raises(ValueError):
            Sweep(name="bad", base=base, multiple_of=16, **fields)
    with pytest.raises(ValueError, match="name"):
        Sweep(name="a/b", base=base, depths=(1,), budgets=(1e5,))


def test_a_peak_rate_per_depth():
    base = write_sweep_text("depths=(1,), widths={1: (16,)}")().base
    sweep = Sweep(name="per_depth", base=base, depths=(1, 2), widths={1: (16, 32), 2: (16,)}, seeds=(0, 1),
                  peak_lr_by_depth={1: 4e-3, 2: 2e-3}, multiple_of=16)
    runs, _ = sweep.expand()
    assert {(r.config.model.depth, r.config.optim.peak_lr) for r in runs} == {(1, 4e-3), (2, 2e-3)}
    plain = Sweep(name="per_depth", base=base, depths=(1, 2), widths={1: (16, 32), 2: (16,)}, seeds=(0, 1),
                  multiple_of=16)
    assert "peak_lr_by_depth" not in plain.to_dict()  # other sweeps' descriptions are unchanged
    # A run with the rate its depth was given is the same run as one configured by hand.
    by_hand = dataclasses.replace(plain.expand().runs[0].config,
                                  optim=dataclasses.replace(base.optim, peak_lr=4e-3))
    assert runs[0].run_id == spec.config_id(by_hand)
    for fields in (dict(peak_lr_by_depth={1: 4e-3}), dict(peak_lr_by_depth={1: 4e-3, 2: -1.0}),
                   dict(peak_lr_by_depth={1: 4e-3, 2: 2e-3}, lr_grid=(1e-3, 2e-3))):
        with pytest.raises(ValueError, match="peak_lr_by_depth|lr_grid"):
            Sweep(name="bad", base=base, depths=(1, 2), widths={1: (16,), 2: (16,)}, multiple_of=16, **fields)
    with pytest.raises(ValueError, match="optim.peak_lr"):
        spec.with_overrides(sweep, ["optim.peak_lr=1e-3"])


def test_a_learning_rate_grid_per_depth():
    base = write_sweep_text("depths=(1,), widths={1: (16,)}")().base
    grid = {1: (1e-3, 2e-3), 2: (2e-3, 4e-3, 8e-3)}
    sweep = Sweep(name="grid_per_depth", base=base, depths=(1, 2), widths={1: (16,), 2: (16,)}, lr_grid=grid,
                  multiple_of=16)
    runs, _ = sweep.expand()
    assert sorted((r.depth, r.config.optim.peak_lr) for r in runs) == sorted(
        (depth, lr) for depth, rates in grid.items() for lr in rates)
    assert {r.name for r in runs if r.depth == 2} == {"L2-d16-s0-lr2e-03", "L2-d16-s0-lr4e-03", "L2-d16-s0-lr8e-03"}
    assert sweep.to_dict()["lr_grid"] == {"1": [1e-3, 2e-3], "2": [2e-3, 4e-3, 8e-3]}
    # A shared grid describes and expands as before.
    shared = Sweep(name="grid_per_depth", base=base, depths=(1, 2), widths={1: (16,), 2: (16,)},
                   lr_grid=(1e-3, 2e-3), multiple_of=16)
    assert shared.to_dict()["lr_grid"] == [1e-3, 2e-3] and len(shared.expand().runs) == 4
    for bad in ({1: (1e-3,)}, {1: (1e-3,), 2: (0.0,)}):
        with pytest.raises(ValueError, match="lr_grid"):
            Sweep(name="bad", base=base, depths=(1, 2), widths={1: (16,), 2: (16,)}, lr_grid=bad, multiple_of=16)


def test_tokens_per_param_sets_each_runs_steps():
    base = write_sweep_text("depths=(1,), widths={1: (16,)}")().base  # batch × seq_len tokens per step
    per_step = base.batch_size * base.data.seq_len
    sweep = Sweep(name="ladder", base=base, depths=(1, 2), widths={1: (16, 32), 2: (16, 48)}, multiple_of=16,
                  tokens_per_param=20)
    runs, _ = sweep.expand()
    for run in runs:
        assert run.config.steps == max(1, round(20 * run.params / per_step))
        assert run.tokens == pytest.approx(20 * run.params, abs=per_step / 2)
    assert len({run.config.steps for run in runs}) == 4
    assert sweep.to_dict()["tokens_per_param"] == 20.0
    plain = Sweep(name="ladder", base=base, depths=(1, 2), widths={1: (16, 32), 2: (16, 48)}, multiple_of=16)
    assert "tokens_per_param" not in plain.to_dict() and "expected_mfu" not in plain.to_dict()
    assert {run.config.steps for run in plain.expand().runs} == {base.steps}
    with pytest.raises(ValueError, match="steps"):
        spec.with_overrides(sweep, ["steps=5"])
    assert spec.with_overrides(plain, ["steps=5"]).base.steps == 5
    for fields, match in ((dict(tokens_per_param=0), "tokens_per_param"), (dict(expected_mfu=(0.2, 0.1)),
                          "expected_mfu"), (dict(expected_mfu=(0.0, 0.1)), "expected_mfu"),
                          (dict(expected_mfu=0.1), "expected_mfu")):
        with pytest.raises(ValueError, match=match):
            Sweep(name="bad", base=base, depths=(1,), widths={1: (16,)}, multiple_of=16, **fields)


def test_dry_run_quotes_the_sweeps_expected_mfu_before_any_run_finished(tmp_path, capsys):
    plain = write_sweep(tmp_path, "plain", "depths=(1,), widths={1: (16, 32)}")
    assert launch.main(["dry-run", str(plain), "--workdir", str(tmp_path)]) == 0
    assert "device-hours at 30% of peak_flops" in capsys.readouterr().out
    text = plain.read_text().replace("multiple_of=16", "multiple_of=16, expected_mfu=(0.05, 0.1)")
    assert text != plain.read_text()
    (tmp_path / "mfu.py").write_text(text)
    assert launch.main(["dry-run", str(tmp_path / "mfu.py"), "--workdir", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    seconds = report["flops"] / report["speed_flops_per_second"]
    assert report["device_hours"] == pytest.approx(seconds / 3600)
    peak = hardware.nominal_peak_flops(spec.load_sweep(tmp_path / "mfu.py").base.peak_flops)
    assert report["speed_flops_per_second"] == pytest.approx(0.05 * peak)  # the low end of the range
    assert report["device_hours_range"] == pytest.approx([report["device_hours"] / 2, report["device_hours"]])
