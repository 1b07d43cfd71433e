"""The one storage layer (scaling/store/storage.py): remote paths, atomic writes, listings and byte ranges,
locally and against the Cloud Storage emulator."""

import pathlib

import pytest
from etils import epath

from scaling.store import storage


@pytest.mark.parametrize("path,remote", [("gs://bucket/sweeps/a", True), ("s3://bucket/key", True),
                                         ("/tmp/runs", False), ("runs/a", False), (pathlib.Path("/tmp"), False),
                                         (epath.Path("gs://bucket/x"), True)])
def test_is_remote(path, remote):
    assert storage.is_remote(path) is remote


def test_write_atomic_replaces_a_local_file_whole_and_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "record.json"
    storage.write_atomic(target, "old")
    storage.write_atomic(target, b"new")
    assert target.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["record.json"]


def _tree(root) -> None:
    for name, text in {"a/result.json": "1", "a/config.json": "{}", "b/c/result.json": "22",
                       "result.json": "333", "b/c/d/result.json.tmp": "x"}.items():
        path = epath.Path(root) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        storage.write_atomic(path, text)


def test_find_file_sizes_and_read_ranges_agree_locally_and_on_gs(gcs, tmp_path):
    local = str(tmp_path / "tree")
    for root in (local, f"{gcs}/tree"):
        _tree(root)
        found = storage.find(root, "result.json")
        assert [str(p) for p in found] == [f"{root}/a/result.json", f"{root}/b/c/result.json", f"{root}/result.json"]
        assert storage.find(f"{root}/b/", "result.json") == [epath.Path(f"{root}/b/c/result.json")]
        assert storage.find(f"{root}/missing", "result.json") == []
        assert storage.file_sizes(f"{root}/a") == {"result.json": 1, "config.json": 2}
        assert storage.file_sizes(root) == {"result.json": 3}  # files only, not the folders beside them
        assert storage.read_ranges([f"{root}/result.json", f"{root}/b/c/result.json"], [1, 0], [3, 1]) == [
            b"33", b"2"]


def test_write_atomic_on_gs_is_one_object_and_replaces_it(gcs):
    target = epath.Path(f"{gcs}/sweep/sweep.json")
    storage.write_atomic(target, "first")
    storage.write_atomic(target, "second")
    assert target.read_text() == "second"
    assert [str(p) for p in storage.find(f"{gcs}/sweep", "sweep.json")] == [str(target)]
