"""The quick preflight (sweeps/preflight/quick.py, layer_loop.py): which programs are compiled, and how the others
are re-priced from a compiled program's layer loop or interpolated between compiled widths.

The planning and interpolation tests need no compiler. The re-pricing test compiles two tiny programs for
v5e:2x2 with libtpu (seconds each) and sets the re-priced row against the compiled one.
"""

import contextlib
import dataclasses
import io
import json
import math

import pytest

from scaling import hardware
from scaling.config import DataConfig, ModelConfig, TrainConfig
from sweeps import launch, preflight, spec
from sweeps.preflight import hlo, layer_loop, quick, report
from sweeps.preflight.topology import parse_topology

pytestmark = pytest.mark.filterwarnings("ignore:Error reading persistent compilation cache entry:UserWarning")
PAPER = "sweeps/configs/paper.py"


def programs_of(runs) -> list[quick.Program]:
    first = {}
    for name, config in runs:
        first.setdefault(report.program_key(config), (name, config))
    return [quick.Program(key, name, config) for key, (name, config) in first.items()]


def test_anchor_widths_keep_both_ends_and_neighbours_within_the_ratio():
    widths = list(range(128, 1537, 128))
    anchors = quick.anchor_widths(widths, max_ratio=4.0)
    assert anchors[0] == 128 and anchors[-1] == 1536 and len(anchors) >= 3
    assert all(b / a <= 4.0 * 1.2 for a, b in zip(anchors, anchors[1:]))
    assert quick.anchor_widths([256, 128]) == [128, 256]
    assert quick.anchor_widths([64, 128, 192]) == [64, 128, 192]  # one inside, to measure the error


def test_the_paper_sweep_on_one_mesh_compiles_7_programs_quick_23_by_width_and_48_in_full():
    # The paper sweep with fsdp on every run (no data-parallel limit): one family of programs.
    runs, _ = dataclasses.replace(spec.load_sweep(PAPER), data_parallel_state_bytes=None).expand()
    programs = programs_of([(run.name, run.config) for run in runs])
    counts = {mode: len(quick.to_compile(programs, mode)) for mode in quick.MODES}
    assert counts == {"quick": 7, "depths": 23, "full": 48}
    compiled = {(p.depth, p.width) for p in quick.to_compile(programs, "quick")}
    # The fit check: no run is both deeper and wider than these two.
    assert {(p.depth, p.width) for p in quick.non_dominated(programs)} == {(48, 1600), (36, 1856)}
    assert {(48, 1600), (36, 1856)} <= compiled
    with pytest.raises(ValueError, match="mode='fast': allowed quick, depths, full"):
        quick.to_compile(programs, "fast")


def test_two_mesh_families_are_checked_and_anchored_each_on_their_own():
    # Runs whose state fits a chip replicated (data_parallel_state_bytes), the larger ones fsdp: their programs
    # differ, so each family has its own fit check and anchor widths.
    sweep = spec.load_sweep(PAPER)  # as the paper sweep is: its limit a quarter of a v5e chip's HBM
    assert sweep.data_parallel_state_bytes == hardware.TPU_V5E.hbm_bytes // 4
    programs = programs_of([(run.name, run.config) for run in sweep.expand().runs])
    assert {mode: len(quick.to_compile(programs, mode)) for mode in quick.MODES} == \
        {"quick": 14, "depths": 25, "full": 48}
    fit_check = {(p.depth, p.width, p.config.mesh.fsdp) for p in quick.non_dominated(programs)}
    assert fit_check == {(48, 1600, -1), (36, 1856, -1), (24, 768, 1), (30, 704, 1), (36, 640, 1)}


# ---------------------------------------------------------------------------
# Interpolation on rows whose figures follow a known law of width and depth


def config(depth, width) -> TrainConfig:
    return TrainConfig(model=ModelConfig(depth=depth, width=width, head_dim=64, vocab_size=512, max_seq_len=64),
                       data=DataConfig(seq_len=64), batch_size=8)


def law(depth, width) -> dict:
    """Figures of a made-up program: a per-layer part ~ w² + w and the rest ~ w (not a power law: errs)."""
    layer, rest = 1e-9 * width ** 2 + 3e-7 * width, 2e-7 * width
    seconds = rest + depth * layer
    return {"estimated_step_seconds": seconds, "roofline_corrected_step_seconds": 1.5 * seconds,
            "compiler_step_seconds": 3 * seconds, "flops": 1e12 * seconds, "compute_seconds": seconds,
            "memory_seconds": 0.1 * seconds, "exposed_collective_seconds": 0.0,
            "hbm_bytes_per_device": 1e6 * width + depth * 1e3 * width ** 2}


def compiled_row(depth, width) -> dict:
    deeper, here = law(depth + 1, width), law(depth, width)
    per_layer = {key: deeper[key] - here[key] for key in here}
    return {**here, "name": f"L{depth}-d{width}", "fits": True, "status": "PASS", "method": "compiled",
            "per_layer": {"depth": depth, "layer_loops": ["while.1"], "fields": per_layer}}


def test_interpolated_rows_carry_the_error_measured_on_the_compiled_widths():
    chip = parse_topology("v5e:2x2").chip
    widths = (128, 256, 512, 1024)
    programs = programs_of([(f"L4-d{w}", config(4, w)) for w in widths + (384,)] + [("L2-d256", config(2, 256))])
    by_shape = {(p.depth, p.width): p for p in programs}
    rows = {by_shape[(4, w)].key: compiled_row(4, w) for w in widths}
    done, missing = quick.complete(programs, rows, 4, chip)
    assert not missing
    methods = {(p.depth, p.width): done[p.key]["method"] for p in programs}
    assert methods == {**{(4, w): "compiled" for w in widths}, (4, 384): "interpolated", (2, 256): "re-priced"}
    # Re-pricing follows the layer loop exactly.
    assert done[by_shape[(2, 256)].key]["estimated_step_seconds"] == pytest.approx(
        law(2, 256)["estimated_step_seconds"], rel=1e-9)
    # The error each interpolated row states is the worst leave-one-out error over the inner anchors, recomputed here.

    def predicted(left, middle, right, key):
        share = math.log(middle / left) / math.log(right / left)
        total = 0.0
        for part in ("rest", "layer"):
            a, b = (_part(law, w, key, part) for w in (left, right))
            total += math.exp(math.log(a) + share * (math.log(b) - math.log(a))) * (4 if part == "layer" else 1)
        return total

    errors = [abs(predicted(a, b, c, "estimated_step_seconds") / law(4, b)["estimated_step_seconds"] - 1)
              for a, b, c in zip(widths, widths[1:], widths[2:])]
    row = done[by_shape[(4, 384)].key]
    assert row["interpolation_error"] == pytest.approx(max(errors), rel=1e-6) and row["interpolation_error"] > 0
    truth = law(4, 384)["estimated_step_seconds"]
    assert abs(row["estimated_step_seconds"] / truth - 1) <= row["interpolation_error"]
    assert row["fits"] and row["fits_by"].startswith("dominated by L4-d512")
    assert "interpolated ±" in preflight.format_table([dict(row, hbm_capacity_bytes=None, collective_bytes=None,
                                                           mfu_upper_bound=None, remat_suggestion=None)])


def _part(figures, width, key, part):
    zero, one = figures(0, width)[key], figures(1, width)[key]
    return zero if part == "rest" else one - zero


def test_a_width_no_anchor_brackets_is_compiled_not_extrapolated():
    chip = parse_topology("v5e:2x2").chip
    programs = programs_of([(f"L4-d{w}", config(4, w)) for w in (128, 256, 512, 1024)])
    rows = {p.key: compiled_row(4, p.width) for p in programs if p.width != 1024}
    _, missing = quick.complete(programs, rows, 4, chip)
    assert [p.width for p in missing] == [1024]


# ---------------------------------------------------------------------------
# Re-pricing a compiled program to another depth, against the compiled one (libtpu)

SWEEP = '''
from scaling.config import DataConfig, MeshConfig, ModelConfig, TrainConfig
from sweeps.spec import Sweep

def sweep():
    base = TrainConfig(model=ModelConfig(head_dim=32, max_seq_len=128, vocab_size=512, remat="full",
                                         compute_dtype="bfloat16"),
                       data=DataConfig(seq_len=128), batch_size=BATCH, mesh=MeshConfig(data=1, fsdp=-1))
    return Sweep(name="q", base=base, depths=(3, 6), widths={3: (128,), 6: (128,)})
'''


@pytest.fixture(scope="module")
def two_depths(tmp_path_factory):
    if not preflight.libtpu_installed():
        pytest.skip('needs libtpu, the optional tpu extra: pip install -e ".[tpu]"')
    folder = tmp_path_factory.mktemp("quick")
    path = folder / "sweep.py"
    path.write_text(SWEEP.replace("BATCH", "64"))
    cache = str(folder / "cache")

    def preflight_json(*options):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = launch.main(["preflight", str(path), "--topology", "v5e:2x2", "--json", "--jobs", "1",
                                "--compile-cache", cache, *options])
        return code, json.loads(out.getvalue())

    return preflight_json("--full"), preflight_json()


def test_full_mode_compiles_every_program_as_before(two_depths):
    (code, full), _ = two_depths
    assert code == 0
    assert [row["method"] for row in full["runs"]] == ["compiled", "compiled"]
    assert full["summary"]["programs_compiled"] == 2 and full["summary"]["programs_repriced"] == 0
    assert full["summary"]["preflight_mode"] == "full"


def test_a_repriced_depth_matches_its_compiled_program_within_1_percent(two_depths):
    (_, full), (code, fast) = two_depths
    assert code == 0 and fast["summary"]["preflight_mode"] == "quick"
    shallow, deep = fast["runs"]
    assert (shallow["method"], deep["method"]) == ("re-priced", "compiled")
    assert "L6-d128-s0's layer loop run 3 instead of 6 times" in shallow["method_note"]
    assert fast["summary"]["programs_from_cache"] == 1 and fast["summary"]["programs_repriced"] == 1
    compiled = full["runs"][0]
    for key in ("estimated_step_seconds", "roofline_corrected_step_seconds", "compiler_step_seconds", "flops",
                "collective_bytes", "hbm_bytes_per_device", "step_seconds_low", "step_seconds_high", "mfu_low",
                "mfu_high", "estimated_mfu", "parameters", "params_non_embedding", "tokens_per_step"):
        assert shallow[key] == pytest.approx(compiled[key], rel=0.01), key
    # HBM traffic less closely (2% here): at another depth libtpu keeps a few small arrays elsewhere (VMEM or HBM).
    assert shallow["hbm_bytes_accessed"] == pytest.approx(compiled["hbm_bytes_accessed"], rel=0.03)
    assert shallow["fits"] and shallow["fits_by"] == "dominated by L6-d128-s0, compiled"


def test_the_layer_loops_are_told_from_other_loops_of_the_same_trip_count():
    # Two loops run 2 times; only the one carrying a stacked weight (an entry argument's shape) is a layer loop:
    # the other carries chunks of something computed.
    text = """HloModule m

cond {
  p = (s32[], f32[2,8]{1,0}) parameter(0)
  i = s32[] get-tuple-element(%p), index=0
  c = s32[] constant(2)
  ROOT lt = pred[] compare(%i, %c), direction=LT
}

body {
  p = (s32[], f32[2,8]{1,0}) parameter(0)
  i = s32[] get-tuple-element(%p), index=0
  one = s32[] constant(1)
  n = s32[] add(%i, %one)
  w = f32[2,8]{1,0} get-tuple-element(%p), index=1
  ROOT t = (s32[], f32[2,8]{1,0}) tuple(%n, %w)
}

ENTRY main {
  weights = f32[2,8]{1,0} parameter(0)
  nothing = f32[] constant(0)
  chunks = f32[2,4]{1,0} broadcast(%nothing), dimensions={}
  zero = s32[] constant(0)
  saved = bf16[2,16]{1,0} broadcast(%nothing), dimensions={}
  kept = bf16[2,32]{1,0:S(1)} broadcast(%nothing), dimensions={}
  start = (s32[], f32[2,8]{1,0}, bf16[2,16]{1,0}, bf16[2,32]{1,0:S(1)}) tuple(%zero, %weights, %saved, %kept)
  layers = (s32[], f32[2,8]{1,0}, bf16[2,16]{1,0}, bf16[2,32]{1,0:S(1)}) while(%start), condition=cond, body=body
  start2 = (s32[], f32[2,4]{1,0}) tuple(%zero, %chunks)
  ROOT loss = (s32[], f32[2,4]{1,0}) while(%start2), condition=cond, body=body
}
"""
    module = hlo.parse(text)
    assert layer_loop.layer_loops(module, 2) == ["layers"]
    assert layer_loop.stacked_argument_bytes(module, 2) == 8 * 4
    # The saved activations' stack in HBM counts per layer; the one kept on chip (S(1), VMEM) does not.
    assert layer_loop.stacked_temporary_bytes(module, 2) == 16 * 2
    with hlo.trip_counts({"layers": 5}):
        entry = module.computation(module.entry)
        assert hlo.trip_count(module, entry, entry.by_name["layers"]) == 5
        assert hlo.trip_count(module, entry, entry.by_name["loss"]) == 2
    assert hlo.trip_count(module, entry, entry.by_name["layers"]) == 2
