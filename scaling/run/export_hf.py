"""A trained run as a Hugging Face ``transformers`` model: ``python -m scaling.train export RUN_DIR --to hf DIR``.

The run's newest checkpoint (``scaling.run.restore``) is written to ``DIR`` as
``model.safetensors`` (float32) with the ``config.json`` of the
``transformers`` class that computes the same function:

- ``model.block="gpt"`` -> ``GPT2LMHeadModel``: pre-LayerNorm blocks,
  learned positions, a [d, 3d] fused q/k/v projection and ReLU or GELU
  (``gelu``/``gelu_tanh`` are GPT-2's ``gelu_new``, ``gelu_exact`` is
  ``gelu``). GPT-2 always has biases: a run without them gets zeros.
- ``model.block="llama"`` -> ``LlamaForCausalLM``: RMSNorm, SwiGLU, rotary
  positions in the "rotate half" layout with base 10000, which is Llama's.

A parametrization's multipliers (μP, CompleteP; ``scaling.model.parametrization``)
are constants of the function and are folded into the weights: the
attention multiplier into the query projection, the residual-branch
multiplier into each branch's output projection, the output multiplier into
the unembedding. Only the real vocabulary ids are written (the padding of
the vocabulary axis is dropped). The tokenizer is not exported: ids are the
run's own (``sample`` and ``eval`` decode them).

What neither class computes is refused with one line: post-norm blocks,
log-length attention scaling, sinusoidal or first-position codes in the gpt
block, masked or classification models, and tied embeddings with an output
multiplier. ``safetensors`` and ``transformers`` come with the ``hf`` extra
(``pip install -e ".[hf]"``); ``torch`` is needed only to load the result.
"""

from __future__ import annotations

import json

import numpy as np

from scaling import cli
from scaling.config import CLASSIFICATION_SOURCES, TrainConfig

FORMATS = ("hf",)
_GPT2_ACTIVATIONS = {"relu": "relu", "gelu": "gelu_new", "gelu_tanh": "gelu_new", "gelu_exact": "gelu"}


def check_exportable(config: TrainConfig) -> None:
    """``ValueError`` (one line naming the field) unless GPT-2 or Llama computes this run's model."""
    model = config.model
    problems = []
    if config.data.source in CLASSIFICATION_SOURCES or model.objective != "causal":
        problems.append(f"it is not a causal language model (model.objective={model.objective!r}, "
                        f"data.source={config.data.source!r})")
    if model.norm != "pre":
        problems.append("model.norm='post' (GPT-2 and Llama normalise before each branch)")
    if model.attention_scale != "standard":
        problems.append(f"model.attention_scale={model.attention_scale!r} (GPT-2 and Llama scale logits by a "
                        "constant)")
    if model.block == "gpt" and model.position != "learned":
        problems.append(f"model.position={model.position!r} (GPT-2 learns its position table)")
    if problems:
        raise ValueError("cannot export to transformers: " + "; ".join(problems))


def _multipliers(config: TrainConfig):
    from scaling.model import parametrization

    found = parametrization.multipliers(config.optim, config.model)
    if config.model.tie_embeddings and found.output != 1.0:
        raise ValueError(f"cannot export to transformers: tied embeddings with an output multiplier "
                         f"({found.output:g}, optim.parametrization={config.optim.parametrization!r}) do not "
                         "fold into one table")
    return found


def _layers(params: dict, depth: int) -> tuple[dict, list[dict]]:
    """(every parameter as numpy float32, the layers unstacked; each layer's parameters), whether the run
    scanned its layers or not."""
    import jax

    from scaling.model.transformer import unstack_layers

    params = jax.tree_util.tree_map(lambda leaf: np.asarray(jax.device_get(leaf), np.float32), params)
    if "layers" in params:
        params = unstack_layers(params, depth)
    return params, [params[f"layers_{index}"] for index in range(depth)]


def _bias(module: dict, size: int) -> np.ndarray:
    return module.get("bias", np.zeros(size, np.float32)).reshape(-1)


def gpt2_tensors(config: TrainConfig, params: dict) -> tuple[dict, dict]:
    """(GPT-2 config keywords, state dict as numpy float32) of a gpt-block run."""
    model, scales = config.model, _multipliers(config)
    params, layers = _layers(params, model.depth)
    width, vocab = model.width, model.vocab_size
    embedding = params["token_embedding"]["embedding"][:vocab]
    tensors = {"transformer.wte.weight": embedding, "transformer.wpe.weight": params["position_embedding"],
               "transformer.ln_f.weight": params["final_norm"]["scale"],
               "transformer.ln_f.bias": params["final_norm"]["bias"]}
    for index, layer in enumerate(layers):
        attention, mlp, prefix = layer["attention"], layer["mlp"], f"transformer.h.{index}."
        q, k, v = (attention[name]["kernel"].reshape(width, -1) for name in ("query", "key", "value"))
        qb, kb, vb = (_bias(attention[name], width) for name in ("query", "key", "value"))
        tensors |= {
            prefix + "ln_1.weight": layer["attention_norm"]["scale"],
            prefix + "ln_1.bias": layer["attention_norm"]["bias"],
            prefix + "ln_2.weight": layer["mlp_norm"]["scale"], prefix + "ln_2.bias": layer["mlp_norm"]["bias"],
            prefix + "attn.c_attn.weight": np.concatenate([q * scales.attention, k, v], axis=1),
            prefix + "attn.c_attn.bias": np.concatenate([qb * scales.attention, kb, vb]),
            prefix + "attn.c_proj.weight": attention["out"]["kernel"].reshape(-1, width) * scales.residual,
            prefix + "attn.c_proj.bias": _bias(attention["out"], width) * scales.residual,
            prefix + "mlp.c_fc.weight": mlp["wi"]["kernel"], prefix + "mlp.c_fc.bias": _bias(mlp["wi"], model.ff_width),
            prefix + "mlp.c_proj.weight": mlp["wo"]["kernel"] * scales.residual,
            prefix + "mlp.c_proj.bias": _bias(mlp["wo"], width) * scales.residual}
    tensors["lm_head.weight"] = _unembedding(config, params, scales)
    keywords = dict(vocab_size=vocab, n_positions=model.max_seq_len, n_embd=width, n_layer=model.depth,
                    n_head=model.heads, n_inner=model.ff_width, activation_function=_GPT2_ACTIVATIONS[model.activation],
                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5,
                    tie_word_embeddings=model.tie_embeddings, bos_token_id=None, eos_token_id=None)
    return keywords, tensors


def llama_tensors(config: TrainConfig, params: dict) -> tuple[dict, dict]:
    """(Llama config keywords, state dict as numpy float32) of a llama-block run."""
    from scaling.model.transformer import ROPE_BASE

    model, scales = config.model, _multipliers(config)
    params, layers = _layers(params, model.depth)
    width, vocab = model.width, model.vocab_size
    tensors = {"model.embed_tokens.weight": params["token_embedding"]["embedding"][:vocab],
               "model.norm.weight": params["final_norm"]["scale"]}
    for index, layer in enumerate(layers):
        attention, mlp, prefix = layer["attention"], layer["mlp"], f"model.layers.{index}."
        tensors |= {  # torch's Linear keeps [out, in]; Flax's kernels are [in, out]
            prefix + "input_layernorm.weight": layer["attention_norm"]["scale"],
            prefix + "post_attention_layernorm.weight": layer["mlp_norm"]["scale"],
            prefix + "self_attn.q_proj.weight": attention["query"]["kernel"].reshape(width, -1).T * scales.attention,
            prefix + "self_attn.k_proj.weight": attention["key"]["kernel"].reshape(width, -1).T,
            prefix + "self_attn.v_proj.weight": attention["value"]["kernel"].reshape(width, -1).T,
            prefix + "self_attn.o_proj.weight": attention["out"]["kernel"].reshape(-1, width).T * scales.residual,
            prefix + "mlp.gate_proj.weight": mlp["wi_gate"]["kernel"].T,
            prefix + "mlp.up_proj.weight": mlp["wi"]["kernel"].T,
            prefix + "mlp.down_proj.weight": mlp["wo"]["kernel"].T * scales.residual}
    tensors["lm_head.weight"] = _unembedding(config, params, scales)
    keywords = dict(vocab_size=vocab, hidden_size=width, intermediate_size=model.ff_width,
                    num_hidden_layers=model.depth, num_attention_heads=model.heads,
                    num_key_value_heads=model.heads, head_dim=model.attention_head_dim, hidden_act="silu",
                    max_position_embeddings=model.max_seq_len, rms_norm_eps=1e-5,
                    rope_parameters={"rope_type": "default", "rope_theta": ROPE_BASE}, attention_bias=False,
                    mlp_bias=False, tie_word_embeddings=model.tie_embeddings, bos_token_id=None,
                    eos_token_id=None, pad_token_id=None)
    return keywords, tensors


def _unembedding(config: TrainConfig, params: dict, scales) -> np.ndarray:
    """The output projection as [vocab, width] (real ids only), the output multiplier folded in."""
    vocab = config.model.vocab_size
    if config.model.tie_embeddings:
        return params["token_embedding"]["embedding"][:vocab]
    return params["unembedding"]["kernel"][:, :vocab].T * scales.output


def export(run, out_dir) -> list[str]:
    """Write ``run`` (a ``scaling.run.restore.TrainedRun``) to ``out_dir`` as a ``transformers`` model; returns
    the files written. ``ValueError`` for a model neither GPT-2 nor Llama computes."""
    from etils import epath

    check_exportable(run.config)
    try:
        import transformers
        from safetensors.numpy import save_file
    except ImportError as error:
        raise ValueError(f"export needs the hf extra ({error.name} is missing): "
                         "python3 -m pip install -e \".[hf]\"") from None
    llama = run.config.model.block == "llama"
    keywords, tensors = (llama_tensors if llama else gpt2_tensors)(run.config, run.params)
    if run.config.model.tie_embeddings:
        tensors.pop("lm_head.weight")  # transformers ties it to the embedding itself
    config_class = transformers.LlamaConfig if llama else transformers.GPT2Config
    hf_config = config_class(**keywords, architectures=["LlamaForCausalLM" if llama else "GPT2LMHeadModel"])
    out = epath.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf_config.save_pretrained(str(out))
    save_file({name: np.ascontiguousarray(value, np.float32) for name, value in tensors.items()},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    provenance = {"run_dir": str(run.run_dir), "step": run.step, "tokenizer": run.config.data.tokenizer,
                  "special_ids": {"pad": run.pad_id, "eos": run.eos_id, "mask": run.mask_id, "cls": run.cls_id}}
    (out / "scaling_export.json").write_text(json.dumps(provenance, indent=2) + "\n")
    return [str(out / name) for name in ("config.json", "model.safetensors", "scaling_export.json")]


def project_logits(run, tokens: np.ndarray) -> np.ndarray:
    """The project's own float32 logits [batch, length, vocab] of ``run`` on ``tokens`` [batch, length]."""
    import dataclasses

    import jax

    from scaling.model import parametrization
    from scaling.model.transformer import Transformer

    model_config = dataclasses.replace(run.config.model, attention_impl="xla", dropout=0.0)
    model = Transformer(model_config, multipliers=parametrization.multipliers(run.config.optim, run.config.model))
    params = jax.device_get(run.params)
    return np.asarray(model.apply({"params": params}, np.asarray(tokens, np.int32)))


# ---------------------------------------------------------------------------
# Command line


def parser(prog: str):
    """The ``export`` command's parser (``prog``: how the user started it)."""
    result = cli.Parser(prog=prog, description="Write a run's newest checkpoint as a Hugging Face transformers "
                        "model: model.safetensors and a GPT-2 (block gpt) or Llama (block llama) config.json.",
                        epilog=f"Example: {prog} runs/tiny --to hf exported/tiny; then in Python: "
                               "transformers.AutoModelForCausalLM.from_pretrained('exported/tiny')")
    result.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (local or gs://), or a sweep's run by "
                        "its name, e.g. runs/smoke/L1-d128-s0")
    result.add_argument("--to", required=True, choices=FORMATS, help="the format: hf (Hugging Face transformers)")
    result.add_argument("out_dir", metavar="DIR", help="folder to write the model into (made if missing)")
    return result


def main(argv=None, prog: str = "python -m scaling.train export") -> int:
    """Entry point of ``export``: writes the model and names its files; 2 with one line for unusable input."""
    return cli.run_dir_command(parser(prog), argv, _export)


def _export(args) -> int:
    from scaling.run.restore import load_run, read_config

    check_exportable(read_config(args.run_dir))  # before reading any checkpoint
    run = load_run(args.run_dir)
    files = export(run, args.out_dir)
    print(f"exported {run.run_dir} (step {run.step}) as {'Llama' if run.config.model.block == 'llama' else 'GPT-2'} "
          f"to {args.out_dir}: {', '.join(f.rsplit('/', 1)[-1] for f in files)}")
    return 0
