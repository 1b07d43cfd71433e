"""The TPU cost model is a package of its own (``sweeps/preflight/``) with a public face, and the train
step is lowered ahead of time in one place (``scaling.model.run_program.lower_train_step``)."""

import ast
from pathlib import Path

import pytest

import tiny
from helpers import REPO
from scaling.config import DataConfig, ModelConfig, TrainConfig
from scaling.data import pipeline as data
from scaling.model import program as program_lib, run_program
from scaling.run import train
from sweeps import preflight
COST_PACKAGE = "sweeps.preflight"
# Code that may use only the cost package's public names; benchmarks call no private function at all.
PUBLIC_ONLY = [*sorted((REPO / "scaling").rglob("*.py")), REPO / "tests" / "test_loss.py",
               REPO / "tests" / "test_mesh.py", *sorted((REPO / "benchmarks").glob("*.py"))]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(source: str) -> list[str]:
    """``from sweeps.preflight... import _x``, and ``alias._x`` of a name bound to the cost package or one of
    its modules; in ``benchmarks/`` (``calls=True``) also any ``module._x(...)`` of an imported module."""
    tree = ast.parse(source)
    cost_names, imported = set(), set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                imported.add(alias.asname or alias.name)
                qualified = f"{node.module}.{alias.name}"
                if node.module.startswith(COST_PACKAGE):
                    if _private(alias.name):
                        found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
                    cost_names.add(alias.asname or alias.name)
                elif qualified == COST_PACKAGE:
                    cost_names.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                imported.add(alias.asname or alias.name.split(".")[0])
                if alias.name.startswith(COST_PACKAGE):
                    cost_names.add(alias.asname or alias.name.split(".")[0])
                    if any(_private(part) for part in alias.name.split(".")):
                        found.append(f"line {node.lineno}: import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in cost_names:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def private_calls(source: str) -> list[str]:
    """Calls ``module._x(...)`` of a module or name the file imports."""
    tree = ast.parse(source)
    imported = {alias.asname or alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    return [f"line {node.lineno}: {ast.unparse(node.func)}(...)" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _private(node.func.attr)
            and isinstance(node.func.value, ast.Name) and node.func.value.id in imported]


def test_the_hygiene_check_sees_private_uses():
    # The forms it must catch (today's code had the first and third), and public ones it must leave alone.
    assert private_uses("from sweeps import preflight\npreflight._compile(c, m)\n")
    assert private_uses("from sweeps.preflight.report import _check_one\n")
    assert private_uses("from sweeps.preflight import hlo\nhlo._constant(c, 'x')\n")
    assert private_uses("import sweeps.preflight.roofline\nsweeps.preflight.roofline._x\n")
    assert private_calls("from sweeps import preflight\npreflight._compile(config, mesh)\n")
    assert not private_uses("from sweeps import preflight\npreflight.check_runs([], 'v5e:2x2')\nx._y\n")
    assert not private_calls("self._helper()\nobject.__new__(cls)\n")


@pytest.mark.parametrize("path", PUBLIC_ONLY, ids=lambda path: str(path.relative_to(REPO)))
def test_no_private_name_of_the_cost_package_is_used_outside_it(path):
    source = path.read_text()
    assert private_uses(source) == []
    if path.parent.name == "benchmarks":
        assert private_calls(source) == []


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.update({node.module} | {f"{node.module}.{alias.name}" for alias in node.names})
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_the_cost_package_uses_nothing_of_the_launcher_and_scaling_nothing_of_sweeps():
    for path in sorted((REPO / "sweeps" / "preflight").glob("*.py")):
        foreign = {name for name in _imported_modules(path)
                   if name.startswith("sweeps") and not name.startswith(COST_PACKAGE) and name != "sweeps"}
        assert not foreign, (path.name, foreign)
    for path in sorted((REPO / "scaling").rglob("*.py")):
        assert not {name for name in _imported_modules(path) if name.split(".")[0] == "sweeps"}, path.name


PARITY = TrainConfig(model=ModelConfig(depth=1, width=16, head_dim=16, max_seq_len=40, objective="masked"),
                     data=DataConfig(source="parity", seq_len=40), steps=2, batch_size=8, wandb_mode="disabled")


@pytest.mark.parametrize("config", [tiny.config(), PARITY], ids=["causal", "parity"])
def test_the_lowered_step_is_the_program_the_trainer_builds(config):
    pipeline = data.build(config.data)
    resolved = train.resolve_config(config, pipeline)
    trained = run_program.build([resolved], tiny.one_device())
    program, lowered = run_program.lower_train_step(resolved, trained.mesh)
    program = program.solo
    assert program is trained.solo  # the same shape on the same mesh: the very program, built once
    assert program.shape == preflight.program_key(resolved)[0]
    if config is PARITY:
        assert program.shape.label_ids == tuple(pipeline.LABEL_TOKENS)  # the two-logit loss
    text = lowered.as_text()
    assert "stablehlo" in text and len(lowered.args_info[0]) == 3  # state, batch, hyperparameters
