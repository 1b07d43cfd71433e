"""The coordinate check (benchmarks/coord_check.py) on a tiny model: what each parametrization promises.

Widths 32 and 128 at depth 1, depths 1 and 4 at width 32 (the base shape 32 × 1), two heads at every
width, four AdamW steps at 1e-2 with weight decay, epsilon rules and clipping on. Slopes are log-log over
a 4× range, averaged over the four steps; the thresholds leave wide margins around what theory says and
what this setting measures on the development machine (in brackets):
- standard against width: Δlogits grows (theory 1) [0.86], Δ(q·k) too (theory 1.5: Δq grows as width
  and the dot product sums d_head coherent terms over sqrt(d_head)) [1.35];
- μP against width: embedding, feed-forward hidden, attention and feed-forward outputs, residual stream,
  final norm and logits flat (theory 0) [-0.10 to 0.01]; the hidden matrices' update falls as 1/width
  [-0.99]. Δ(q·k) does not grow as under the standard parametrization but falls here [-0.86]: with 128
  tokens a step and head sizes 16 to 64 these widths are far from the limit the theory takes (from width
  128 to 512 it is nearly flat), so the test asserts only that μP removes the standard growth;
- standard against depth: the last residual stream's Δ grows (theory up to 1) [0.81]; CompleteP: it,
  the final norm and the logits flat [-0.04 to 0.03];
- the depth diagnostic, the share of a block's change its linearisation misses: about flat under
  CompleteP (α = 1, theory 0) [-0.18] and falling under α = 0.5 (theory -1/2) [-0.57], at every step.
"""

import sys

import pytest

import helpers
from helpers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import coord_check  # noqa: E402

SETTINGS = {"base_width": 32, "base_depth": 1, "steps": 4, "lr": 1e-2, "batch_size": 4, "seq_len": 32, "heads": 2}
LAYERS = ("embedding", "qk", "ff_hidden", "attention", "mlp", "residual", "final_norm", "logits")


@pytest.fixture(scope="module")
def records():
    widths = coord_check.run(("standard", "mup"), widths=(32, 128), depths=(1,), **SETTINGS)
    depths = coord_check.run(("standard", "completep", "completep-a0.5"), widths=(32,), depths=(1, 4), **SETTINGS)
    return [r for r in widths if r["axis"] == "width"] + [r for r in depths if r["axis"] == "depth"]


def test_changes_grow_with_width_under_standard_and_not_under_mup(records):
    assert coord_check.slope(records, "standard", "width", "logits") > 0.5
    assert coord_check.slope(records, "standard", "width", "qk") > 0.8
    for layer in LAYERS:
        if layer != "qk":
            assert abs(coord_check.slope(records, "mup", "width", layer)) < 0.3, layer
    growth = coord_check.slope(records, "standard", "width", "qk") - coord_check.slope(records, "mup", "width", "qk")
    assert growth > 1.0
    # μP's means: the hidden matrices' updates shrink as 1/width (the rate), the other parameters' do not.
    assert coord_check.slope(records, "mup", "width", "update_hidden") == pytest.approx(-1.0, abs=0.15)
    assert abs(coord_check.slope(records, "mup", "width", "update_other")) < 0.15


def test_residual_stream_change_grows_with_depth_under_standard_and_stays_flat_under_completep(records):
    assert coord_check.slope(records, "standard", "depth", "residual") > 0.4
    for layer in ("residual", "final_norm", "logits"):
        assert abs(coord_check.slope(records, "completep", "depth", layer)) < 0.3, layer


def test_the_depth_diagnostic_tells_alpha_one_from_alpha_one_half(records):
    """CompleteP's claim: at α = 1 every depth learns as far from linear as the base depth does; at α = 0.5
    the share falls as depth^-1/2."""
    complete = coord_check.slope(records, "completep", "depth", coord_check.LINEARIZATION)
    half = coord_check.slope(records, "completep-a0.5", "depth", coord_check.LINEARIZATION)
    assert abs(complete) < 0.3
    assert half < -0.35
    assert complete - half > 0.25
    for one, other in zip(coord_check.slopes(records, "completep", "depth", coord_check.LINEARIZATION),
                          coord_check.slopes(records, "completep-a0.5", "depth", coord_check.LINEARIZATION)):
        assert one > other  # at every step, not only on average


def test_slopes_are_averaged_over_every_step(records):
    each = coord_check.slopes(records, "standard", "width", "logits")
    assert len(each) == SETTINGS["steps"]
    assert coord_check.slope(records, "standard", "width", "logits") == pytest.approx(sum(each) / len(each))


def test_every_step_records_each_blocks_activations_their_change_and_the_diagnostic(records):
    deep = next(r for r in records if r["parametrization"] == "completep" and r["depth"] == 4)
    assert [row["step"] for row in deep["steps"]] == [1, 2, 3, 4]
    last = deep["steps"][-1]
    for index in range(4):
        for name in ("attention", "mlp", "residual", "qk", "ff_hidden"):
            assert last[f"{name}_{index}"] > 0 and last[f"delta_{name}_{index}"] > 0
        assert 0 < last[f"linearization_{index}"] < 1
    assert last["delta_embedding"] > 0 and last["delta_final_norm"] > 0
    assert {"update_hidden", "update_block", "update_other"} <= set(deep["steps"][0])


def test_the_probe_batch_is_held_out_and_training_follows_the_seed_and_step(monkeypatch):
    """The swap of train_batch's (seed, step) is fixed: step s trains on batch (seed, s), the probe is a
    validation batch."""
    from scaling.data import pipeline as data

    calls = []
    original = data.Pipeline.train_batch

    def spy(self, seed, step, batch_size, *args, **kwargs):
        calls.append((seed, step))
        return original(self, seed, step, batch_size, *args, **kwargs)

    monkeypatch.setattr(data.Pipeline, "train_batch", spy)
    config = coord_check.coord_config("standard", 1, 32, base_width=32, base_depth=1, batch_size=2, seq_len=16,
                                      steps=3, heads=2)
    coord_check.measure(config)
    assert calls == [(config.seed, 0), (config.seed, 1), (config.seed, 2)]


def test_plot_writes_a_png(records, tmp_path):
    path = tmp_path / "coord.png"
    coord_check.plot(records, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_help_runs_without_jax_work():
    out = helpers.run([sys.executable, REPO / "benchmarks" / "coord_check.py", "--help"], check=True,
                      timeout=60).stdout
    assert "Coordinate check" in out and "--widths" in out and "--heads" in out
