"""Run directories (scaling/store/rundir.py): one that holds a finished run refuses another config; the commit
a record is stamped with."""

import json
import shutil
import subprocess

import helpers
import tiny
from scaling.config import to_dict


def test_a_finished_run_dir_refuses_another_config(tmp_path, tiny_reference):
    shutil.copytree(tiny_reference[0], tmp_path / "run")  # a finished run of tiny.config()
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(to_dict(tiny.config())))
    other = helpers.run_module("scaling.train", "--config", config_file, "--workdir", "run", "--no-progress", "--set",
                               "model.depth=2", cwd=tmp_path, env=tiny.env())
    assert other.returncode == 2
    assert other.stderr.strip().count("\n") == 0 and "holds run" in other.stderr, other.stderr


def test_code_version_marks_modified_code_dirty_but_not_committed_results(tmp_path):
    from scaling.store import rundir

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "pkg").mkdir()
    (tmp_path / "results").mkdir()
    (tmp_path / "pkg" / "code.py").write_text("x = 1\n")
    (tmp_path / "results" / "sweep.json").write_text("{}\n")
    git("init", "-q")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "empty")
    git("add", ".")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "tree")
    clean = rundir.code_version(tmp_path / "pkg")
    assert len(clean) == 12 and "+" not in clean
    (tmp_path / "results" / "sweep.json").write_text('{"rewritten": true}\n')  # the launcher's own output
    assert rundir.code_version(tmp_path / "pkg") == clean
    (tmp_path / "pkg" / "code.py").write_text("x = 2\n")
    assert rundir.code_version(tmp_path / "pkg") == clean + "+dirty"
