"""Python files a user writes (a trainer ``--config FILE.py``, a sweep file) load through one loader
(scaling/python_file.py) and fail the same way: one line naming the file, never a traceback."""

import pytest

from scaling import python_file, train as train_cli
from scaling.config import TrainConfig
from sweeps import spec


def test_a_config_file_gives_its_config(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("from scaling.config import TrainConfig\n\ndef config():\n    return TrainConfig(steps=7)\n")
    assert train_cli.load_config(str(path)) == TrainConfig(steps=7)


@pytest.mark.parametrize("body, message", [
    ("def config():\n    raise RuntimeError('no data\\nsecond line')\n", "RuntimeError: no data"),
    ("def config():\n    return 42\n", "config() gave a int, not a scaling.config.TrainConfig"),
    ("X = 1\n", "defines no config()"),
])
def test_a_bad_config_file_is_one_line_from_the_trainer(tmp_path, capsys, body, message):
    path = tmp_path / "bad.py"
    path.write_text(body)
    assert train_cli.main(["--config", str(path), "--workdir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and f"--config {path}" in err, err


def test_sweep_files_and_config_files_fail_alike(tmp_path):
    path = tmp_path / "raising.py"
    path.write_text("raise KeyError('grid')\n")
    with pytest.raises(python_file.PythonFileError) as as_sweep:
        spec.load_sweep(path)
    with pytest.raises(python_file.PythonFileError) as as_config:
        train_cli.load_config(str(path))
    assert str(as_sweep.value) == f"sweep file {path}: KeyError: 'grid'"
    assert str(as_config.value) == f"--config {path}: KeyError: 'grid'"
