"""Packs: which runs to train go together (one shape, one start step, at most K, queue order kept), the step a
run resumes from as orbax commits its checkpoints (local and gs://), --pack and Sweep.pack, and the packs that
list, status, dry-run and run show or hand to the loop (and nothing new at pack size 1)."""

import json
from pathlib import Path

import numpy as np
import pytest

import tiny
from scaling.model.run_program import pack_key
from sweeps import launch, packing, spec, state
from sweeps.spec import Sweep

# One shape twice over (seeds × rates) and a second shape: 2 widths × 2 rates × 3 seeds = 12 runs.
GRID = "depths=(1,), widths={1: (16, 32)}, seeds=(0, 1, 2), lr_grid=(1e-3, 3e-3)"


def runs_of(grid: str, tmp_path, name: str = "packs", **fields) -> list[spec.RunSpec]:
    return spec.load_sweep(tiny.write_sweep(tmp_path, name, grid, **fields)).expand().runs


def commit_steps(run_dir, steps) -> None:
    """Save checkpoints of ``steps`` in ``<run_dir>/checkpoints`` with orbax itself, laid out as it commits them
    (items ``state`` and ``meta``, as ``scaling.store.checkpoints`` saves; local or gs://)."""
    import orbax.checkpoint as ocp
    from etils import epath

    manager = ocp.CheckpointManager(epath.Path(str(run_dir)) / "checkpoints", item_names=("state", "meta"))
    try:
        for step in steps:
            manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave({"step": np.int32(step)}),
                                                       meta=ocp.args.JsonSave({"wandb_id": "x"})))
            manager.wait_until_finished()
    finally:
        manager.close()


def names(packs) -> list[list[str]]:
    return [pack.names for pack in packs]


# ---------------------------------------------------------------------------
# Planning


def test_runs_of_one_shape_share_packs_of_at_most_k_and_keep_the_queue_order(tmp_path):
    runs = runs_of(GRID, tmp_path)
    narrow = [run for run in runs if run.width == 16]
    wide = [run for run in runs if run.width == 32]
    assert len({pack_key(run.config) for run in narrow}) == 1 != len({pack_key(run.config) for run in runs})
    queue = [narrow[0], wide[0], narrow[1], narrow[2], wide[1], narrow[3]]
    packs = packing.plan_packs(queue, 2, lambda run: 0)
    # Each run joins the earliest pack of its shape with room; a pack sits where its first run was.
    assert names(packs) == [[narrow[0].name, narrow[1].name], [wide[0].name, wide[1].name],
                            [narrow[2].name, narrow[3].name]]
    assert [pack.label for pack in packs] == ["p1", "p2", "p3"] and {p.start_step for p in packs} == {0}
    big = packing.plan_packs(runs, 6, lambda run: 0)
    assert names(big) == [[run.name for run in narrow], [run.name for run in wide]]  # seeds and rates together
    assert names(packing.plan_packs(runs, 4, lambda run: 0)) == [
        [run.name for run in narrow[:4]], [run.name for run in narrow[4:]], [run.name for run in wide[:4]],
        [run.name for run in wide[4:]]]


def test_pack_size_one_trains_every_run_alone_in_order(tmp_path):
    runs = runs_of(GRID, tmp_path)
    packs = packing.plan_packs(runs, 1, lambda run: 0)
    assert names(packs) == [[run.name] for run in runs]
    assert [pack.label for pack in packs] == [f"p{i}" for i in range(1, len(runs) + 1)]
    assert packing.plan_packs([], 3, lambda run: 0) == []


def test_runs_that_differ_in_more_than_numbers_never_share_a_pack(tmp_path):
    grid = ("depths=(1,), widths={1: (16,)}, seeds=(0, 1), "
            "variants=(Variant('short'), Variant('long', overrides=('steps=9',)))")
    text = tiny.sweep_text("variants", grid).replace("from sweeps.spec import Sweep",
                                                     "from sweeps.spec import Sweep, Variant")
    (tmp_path / "variants.py").write_text(text)
    runs = spec.load_sweep(tmp_path / "variants.py").expand().runs
    assert [run.name for run in runs] == ["short-L1-d16-s0", "short-L1-d16-s1", "long-L1-d16-s0", "long-L1-d16-s1"]
    assert names(packing.plan_packs(runs, 4, lambda run: 0)) == [[r.name for r in runs[:2]], [r.name for r in runs[2:]]]


def test_runs_resuming_from_different_steps_go_in_separate_packs(tmp_path):
    runs = [run for run in runs_of(GRID, tmp_path) if run.width == 16][:5]
    workdir = tmp_path / "runs"
    commit_steps(runs[1].run_dir(workdir), [4])
    commit_steps(runs[2].run_dir(workdir), [4, 8])
    commit_steps(runs[4].run_dir(workdir), [4])
    starts = [state.resume_step(run.run_dir(workdir)) for run in runs]
    assert starts == [0, 4, 8, 0, 4]
    packs = packing.plan_packs(runs, 3, lambda run: state.resume_step(run.run_dir(workdir)))
    assert [(pack.start_step, pack.names) for pack in packs] == [
        (0, [runs[0].name, runs[3].name]), (4, [runs[1].name, runs[4].name]), (8, [runs[2].name])]


def test_resume_step_counts_only_committed_steps_locally(tmp_path):
    run_dir = tmp_path / "run"
    assert state.resume_step(run_dir) == 0 and state.checkpoint_steps(run_dir) == []
    commit_steps(run_dir, [4, 8])
    (run_dir / "checkpoints" / "12.orbax-checkpoint-tmp-1700000000").mkdir()  # a save under way: not a step
    (run_dir / "checkpoints-pending" / "token" / "16").mkdir(parents=True)  # leased_commit's private folder
    (run_dir / "checkpoints-set-aside" / "20-abcdef").mkdir(parents=True)  # a damaged step moved away
    assert state.checkpoint_steps(run_dir) == [4, 8] and state.resume_step(run_dir) == 8


def test_the_commit_file_is_orbaxs():
    from orbax.checkpoint._src.path import atomicity

    assert state.COMMIT_FILE == atomicity.COMMIT_SUCCESS_FILE


def test_resume_step_on_gs_needs_the_commit_file(gcs, tmp_path):
    from etils import epath

    run = runs_of("depths=(1,), widths={1: (16,)}", tmp_path)[0]
    run_dir = str(run.run_dir(gcs))
    commit_steps(run_dir, [4])
    assert (epath.Path(run_dir) / "checkpoints" / "4" / state.COMMIT_FILE).exists()
    # An interrupted commit: the step's objects copied, commit_success.txt not yet written (leased_commit.py).
    (epath.Path(run_dir) / "checkpoints" / "8" / "meta").mkdir(parents=True)
    (epath.Path(run_dir) / "checkpoints" / "8" / "meta" / "metadata").write_text("{}")
    assert state.checkpoint_steps(run_dir) == [4] and state.resume_step(run_dir) == 4
    assert state.read_state(run, gcs)[1:3] == ("resumable", 4)  # what status shows, and where run resumes
    (epath.Path(run_dir) / "checkpoints" / "8" / state.COMMIT_FILE).write_text("committed")
    assert state.resume_step(run_dir) == 8


# ---------------------------------------------------------------------------
# Validation


def test_pack_sizes_below_one_are_refused(tmp_path, capsys):
    base = spec.load_sweep(tiny.write_sweep(tmp_path, "ok", "depths=(1,), widths={1: (16,)}")).base
    for bad in (0, -2, 1.5, True, "2"):
        with pytest.raises(ValueError, match=r"^pack=.* is invalid: allowed an integer >= 1"):
            Sweep(name="bad", base=base, depths=(1,), widths={1: (16,)}, multiple_of=16, pack=bad)
        with pytest.raises(ValueError, match=r"^pack=.* is invalid: allowed an integer >= 1"):
            packing.plan_packs([], bad, lambda run: 0)
    sweep_file = tmp_path / "ok.py"
    for value in ("0", "-1", "x", "2.5"):
        with pytest.raises(SystemExit) as stop:
            launch.main(["list", str(sweep_file), "--workdir", str(tmp_path), "--pack", value])
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "--pack wants an integer >= 1" in err, err
    with pytest.raises(ValueError, match="start_step"):
        packing.Pack("p1", tuple(spec.load_sweep(sweep_file).expand().runs), -1)


def test_sweep_pack_is_described_only_when_it_packs(tmp_path):
    plain = spec.load_sweep(tiny.write_sweep(tmp_path, "plain", "depths=(1,), widths={1: (16,)}"))
    assert plain.pack == 1 and "pack" not in plain.to_dict()  # sweeps without packs keep their digest
    packed = Sweep(**{**{f: getattr(plain, f) for f in ("name", "base", "depths", "widths", "multiple_of")},
                      "pack": np.int64(4)})
    assert packed.pack == 4 and type(packed.pack) is int and packed.to_dict()["pack"] == 4
    assert packed.digest() != plain.digest()
    assert [run.run_id for run in packed.expand().runs] == [run.run_id for run in plain.expand().runs]


# ---------------------------------------------------------------------------
# What the commands show


def _sweep_with_states(tmp_path, pack_line: str = ""):
    """A sweep of 2 widths × 3 seeds: L1-d16-s0 finished, L1-d16-s1 resumable at step 4, the rest pending.
    Also the order ``run`` trains the other five in: cheapest first, runs of equal cost by run id."""
    sweep_file = tiny.write_sweep(tmp_path, "shown", "depths=(1,), widths={1: (16, 32)}, seeds=(0, 1, 2)")
    if pack_line:
        sweep_file.write_text(sweep_file.read_text().replace("multiple_of=16", f"multiple_of=16, {pack_line}"))
    runs = {run.name: run for run in spec.load_sweep(sweep_file).expand().runs}
    workdir = tmp_path / "runs"
    from test_launch import write_record

    write_record(runs["L1-d16-s0"], workdir, loss=2.5)
    commit_steps(runs["L1-d16-s1"].run_dir(workdir), [4])
    by_id = lambda names: sorted(names, key=lambda name: runs[name].run_id)  # noqa: E731
    return sweep_file, workdir, by_id(["L1-d16-s1", "L1-d16-s2"]) + by_id(["L1-d32-s0", "L1-d32-s1", "L1-d32-s2"])


def _json(capsys, *argv) -> dict:
    assert launch.main(list(map(str, argv))) == 0
    return json.loads(capsys.readouterr().out)


def test_list_status_and_dry_run_json_give_each_run_to_train_its_pack(tmp_path, capsys):
    sweep_file, workdir, order = _sweep_with_states(tmp_path)
    # The d16 runs first (the resumed one packs alone), then the d32 ones, the first two together.
    expected = {"L1-d16-s0": None, order[0]: "p1", order[1]: "p2", order[2]: "p3", order[3]: "p3", order[4]: "p4"}
    for command in ("list", "status", "dry-run"):
        data = _json(capsys, command, sweep_file, "--workdir", workdir, "--json", "--pack", 2)
        assert {run["name"]: run["pack"] for run in data["runs"]} == expected, command
    report = _json(capsys, "dry-run", sweep_file, "--workdir", workdir, "--json", "--pack", 2)
    start = {"L1-d16-s1": 4}
    assert report["pack_size"] == 2 and report["packs"] == [
        {"label": "p1", "start_step": start.get(order[0], 0), "runs": order[:1]},
        {"label": "p2", "start_step": start.get(order[1], 0), "runs": order[1:2]},
        {"label": "p3", "start_step": 0, "runs": order[2:4]}, {"label": "p4", "start_step": 0, "runs": order[4:]}]
    alone = _json(capsys, "list", sweep_file, "--workdir", workdir, "--json")  # pack size 1: a pack per run
    assert {run["name"]: run["pack"] for run in alone["runs"]} == {
        "L1-d16-s0": None, **{name: f"p{i + 1}" for i, name in enumerate(order)}}


def test_the_sweep_files_pack_is_the_default_and_pack_overrides_it(tmp_path, capsys):
    sweep_file, workdir, order = _sweep_with_states(tmp_path, "pack=3")
    data = _json(capsys, "status", sweep_file, "--workdir", workdir, "--json")
    assert {run["name"]: run["pack"] for run in data["runs"]} == {
        "L1-d16-s0": None, order[0]: "p1", order[1]: "p2", order[2]: "p3", order[3]: "p3", order[4]: "p3"}
    data = _json(capsys, "status", sweep_file, "--workdir", workdir, "--json", "--pack", 1)
    assert {run["name"]: run["pack"] for run in data["runs"]} == {
        "L1-d16-s0": None, **{name: f"p{i + 1}" for i, name in enumerate(order)}}


def _rows(text: str, first_column: str) -> dict[str, list[str]]:
    """The rows of the table in ``text`` whose header starts with ``first_column``: header and rows by name."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first_column + " "))
    rows = {"header": lines[start].split()}
    for line in lines[start + 1:]:
        if not line.startswith("L1-"):
            break
        rows[line.split()[0]] = line.split()
    return rows


def test_tables_show_a_pack_column_and_dry_run_counts_the_packs(tmp_path, capsys):
    sweep_file, workdir, order = _sweep_with_states(tmp_path)
    expected = {"L1-d16-s0": "-", order[0]: "p1", order[1]: "p2", order[2]: "p3", order[3]: "p3", order[4]: "p4"}
    for command in ("list", "status"):
        assert launch.main([command, str(sweep_file), "--workdir", str(workdir), "--pack", "2"]) == 0
        table = _rows(capsys.readouterr().out, "name")
        assert table["header"][-4:] == ["status", "pack", "eval", "loss"], command
        assert {name: table[name][-2] for name in expected} == expected, command
    assert launch.main(["dry-run", str(sweep_file), "--workdir", str(workdir), "--pack", "2"]) == 0
    out = capsys.readouterr().out
    table = _rows(out, "name")
    assert table["header"][-4:] == ["action", "pack", "tokens", "FLOPs"]
    assert {name: table[name][-3] for name in expected} == expected
    resumed = "p1" if order[0] == "L1-d16-s1" else "p2"
    assert f"5 runs in 4 packs of up to 2: 1 × 2 runs, 3 × 1 run; resuming: {resumed} at step 4" in out


def test_pack_size_one_prints_what_it_printed_before(tmp_path, capsys):
    sweep_file, workdir, _ = _sweep_with_states(tmp_path, "pack=1")
    for command in ("list", "status", "dry-run"):
        outputs = []
        for extra in ([], ["--pack", "1"]):
            assert launch.main([command, str(sweep_file), "--workdir", str(workdir), *extra]) == 0
            outputs.append(capsys.readouterr().out)
        assert outputs[0] == outputs[1], command
        header = _rows(outputs[0], "name")["header"]
        assert "pack" not in header and "packs" not in outputs[0], command
    assert header == ["name", "L", "d", "N", "(12·L·d²)", "seed", "status", "action", "tokens", "FLOPs"]
    assert launch.main(["list", str(sweep_file), "--workdir", str(workdir)]) == 0
    assert _rows(capsys.readouterr().out, "name")["header"] == [
        "name", "folder", "L", "d", "N", "(12·L·d²)", "budget", "seed", "status", "eval", "loss"]


# ---------------------------------------------------------------------------
# run: the plan goes to the loop


@pytest.mark.parametrize("pack", [1, 2])
def test_run_hands_the_loop_its_packs_only_above_pack_size_one(tmp_path, capsys, monkeypatch, pack):
    from sweeps.run_loop import RunLoop

    sweep_file, workdir, order = _sweep_with_states(tmp_path, "pack=2")
    handed = {}
    monkeypatch.setattr(RunLoop, "train", lambda self, queue, desc: handed.setdefault("train", queue) and None)
    # RunLoop.train_packs is the trainer side's (scaling/run/train.py); here only what it is handed is checked.
    monkeypatch.setattr(RunLoop, "train_packs", lambda self, packs, desc: handed.setdefault("packs", packs) and None,
                        raising=False)
    assert launch.main(["run", str(sweep_file), "--workdir", str(workdir), "--no-progress", "--pack", str(pack)]) == 0
    out = capsys.readouterr().out
    if pack == 1:
        assert list(handed) == ["train"] and [run.name for run in handed["train"]] == order
        assert "packs of up to" not in out and "pack" not in _rows(out, "name")["header"]
    else:
        assert list(handed) == ["packs"]
        start = {"L1-d16-s1": 4}
        assert [(p.label, p.start_step, p.names) for p in handed["packs"]] == [
            ("p1", start.get(order[0], 0), order[:1]), ("p2", start.get(order[1], 0), order[1:2]),
            ("p3", 0, order[2:4]), ("p4", 0, order[4:])]
        assert all(isinstance(run, spec.RunSpec) for p in handed["packs"] for run in p.runs)
        assert "5 runs in 4 packs of up to 2" in out and "pack" in _rows(out, "name")["header"]
    assert Path(workdir, "shown", "sweep.json").exists()


def test_showing_packs_never_starts_a_jax_backend(tmp_path):
    # pack_key imports JAX; `status` may run on a TPU host whose chips a training process holds.
    import textwrap

    import helpers

    sweep_file = tiny.write_sweep(tmp_path, "nobackend", GRID)
    code = textwrap.dedent(f"""
        from sweeps import launch
        from jax._src import xla_bridge
        for command in ("list", "status", "dry-run"):
            assert launch.main([command, {str(sweep_file)!r}, "--workdir", {str(tmp_path)!r}, "--pack", "4"]) == 0
        assert not xla_bridge._backends, xla_bridge._backends
    """)
    done = helpers.run_python(code, env=tiny.env(), timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "12 runs in 4 packs of up to 4: 2 × 4 runs, 2 × 2 runs" in done.stdout
