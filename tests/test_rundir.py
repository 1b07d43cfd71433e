"""scaling/rundir.py: the commit a record is stamped with."""

import subprocess


def test_code_version_marks_modified_code_dirty_but_not_committed_results(tmp_path):
    from scaling import rundir

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
