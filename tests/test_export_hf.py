"""``export RUN_DIR --to hf DIR`` (scaling/run/export_hf.py): the model loads in Hugging Face ``transformers``
and gives the project's own logits on the same tokens.

Tolerance: float32 on CPU, the largest absolute difference of the logits below 1e-4 (they differ only in
summation order: fused vs separate q/k/v products, softmax implementations). These tests need the ``hf``
extra (``pip install -e ".[hf]"``: transformers, safetensors and torch); without it they skip, and under
``SCALING_REQUIRE_HF=1`` (which .ci/run sets) a missing extra fails instead.
"""

import dataclasses
import importlib.util
import json
import os

import jax
import numpy as np
import pytest

import tiny
from scaling.config import to_dict
import scaling.train as train_command
from scaling.run import export_hf
from scaling.run.restore import load_run

TOLERANCE = 1e-4  # largest |logit difference|, float32


def _require_hf():
    missing = [name for name in ("transformers", "safetensors", "torch") if importlib.util.find_spec(name) is None]
    if missing:
        message = f'needs the hf extra ({", ".join(missing)} missing): pip install -e ".[hf]"'
        if os.environ.get("SCALING_REQUIRE_HF") == "1":
            pytest.fail(message + " (SCALING_REQUIRE_HF=1)")
        pytest.skip(message)


@pytest.fixture(autouse=True)
def hf_extra(monkeypatch):
    monkeypatch.setenv("SCALING_MALLOC_TUNING", "0")


def command(capsys, *argv):
    try:
        status = train_command.main([str(a) for a in argv])
    except SystemExit as exit:
        status = exit.code
    out, err = capsys.readouterr()
    return status, out, err


def hf_logits(directory, tokens: np.ndarray) -> np.ndarray:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        return model(torch.as_tensor(tokens, dtype=torch.long)).logits.numpy()


def tokens_for(config, batch=2, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, config.model.vocab_size, (batch, config.model.max_seq_len))


def test_a_trained_run_exports_and_gives_the_same_logits(tiny_reference, tmp_path, capsys):
    _require_hf()
    run_dir, _ = tiny_reference
    status, out, err = command(capsys, "export", run_dir, "--to", "hf", tmp_path / "hf")
    assert status == 0, err
    assert "as GPT-2" in out and "model.safetensors" in out
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "gpt2"
    run = load_run(run_dir)
    tokens = tokens_for(run.config)
    difference = np.abs(hf_logits(tmp_path / "hf", tokens) - export_hf.project_logits(run, tokens)).max()
    assert difference < TOLERANCE


@dataclasses.dataclass
class RandomRun:
    """What ``export`` reads of a ``TrainedRun``, with every parameter drawn at random (biases and norms
    included, so a misplaced or transposed tensor cannot hide behind a zero or a one)."""

    config: object
    params: dict
    run_dir: str = "random"
    step: int = 0
    pad_id: int = 256
    eos_id: int = 257
    mask_id: int = 258
    cls_id: int = 259


def random_run(**model_changes) -> RandomRun:
    from scaling.model import parametrization
    from scaling.model.transformer import Transformer

    base = tiny.config()
    optim = dataclasses.replace(base.optim, parametrization=model_changes.pop("parametrization", "standard"))
    config = dataclasses.replace(base, optim=optim, model=dataclasses.replace(
        base.model, **{"vocab_size": 260, "width": 32, "head_dim": 8, "depth": 2, **model_changes}))
    model = Transformer(config.model, multipliers=parametrization.multipliers(config.optim, config.model))
    params = model.init(jax.random.PRNGKey(0), np.zeros((1, config.model.max_seq_len), np.int32))["params"]
    params = jax.tree_util.tree_map(lambda leaf: getattr(leaf, "value", leaf), params,
                                    is_leaf=lambda leaf: hasattr(leaf, "value"))
    leaves, tree = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
    leaves = [leaf + 0.3 * jax.random.normal(key, leaf.shape) for leaf, key in zip(leaves, keys)]
    return RandomRun(config, jax.tree_util.tree_unflatten(tree, leaves))


@pytest.mark.parametrize("changes, model_type", [
    ({"block": "llama"}, "llama"),
    ({"block": "llama", "parametrization": "completep"}, "llama"),
    ({"block": "llama", "tie_embeddings": True}, "llama"),
    ({"use_bias": True, "activation": "gelu_exact", "scan_layers": False}, "gpt2"),
    ({"use_bias": True, "activation": "gelu", "parametrization": "mup"}, "gpt2"),
    ({"tie_embeddings": True}, "gpt2"),
])
def test_each_architecture_gives_the_projects_logits(tmp_path, changes, model_type):
    _require_hf()
    run = random_run(**changes)
    export_hf.export(run, tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == model_type
    tokens = tokens_for(run.config)
    project = export_hf.project_logits(run, tokens)
    assert np.abs(hf_logits(tmp_path / "hf", tokens) - project).max() < TOLERANCE * max(1.0, np.abs(project).max())


@pytest.mark.parametrize("change, named", [
    ("model.norm=post", "model.norm='post'"),
    ("model.attention_scale=log_length", "model.attention_scale='log_length'"),
    ("model.position=sinusoidal", "model.position='sinusoidal'"),
    ("model.objective=masked", "not a causal language model"),
])
def test_what_transformers_cannot_compute_is_refused_in_one_line(tmp_path, capsys, change, named):
    from scaling.overrides import override

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(to_dict(override(tiny.config(), [change]))))
    status, out, err = command(capsys, "export", run_dir, "--to", "hf", tmp_path / "hf")
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "cannot export to transformers" in err and named in err
    assert not (tmp_path / "hf").exists()


def test_tied_embeddings_with_an_output_multiplier_are_refused(tmp_path):
    _require_hf()
    run = random_run(tie_embeddings=True, parametrization="mup")
    with pytest.raises(ValueError, match="tied embeddings with an output multiplier"):
        export_hf.export(run, tmp_path / "hf")


def test_the_docs_export_block_runs(tiny_reference, tmp_path):
    """docs/training.md's export commands, as written, on a copy of a trained run at runs/tiny."""
    import re
    import shutil
    import subprocess
    import sys

    from helpers import REPO

    _require_hf()
    page = (REPO / "docs" / "training.md").read_text()
    block = re.search(r"## Export to Hugging Face.*?```bash\n(.*?)```", page, flags=re.S).group(1)
    commands = [line for line in block.splitlines() if line.strip() and "pip install" not in line]
    assert len(commands) == 2
    shutil.copytree(tiny_reference[0], tmp_path / "runs" / "tiny")
    for command in commands:
        done = subprocess.run(command.replace("python3 ", f"{sys.executable} ", 1), shell=True, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])})
        assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("gpt2 ")
