"""The CPU benchmarks: the throughput one runs the trainer as the command lines do (glibc's allocator tuned
before JAX starts), and the step profile sorts a compiled step's ops by kind, pass and model part."""

import json
import os
import sys

import helpers
from helpers import REPO


def test_throughput_benchmark_tunes_the_allocator_like_the_command_lines():
    # (scaling.cpu_allocator decides; SCALING_MALLOC_TUNING=0 would switch it off.)
    env = {key: value for key, value in os.environ.items() if key not in ("JAX_PLATFORMS", "SCALING_MALLOC_TUNING")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "benchmarks"), env.get("PYTHONPATH", "")])
    code = "import throughput; print(throughput.MALLOC_TUNED)"
    out = helpers.run_python(code, env=env, check=True).stdout
    assert out.strip().splitlines()[-1] == "True"


def test_step_profile_sorts_a_compiled_steps_ops_by_kind_and_pass():
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, str(REPO / "benchmarks"))
    import step_profile

    def step(weights, inputs):
        def loss(weights):
            return jnp.sum(jnp.tanh(inputs @ weights) ** 2)

        gradient = jax.grad(loss)(weights)
        return weights - 0.1 * gradient / (jnp.sqrt(jnp.sum(gradient**2)) + 1.0)

    text = jax.jit(step).lower(jnp.ones((32, 16)), jnp.ones((8, 32))).compile().as_text()
    ops = step_profile.hlo_ops(text)
    kinds = {(kind, phase) for kind, phase, _, _ in ops.values()}
    # the forward dot, its transpose in the backward pass, and the optimizer's norm and update
    assert {("matmul", "forward"), ("matmul", "backward"), ("reduce", "optimizer"),
            ("elementwise", "optimizer")} <= kinds, kinds
    assert all(kind in (*step_profile.KINDS, "control") and phase in step_profile.PASSES for kind, phase in kinds)


def test_step_profile_names_the_model_part_of_a_matrix_product():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import step_profile

    part = step_profile.model_part
    assert part("jit(train_step)/transpose(jvp(Transformer))/layers_2/mlp/wo/dot_general") == "mlp out"
    assert part("jit(train_step)/jvp(Transformer)/layers_0/mlp/wi/dot_general") == "mlp in"
    assert part("jit(train_step)/jvp(Transformer)/layers_3/attention/key/dot_general") == "attention q/k/v"
    assert part("jit(train_step)/jvp(Transformer)/layers_3/attention/out/dot_general") == "attention out"
    assert part("jit(train_step)/jvp(Transformer)/layers_1/attention/bqhd,bkhd->bhqk/dot_general") == \
        "attention scores+mix"
    assert part("jit(train_step)/transpose(jvp())/dot_general") == "embedding+loss"


def test_tpu_compile_flags_sums_libtpus_stage_timings_keeping_the_last_cumulative_report():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import tpu_compile_flags

    log = "\n".join([
        "I1124 15:04:19.5 1 deepsea_compiler_hlo_passes.cc:6241] HLO_PASSES stage duration: 1.2s",
        "I1124 15:04:20.2 1 deepsea_compiler_backend.cc:3422] XLA::TPU LLO dependency graph-based optimizations "
        "and scheduling time: 2.23 ms (2232 us) (cumulative: 3.21 ms, max: 2.23 ms, #called: 2)",
        "I1124 15:04:20.1 1 deepsea_compiler_base.cc:1290] XLA::TPU memory space and buffer assignment time: "
        "272 ms (272129 us) (cumulative: 272 ms, max: 272 ms, #called: 1)",
        "I1124 15:04:49.9 1 deepsea_compiler_backend.cc:3422] XLA::TPU LLO dependency graph-based optimizations "
        "and scheduling time: 20 us (20 us) (cumulative: 15.2 s, max: 1.3 s, #called: 217)",
        "I1124 15:04:50.0 1 deepsea_compiler_base.cc:3612] XLA::TPU run backend time: 29.2 s (29209199 us) "
        "(cumulative: 29.2 s, max: 29.2 s, #called: 1)",
    ])
    stages = tpu_compile_flags.stage_seconds(log)
    assert stages == {"XLA::TPU LLO dependency graph-based optimizations and scheduling": (15.2, 217),
                      "XLA::TPU memory space and buffer assignment": (0.272, 1),
                      "XLA::TPU run backend": (29.2, 1)}


def test_cpu_info_reads_the_model_and_the_avx512_bf16_and_amx_flags(tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks"))
    import cpu_info

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C\n"
                       "flags\t\t: fpu sse avx2 fma avx512f avx512_bf16 amx_bf16 amx_tile\n\n"
                       "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C\nflags\t\t: fpu\n")
    info = cpu_info.describe(str(cpuinfo))
    assert info["model"] == "Intel(R) Xeon(R) Platinum 8481C"
    assert info["flags"]["avx512f"] and info["flags"]["avx512_bf16"] and info["flags"]["amx_tile"]
    assert not info["flags"]["avx512_vnni"] and not info["flags"]["amx_int8"]
    assert "AVX-512 yes, AVX-512-BF16 yes, AMX yes" in info["summary"]
    cpuinfo.write_text("model name\t: AMD EPYC\nflags\t\t: avx2 fma avx512f\n")
    assert "AVX-512 yes, AVX-512-BF16 no, AMX no" in cpu_info.describe(str(cpuinfo))["summary"]
    assert cpu_info.describe(str(tmp_path / "missing"))["flags"] is None


def test_throughput_records_the_cpu_beside_every_figure(monkeypatch, capsys):
    sys.path.insert(0, str(REPO / "benchmarks"))
    import throughput

    # main() with the measurements replaced by fixed rows: what it prints must name the CPU
    row = {"depth": 2, "width": 64, "scan_layers": False, "tokens_per_second": 1000.0, "useful_flops_per_second": 1e9,
           "full_flops_per_second": 2e9, "other_processes_cores": 0.0, "matmul_peak_flops": 1e11}
    monkeypatch.setattr(throughput, "matmul_peak_flops", lambda: 1e11)
    monkeypatch.setattr(throughput, "measure", lambda *args: dict(row))
    fake_cpu = {"model": "Test CPU 9000", "summary": "Test CPU 9000 (x)"}
    monkeypatch.setattr(throughput.cpu_info, "describe", lambda: fake_cpu)
    for output in ("--json", None):
        monkeypatch.setattr(sys, "argv", ["throughput.py", "--configs", "2x64", "4x128", *([output] if output else [])])
        throughput.main()
        printed = capsys.readouterr().out
        if output:
            assert [r["cpu"]["model"] for r in json.loads(printed)] == ["Test CPU 9000"] * 2
        else:
            assert "CPU: Test CPU 9000 (x)" in printed


def test_cpu_bf16_tells_a_bf16_product_from_one_converted_to_float32():
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, str(REPO / "benchmarks"))
    import cpu_bf16

    left, right = jnp.ones((64, 32), jnp.bfloat16), jnp.ones((32, 16), jnp.bfloat16)
    upcast = jax.jit(lambda a, b: a.astype(jnp.float32) @ b.astype(jnp.float32)).lower(left, right).compile()
    assert not cpu_bf16.dots_multiply_bf16(upcast.as_text())
    # what a CPU with bf16 products would compile to: the dot reads the bf16 parameters themselves
    kept = ("HloModule m\n\nENTRY %main (a: bf16[64,32], b: bf16[32,16]) -> f32[64,16] {\n"
            "  %a = bf16[64,32]{1,0} parameter(0)\n  %b = bf16[32,16]{1,0} parameter(1)\n"
            "  ROOT %dot = f32[64,16]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n")
    assert cpu_bf16.dots_multiply_bf16(kept)
    assert not cpu_bf16.dots_multiply_bf16(kept.replace("dot(", "add("))  # no dot at all


def test_step_profile_splits_a_step_into_the_parts_both_frameworks_are_compared_by():
    import types

    sys.path.insert(0, str(REPO / "benchmarks"))
    import step_profile

    category = step_profile.category
    assert category("matmul", "backward", "jit(train_step)/transpose(jvp(Transformer))/layers_0/mlp/wi/dot_general") \
        == "matmuls"
    assert category("matmul", "forward", "jit(train_step)/jvp(Transformer)/layers_0/attention/query/dot_general") \
        == "matmuls"
    assert category("reduce", "forward", "jit(train_step)/jvp(Transformer)/layers_0/attention/reduce_max") \
        == "attention"
    assert category("reduce", "forward", "jit(train_step)/jvp(Transformer)/layers_0/attention_norm/reduce_sum") \
        == "elementwise+layernorm"
    assert category("elementwise", "optimizer", "jit(train_step)/mul") == "optimizer update"
    # overlapping ops on two threads: [0, 10) and [5, 20) and [30, 40) µs are busy for 30 µs
    assert step_profile.busy_ms([{"ts": 0, "dur": 10}, {"ts": 5, "dur": 15}, {"ts": 30, "dur": 10}]) == 0.030

    def event(name, parent=None):
        return types.SimpleNamespace(name=name, cpu_parent=parent)

    step = event("peer.optimizer")
    adamw = event("Optimizer.step#AdamW.step", step)
    assert step_profile.peer_category(event("aten::mul_", adamw)) == "optimizer update"
    flash = event("autograd::engine::evaluate_function: ScaledDotProductFlashAttentionForCpuBackward0")
    assert step_profile.peer_category(event("aten::_scaled_dot_product_flash_attention_for_cpu_backward", flash)) \
        == "attention"
    assert step_profile.peer_category(event("aten::mm", event("aten::linear"))) == "matmuls"
    assert step_profile.peer_category(event("aten::native_layer_norm")) == "elementwise+layernorm"
    assert step_profile.peer_category(flash) == "host"


def test_step_profile_gives_a_fusion_without_metadata_its_operands_jax_name():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import step_profile

    # XLA:CPU's attention einsum fusions carry no op_name; they must not count as the optimizer's
    text = """HloModule m

%fused_computation (param_0: f32[4,8], param_1: f32[8,4]) -> f32[4,4] {
  %param_0 = f32[4,8]{1,0} parameter(0)
  %param_1 = f32[8,4]{1,0} parameter(1)
  ROOT %dot.1 = f32[4,4]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (q: f32[4,8], k: f32[8,4]) -> f32[4,4] {
  %q = f32[4,8]{1,0} parameter(0)
  %k = f32[8,4]{1,0} parameter(1)
  %copy.1 = f32[4,8]{1,0} copy(%q), metadata={op_name="jit(train_step)/jvp(Transformer)/layers_0/attention/transpose"}
  ROOT %ynn_fusion.1 = f32[4,4]{1,0} fusion(%copy.1, %k), kind=kCustom, calls=%fused_computation
}
"""
    ops = step_profile.hlo_ops(text)
    assert ops["ynn_fusion.1"] == ("matmul", "forward", "attention scores+mix", "attention")
