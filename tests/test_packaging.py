"""The files people look for: licence, citation, changelog, type markers, console scripts."""

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_license_is_the_full_text_pyproject_names():
    assert PYPROJECT["project"]["license"]["text"] == "Apache-2.0"
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text and "END OF TERMS AND CONDITIONS" in text


def test_citation_names_this_version_and_both_papers():
    import yaml

    citation = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert citation["cff-version"] == "1.2.0" and citation["license"] == "Apache-2.0"
    assert citation["version"] == PYPROJECT["project"]["version"]
    titles = {reference["title"] for reference in citation["references"]}
    assert {"Limits to Depth-Efficiencies of Self-Attention", "Overcoming a Theoretical Limitation of Self-Attention"} == titles
    readme = (REPO / "README.md").read_text()
    assert readme.count("@inproceedings{") >= 2  # the BibTeX of both papers


def test_changelog_tells_the_current_version():
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert f"## {PYPROJECT['project']['version']} " in changelog


@pytest.mark.parametrize("package", ["scaling", "sweeps", "analysis"])
def test_packages_are_typed(package):
    assert (REPO / package / "py.typed").exists()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"][package]


@pytest.mark.parametrize("name, target", sorted(PYPROJECT["project"]["scripts"].items()))
def test_console_scripts_start_their_command_under_their_own_name(name, target):
    assert name.startswith("depth-width-")
    module, function = target.split(":")
    assert callable(getattr(importlib.import_module(module), function))
    code = f"import sys; sys.argv[0] = {name!r}; from {module} import {function}; sys.exit({function}(['--help']))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {name} "), done.stdout[:200]


def test_the_notebooks_extra_brings_jupyterlab():
    assert any(requirement.startswith("jupyterlab") for requirement in PYPROJECT["project"]["optional-dependencies"]["notebooks"])
