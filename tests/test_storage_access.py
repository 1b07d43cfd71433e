"""An unusable gs:// bucket is one line naming the path and the likely cause, from the storage layer's
probe (``scaling.store.storage.check_access``) and from every command that takes a gs:// path, not a minute
of client retries and tracebacks; a reachable emulator bucket still works."""

from __future__ import annotations

import json
import socket

import pytest

import helpers
import tiny
from analysis import __main__ as analysis_cli
from gcs_emulator import emulator_env
from scaling import migrate_records, train as train_cli
from scaling.data import pipeline as data, __main__ as data_cli
from scaling.run import evaluate, generate, train
from scaling.store import storage
from scaling.store.storage import StorageAccessError, check_access
from sweeps import launch

MISSING = "gs://nobucket-that-does-not-resolve/x"
SMOKE = str(tiny.REPO / "sweeps" / "configs" / "smoke.py")


@pytest.fixture
def closed_port(monkeypatch) -> str:
    """``STORAGE_EMULATOR_HOST`` at a port on 127.0.0.1 that nothing listens on: its URL."""
    url = f"http://127.0.0.1:{helpers.free_port()}"  # bound for a moment and released: connections are refused
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
    return url


def _one_line(error: StorageAccessError) -> str:
    message = str(error)
    assert "\n" not in message
    return message


def test_a_closed_port_is_one_line_naming_the_path_the_address_and_the_variable(closed_port):
    with pytest.raises(StorageAccessError) as caught:
        check_access(MISSING)
    message = _one_line(caught.value)
    assert message.startswith(f"{MISSING}: cannot reach Cloud Storage at {closed_port}")
    assert "connection refused" in message and "STORAGE_EMULATOR_HOST" in message


def test_a_name_that_does_not_resolve_is_said_so_without_an_emulator(monkeypatch):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    asked = []

    def no_such_name(address, *args, **kwargs):  # what the resolver raises offline or for a wrong name
        asked.append(address)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "create_connection", no_such_name)
    with pytest.raises(StorageAccessError) as caught:
        check_access("gs://my-bucket/sweeps")
    message = _one_line(caught.value)
    assert asked == [("storage.googleapis.com", 443)]  # once: no retries
    assert message.startswith("gs://my-bucket/sweeps: cannot reach Cloud Storage at https://storage.googleapis.com")
    assert "storage.googleapis.com does not resolve" in message and "network" in message


def test_a_storage_that_accepts_but_never_answers_is_given_up_after_the_timeout(monkeypatch):
    with socket.socket() as silent:  # listening, so connections open, but nothing ever reads or answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{silent.getsockname()[1]}")
        with pytest.raises(StorageAccessError) as caught:
            check_access(MISSING, timeout_s=0.5)
    assert "no answer within 0.5 s" in _one_line(caught.value)


@pytest.mark.parametrize("status, server_says, expected", [
    (401, "Anonymous caller does not have storage.objects.list access.",
     ["wants valid credentials", "gcloud auth application-default login", "GOOGLE_APPLICATION_CREDENTIALS"]),
    (403, "caller does not have storage.objects.list access to the Google Cloud Storage bucket.",
     ["may not list bucket my-bucket", "storage.objects.list"]),
    (404, "The specified bucket does not exist.", ["no such bucket my-bucket", "gcloud storage buckets create"]),
    (503, "Backend Error", ["refused to list bucket my-bucket"]),
])
def test_an_http_refusal_is_one_request_and_one_line_with_its_likely_cause(monkeypatch, status, server_says,
                                                                          expected):
    paths = []

    def refuse(path, headers):  # every request, with a Cloud Storage error body
        paths.append(path)
        return status, json.dumps({"error": {"code": status, "message": server_says}}).encode()

    with helpers.serve_http(refuse, content_type="application/json") as address:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://{address}")
        with pytest.raises(StorageAccessError) as caught:
            check_access("gs://my-bucket/sweeps/x/", "gs://my-bucket/other")  # one bucket: asked once
    message = _one_line(caught.value)
    assert message.startswith("gs://my-bucket/sweeps/x/: ")
    assert f"HTTP {status}: {server_says}" in message
    for words in expected:
        assert words in message
    assert len(paths) == 1  # no retries (gcsfs would send 6 for a 503)
    assert paths[0].startswith("/storage/v1/b/my-bucket/o?")
    assert "prefix=sweeps%2Fx&" in paths[0] + "&" and "maxResults=1" in paths[0]


def test_local_and_empty_paths_are_not_checked(closed_port, tmp_path):
    check_access(tmp_path, "runs/sweeps", "", None, "s3://another/store")  # would fail if any were asked


def test_a_bucket_on_the_emulator_passes_and_a_missing_one_is_named(gcs):
    storage.write_atomic(f"{gcs}/sweeps/smoke/a/result.json", "{}")
    check_access(gcs, f"{gcs}/sweeps", f"{gcs}/not/yet/written")
    missing = f"gs://no-such-bucket-{gcs[-12:]}/sweeps"
    with pytest.raises(StorageAccessError) as caught:
        check_access(missing)
    assert _one_line(caught.value).startswith(f"{missing}: no such bucket no-such-bucket-{gcs[-12:]} at ")


def test_the_launcher_lists_a_sweep_on_a_reachable_emulator_bucket(gcs, capsys):
    assert launch.main(["list", SMOKE, "--workdir", f"{gcs}/sweeps"]) == 0
    assert "L1-d48-s0" in capsys.readouterr().out


# Every command that takes a gs:// path, in this process (each stops before it trains, draws or reads).
COMMANDS = [
    *[(launch.main, [command, SMOKE, "--workdir", MISSING], f"python -m sweeps.launch {command}: error: ")
      for command in ("status", "run", "list", "dry-run")],
    (analysis_cli.main, ["fit", MISSING], "python -m analysis fit: error: "),
    (analysis_cli.main, ["optimal", "--params", "1B", "--fit", f"{MISSING}/fit.json"],
     "python -m analysis optimal: error: "),
    (analysis_cli.main, ["plot", MISSING, "--out", "figures"], "python -m analysis plot: error: "),
    (analysis_cli.main, ["synthetic", "--out", f"{MISSING}/sweep.csv"], "python -m analysis synthetic: error: "),
    (train_cli.main, ["--config", "tiny", "--workdir", MISSING], "python -m scaling.train: error: "),
    (data_cli.main, ["cache", "--source", "builtin", "--cache-dir", f"{MISSING}/tokens"], "error: "),
    (migrate_records.main, [MISSING], "error: "),
    (evaluate.main, [MISSING], "python -m scaling.train eval: error: "),
    (generate.main, [MISSING, "--prompt", "Hello"], "python -m scaling.train sample: error: "),
]


def _exit_status(main, argv) -> int:
    """The status a command line exits with, whether its ``main`` returns it or calls ``sys.exit``."""
    try:
        return main(argv)
    except SystemExit as stop:
        return stop.code


@pytest.mark.parametrize("main, argv, prefix", COMMANDS, ids=[f"{c[0].__module__}-{c[1][0]}" for c in COMMANDS])
def test_every_command_says_one_line_and_exits_2(closed_port, capsys, main, argv, prefix):
    assert _exit_status(main, argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith(f"{prefix}{MISSING}")
    assert f"cannot reach Cloud Storage at {closed_port} (connection refused" in err


def test_the_trainer_checks_a_token_cache_on_gs_too(closed_port, capsys, tmp_path):
    argv = ["--config", "tiny", "--workdir", str(tmp_path / "run"), "--set", f"data.cache_dir={MISSING}"]
    assert train_cli.main(argv) == 2
    assert capsys.readouterr().err.startswith(f"python -m scaling.train: error: {MISSING}: cannot reach Cloud Storage")


def test_eval_of_a_run_on_a_name_that_does_not_resolve_is_one_line_from_the_command_line(tmp_path):
    """As a new user types it, without an emulator: it used to print two gcsfs tracebacks after about a minute."""
    env = {key: value for key, value in tiny.env().items() if key != "STORAGE_EMULATOR_HOST"}
    done = helpers.run([*helpers.module_command("scaling.train", "eval", MISSING)], cwd=tmp_path, env=env,
                       timeout=120)
    assert done.returncode == 2 and done.stdout == "", done.stderr[-2000:]
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"python -m scaling.train eval: error: {MISSING}: ")  # offline: the name; online: 401/404


def test_status_on_an_unreachable_bucket_is_one_line_from_the_command_line(tmp_path):
    """The issue's command as a user types it: it used to print 863 lines in 91 s and exit 0."""
    url = f"http://127.0.0.1:{helpers.free_port()}"
    done = helpers.run_module("sweeps.launch", "status", SMOKE, "--workdir", MISSING, cwd=tmp_path,
                              env=emulator_env(url, tiny.env()), timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"python -m sweeps.launch status: error: {MISSING}: cannot reach Cloud Storage at {url} "
        "(connection refused; is STORAGE_EMULATOR_HOST right?)"]
