"""Text from a trained run: ``python -m scaling.train sample RUN_DIR --prompt ...``.

The run's newest checkpoint is read back onto this machine's devices
(``scaling.run.restore``) and continues the prompt for exactly
``--max-new-tokens`` tokens, one at a time:

- greedy (``--greedy``, or ``--temperature 0``): the most likely token;
- sampled: from softmax(logits / temperature), optionally from the ``--top-k``
  most likely tokens only, with the random key ``--seed`` (the same seed,
  prompt and settings give the same text on the same machine).

The text is printed as it is made, ``CHUNK_TOKENS`` tokens at a time (the
same tokens as made at once). The context is the last ``model.max_seq_len``
tokens (the positions the model learned); a longer text slides that window,
and the command says so. Each new token runs the model over the whole context again
(no key-value cache): simple, and fast enough for the small models of this
project. The end-of-document token may be generated (it is printed as a
blank line, the break between documents); the other special tokens (pad,
mask, cls) never are. An empty prompt starts a new document (the context is
one end-of-document token). Only causal language models can be sampled.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys

import numpy as np

from scaling import cli
from scaling.config import CLASSIFICATION_SOURCES, ModelConfig

DOCUMENT_BREAK = "\n\n"  # how a generated end-of-document token is shown


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How each new token is chosen: ``temperature`` 0 is greedy; ``top_k`` None samples from every token.
    Validated on construction (errors name the field)."""

    max_new_tokens: int = 200
    temperature: float = 1.0
    top_k: int | None = None
    seed: int = 0

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} is invalid: allowed 1 or more")
        if not self.temperature >= 0:
            raise ValueError(f"temperature={self.temperature} is invalid: allowed 0 (greedy) or more")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k={self.top_k} is invalid: allowed 1 or more (or unset for every token)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def check_samplable(config) -> None:
    """``ValueError`` (one line) unless the run is a causal language model."""
    if config.data.source in CLASSIFICATION_SOURCES:
        raise ValueError(f"the run learned the {config.data.source} classification task; only language models "
                         "can be sampled")
    if config.model.objective != "causal":
        raise ValueError(f"the run is a masked LM (model.objective={config.model.objective!r}); only causal "
                         "language models can be sampled")


@functools.lru_cache(maxsize=8)
def _sampler(model_config: ModelConfig, window: int, new_tokens: int, greedy: bool, top_k: int | None,
             banned: tuple[int, ...], multipliers=None):
    """A jitted ``(params, context [window], length, temperature, key, start) -> (context, length, new tokens
    [new_tokens])``: ``new_tokens`` more tokens, the i-th drawn with the key folded with ``start + i``, so
    that a text made a chunk at a time is the text made at once."""
    import jax
    import jax.numpy as jnp

    from scaling.model.transformer import Transformer

    # The run's parametrization's multipliers (μP, CompleteP) are part of the function it learned.
    model = Transformer(model_config) if multipliers is None else Transformer(model_config, multipliers=multipliers)

    def sample(params, context, length, temperature, key, start):
        def step(index, carry):
            context, length, new = carry
            logits = model.apply({"params": params}, context[None])[0, jnp.minimum(length, window) - 1]
            logits = logits.at[jnp.asarray(banned)].set(-jnp.inf)
            if greedy:
                token = jnp.argmax(logits)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = jax.lax.top_k(logits, top_k)[0][-1]
                    logits = jnp.where(logits < kth, -jnp.inf, logits)
                token = jax.random.categorical(jax.random.fold_in(key, start + index), logits)
            token = token.astype(context.dtype)
            # A full context drops its oldest token; the new one goes after the last.
            context = jnp.where(length >= window, jnp.roll(context, -1), context)
            context = context.at[jnp.minimum(length, window - 1)].set(token)
            return context, length + 1, new.at[index].set(token)

        new = jnp.zeros((new_tokens,), context.dtype)
        return jax.lax.fori_loop(0, new_tokens, step, (context, length, new))

    return jax.jit(sample)


CHUNK_TOKENS = 32  # tokens per compiled call when streaming: text appears as it is made


def generate_chunks(run, prompt_ids, sampling: Sampling, chunk: int = CHUNK_TOKENS):
    """Yield the ``sampling.max_new_tokens`` token ids continuing ``prompt_ids`` (a non-empty sequence of
    ids) from ``run`` (a ``scaling.run.restore.TrainedRun`` of a causal LM), ``chunk`` at a time (the last one
    shorter); together they are exactly ``generate``'s tokens."""
    import jax

    from scaling.model import mesh as mesh_lib, parametrization

    check_samplable(run.config)
    prompt_ids = np.asarray(prompt_ids, np.int32)
    if prompt_ids.size == 0:
        raise ValueError("the prompt has no tokens; pass at least one (an empty text prompt becomes one "
                         "end-of-document token)")
    window = run.config.model.max_seq_len
    kept = prompt_ids[-window:]
    context = np.full(window, run.pad_id, np.int32)
    context[:len(kept)] = kept
    if sampling.top_k is not None and sampling.top_k > run.vocab_size:
        raise ValueError(f"top_k={sampling.top_k} is invalid: allowed 1 to the vocabulary's {run.vocab_size}")
    # The same function as the run's attention either way; the XLA one runs on any length and device.
    model_config = dataclasses.replace(run.config.model, attention_impl="xla", dropout=0.0)
    size = min(chunk, sampling.max_new_tokens)  # one compiled size; the last chunk's extra tokens are dropped
    sampler = _sampler(model_config, window, size, sampling.greedy, sampling.top_k,
                       (run.pad_id, run.mask_id, run.cls_id),
                       parametrization.multipliers(run.config.optim, run.config.model))
    replicated = mesh_lib.replicated(run.program.mesh)
    state = (jax.device_put(context, replicated), jax.device_put(np.int32(len(kept)), replicated))
    temperature = jax.device_put(np.float32(sampling.temperature or 1.0), replicated)
    key = jax.device_put(jax.random.PRNGKey(sampling.seed), replicated)
    for start in range(0, sampling.max_new_tokens, size):
        *state, new = sampler(run.params, *state, temperature, key, jax.device_put(np.int32(start), replicated))
        yield np.asarray(jax.device_get(new))[:sampling.max_new_tokens - start]


def generate(run, prompt_ids, sampling: Sampling) -> np.ndarray:
    """``sampling.max_new_tokens`` token ids continuing ``prompt_ids`` (a non-empty sequence of ids), from
    ``run`` (a ``scaling.run.restore.TrainedRun`` of a causal LM)."""
    return np.concatenate(list(generate_chunks(run, prompt_ids, sampling)))


def encode_prompt(run, prompt: str) -> np.ndarray:
    """The prompt's token ids, or one end-of-document token for an empty prompt (a new document)."""
    ids = run.tokenizer.encode(prompt) if prompt else np.zeros(0, np.int32)
    return ids if ids.size else np.array([run.eos_id], np.int32)


def decode(run, ids) -> str:
    """Text of generated ids: ordinary tokens through the tokenizer, end-of-document tokens as a blank line."""
    pieces, current = [], []
    for token in np.asarray(ids).tolist():
        if token < run.tokenizer.base_vocab_size:
            current.append(token)
            continue
        pieces.append(run.tokenizer.decode(current) if current else "")
        current = []
        if token == run.eos_id:
            pieces.append(DOCUMENT_BREAK)
    if current:
        pieces.append(run.tokenizer.decode(current))
    return "".join(pieces)


# ---------------------------------------------------------------------------
# Command line


def parser(prog: str):
    """The ``sample`` command's parser (``prog``: how the user started it)."""
    result = cli.Parser(prog=prog, description="Continue a prompt with a run's newest checkpoint: greedy, or "
                        "sampled with a temperature and top-k from a seed.",
                        epilog="Example: python -m scaling.train sample runs/tiny --prompt 'The module' "
                               "--max-new-tokens 100 --temperature 0.8 --top-k 20 --seed 1")
    result.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (local or gs://) holding config.json "
                        "and checkpoints/")
    result.add_argument("--prompt", default="", help="text to continue (default: none, a new document)")
    result.add_argument("--max-new-tokens", type=cli.positive_int, default=200,
                        help="tokens to generate (200); printed as they are made. Past the model's context "
                             "(model.max_seq_len) it sees only the last tokens")
    choice = result.add_mutually_exclusive_group()
    choice.add_argument("--greedy", action="store_true", help="always the most likely token (same as "
                                                              "--temperature 0)")
    choice.add_argument("--temperature", type=float, default=1.0,
                        help="divide the logits by this before sampling; 0 is greedy (1.0)")
    result.add_argument("--top-k", type=cli.positive_int, help="sample from the K most likely tokens only (default: all)")
    result.add_argument("--seed", type=int, default=0, help="random seed of the sampling (0)")
    result.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="choose the mesh the run is read onto, e.g. mesh.fsdp=2 (repeatable)")
    result.add_argument("--json", action="store_true", help="print one JSON object (prompt, completion, token ids)")
    return result


def main(argv=None, prog: str = "python -m scaling.train sample") -> int:
    """Entry point of ``sample``: prints the prompt and its continuation; 2 with one line for unusable input."""
    return cli.run_dir_command(parser(prog), argv, _sample)


def _sample(args) -> int:
    from scaling.run.restore import load_run, read_config

    sampling = Sampling(args.max_new_tokens, 0.0 if args.greedy else args.temperature, args.top_k, args.seed)
    check_samplable(read_config(args.run_dir))  # before reading any checkpoint
    run = load_run(args.run_dir, overrides=tuple(args.overrides))
    prompt_ids = encode_prompt(run, args.prompt)
    window = run.config.model.max_seq_len
    if len(prompt_ids) + sampling.max_new_tokens > window:
        print(f"note: the model sees the last {window} tokens (model.max_seq_len); past that the window slides "
              "and the text forgets its beginning", file=sys.stderr)
    if args.json:
        new = generate(run, prompt_ids, sampling)
        print(json.dumps({"run_dir": str(run.run_dir), "step": run.step, "prompt": args.prompt,
                          "completion": decode(run, new), "new_tokens": new.tolist(),
                          **dataclasses.asdict(sampling)}))
        return 0
    _stream(run, args.prompt, generate_chunks(run, prompt_ids, sampling))
    return 0


def _stream(run, prompt: str, chunks) -> None:
    """Print the prompt, then the text of each chunk as it comes. A character whose bytes are split between
    chunks is held back until it is whole (the byte tokenizer decodes a partial one as U+FFFD)."""
    print(prompt, end="", flush=True)
    ids, shown = [], 0
    for chunk in chunks:
        ids += chunk.tolist()
        text = decode(run, ids)
        whole = len(text.rstrip("\ufffd"))
        print(text[shown:whole], end="", flush=True)
        shown = whole
    print(decode(run, ids)[shown:], flush=True)
