"""The learning-rate transfer experiment: its sweep file and its analysis (``python -m analysis hp-transfer``)."""

import json

import pytest

from analysis import __main__ as analysis_cli
from analysis import hp_transfer
from helpers import REPO
from sweeps import spec
RATES = (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2)


def test_the_sweep_crosses_two_4x_axes_with_three_parametrizations_and_six_rates(monkeypatch):
    from scaling.data import pipeline as data

    monkeypatch.setattr(data, "build", lambda *_: pytest.fail("expanding a sweep must not build the data"))
    sweep = spec.load_sweep(REPO / "sweeps" / "configs" / "hp_transfer.py")
    runs = sweep.expand().runs
    assert len(runs) == len({run.run_id for run in runs}) == 5 * 3 * 6
    shapes = {(run.depth, run.width) for run in runs}
    assert shapes == {(2, 64), (2, 128), (2, 256), (4, 64), (8, 64)}
    by_name = {}
    for run in runs:
        optim = run.config.optim
        by_name.setdefault(optim.parametrization, set()).add((run.depth, run.width, optim.peak_lr))
        assert (optim.base_width, optim.base_depth, optim.lr_rule) == (64, 2, "constant")
        assert run.name.startswith(optim.parametrization + "-")
    assert set(by_name) == {"standard", "mup", "completep"} and len({frozenset(v) for v in by_name.values()}) == 1


def _write(root, name, parametrization, depth, width, lr, loss, status="finished"):
    run = root / "hp_transfer" / name
    run.mkdir(parents=True)
    rule = "constant" if parametrization == "standard" else f"parametrization={parametrization}"
    record = {"status": status, "name": name, "run_id": name, "sweep": "hp_transfer", "depth": depth,
              "width": width, "params_non_embedding": 12 * depth * width ** 2, "schema_version": 2,
              "point_id": name, "lr_rule": rule, "peak_lr": lr, "planned_steps": 10, "seed": 0,
              "final_eval_loss": loss, "tokens": 1000, "steps": 10, "wall_seconds": 1.0, "data_fingerprint": "fp"}
    (run / "result.json").write_text(json.dumps(record))


@pytest.fixture
def sweep_dir(tmp_path):
    """Loss curves (log2 lr - log2 best)² + shape term; standard's best rate halves per doubling of width
    or depth, μP's and CompleteP's stay at 4e-3; standard diverges at the top rate of the widest model."""
    import math

    def loss(lr, best, offset):
        return 2.0 + offset + 0.05 * (math.log2(lr) - math.log2(best)) ** 2

    for name in ("standard", "mup", "completep"):
        for axis_sizes, fixed in (((64, 128, 256), "width"), ((2, 4, 8), "depth")):
            for index, size in enumerate(axis_sizes):
                if fixed == "depth" and size == 2:
                    continue  # the base shape is on the width axis already
                depth, width = (2, size) if fixed == "width" else (size, 64)
                moves = name == "standard" or (name == "mup" and fixed == "depth")
                best = 8e-3 / 2 ** index if moves else 4e-3
                for lr in RATES:
                    diverged = name == "standard" and width == 256 and lr == RATES[-1]
                    _write(tmp_path, f"{name}-L{depth}-d{width}-lr{lr:g}", name, depth, width, lr,
                           None if diverged else loss(lr, best, -0.01 * index),
                           status="diverged" if diverged else "finished")
    return tmp_path / "hp_transfer"


def test_best_rates_spreads_and_the_criterion(sweep_dir):
    table = hp_transfer.best_rates(sweep_dir)
    best = {(r.parametrization, r.axis, r.size): r.best_lr for r in table.itertuples()}
    assert best[("standard", "width", 64)] == pytest.approx(8e-3)
    assert best[("standard", "width", 256)] == pytest.approx(2e-3)
    assert best[("mup", "width", 256)] == pytest.approx(4e-3)
    spreads = {(r.parametrization, r.axis): r.spread for r in hp_transfer.spreads(table).itertuples()}
    assert spreads[("standard", "width")] == pytest.approx(4.0) and spreads[("mup", "width")] == pytest.approx(1.0)
    assert spreads[("completep", "depth")] == pytest.approx(1.0) and spreads[("mup", "depth")] == pytest.approx(2.0)
    verdicts = hp_transfer.criterion(hp_transfer.spreads(table))
    assert verdicts["width"]["verdict"] == verdicts["depth"]["verdict"] == "holds"


def test_a_best_rate_at_the_grid_end_leaves_the_criterion_undecided(tmp_path):
    for width, best_index in ((64, 0), (128, 2), (256, 2)):
        for name in ("standard", "mup"):
            for index, lr in enumerate(RATES):
                _write(tmp_path, f"{name}-d{width}-lr{lr:g}", name, 2, width, lr, 2.0 + abs(index - best_index))
    verdicts = hp_transfer.criterion(hp_transfer.spreads(hp_transfer.best_rates(tmp_path / "hp_transfer")))
    assert verdicts["width"]["verdict"] == "undecided" and "grid" in verdicts["width"]["why"]
    assert verdicts["depth"]["verdict"] == "undecided"


def test_cli_prints_tables_json_and_draws_the_figure(sweep_dir, tmp_path, capsys):
    figure = tmp_path / "loss_vs_lr.png"
    assert analysis_cli.main(["hp-transfer", str(sweep_dir), "--figure", str(figure)]) == 0
    out = capsys.readouterr().out
    assert "criterion along width: holds" in out and "| mup | width | 256 | 0.004 |" in out
    assert figure.read_bytes()[:4] == b"\x89PNG"
    assert analysis_cli.main(["hp-transfer", str(sweep_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["criterion"]["depth"]["verdict"] == "holds"
