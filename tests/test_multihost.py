"""Agreement between processes (scaling/multihost.py): two local CPU processes as one JAX job (gloo), as
tests/test_pod.py starts them, and the one-process case, where every function is the identity or nothing."""

import json
import sys
import textwrap

import numpy as np

import helpers
from scaling import multihost

# Each process holds different values (hosts that read storage at different moments) and reports what
# every function gave it.
AGREE = textwrap.dedent('''
    import json, sys
    from scaling import multihost
    from scaling.model import mesh

    index, port = int(sys.argv[1]), sys.argv[2]
    mesh.initialize_distributed(f"127.0.0.1:{port}", 2, index)
    steps = [[8, 4], [8, 4, 2]][index]  # process 1 sees one more checkpoint
    report = {
        "count": multihost.process_count(),
        "flag": multihost.broadcast_from_process_0(index == 0),
        "number": multihost.broadcast_from_process_0(100 + index),
        "steps": multihost.broadcast_ints_from_process_0(steps),
        "none": multihost.broadcast_ints_from_process_0([] if index == 0 else [3]),
        "gathered": multihost.gather([index, 10 * index]).tolist(),
        "any": multihost.any_process(index == 1),
        "any_none": multihost.any_process(False),
        "agree_same": multihost.all_agree(7),
        "agree_different": multihost.all_agree(index),
    }
    multihost.barrier("test-multihost-end")
    print("REPORT " + json.dumps(report), flush=True)
''')


def test_two_processes_follow_process_0_and_share_their_flags(tmp_path):
    script = tmp_path / "agree.py"
    script.write_text(AGREE)
    env = helpers.with_checkout(helpers.clean_env(JAX_PLATFORMS="cpu",
                                                  XLA_FLAGS="--xla_force_host_platform_device_count=1"))
    port = helpers.free_port()
    processes = [helpers.start([sys.executable, script, index, port], env=env, cwd=tmp_path, merge_stderr=True)
                 for index in range(2)]
    outputs = [done.stdout for done in helpers.finish(processes, timeout=240)]
    reports = []
    for process, output in zip(processes, outputs):
        assert process.returncode == 0, output[-3000:]
        [line] = [line for line in output.splitlines() if line.startswith("REPORT ")]
        reports.append(json.loads(line[len("REPORT "):]))
    for report in reports:  # the same answers on both, process 0's where process 0 decides
        assert report == {"count": 2, "flag": True, "number": 100, "steps": [8, 4], "none": [],
                          "gathered": [[0, 0], [1, 10]], "any": True, "any_none": False, "agree_same": True,
                          "agree_different": False}


def test_one_process_is_the_identity_and_makes_no_transfer(monkeypatch):
    from jax.experimental import multihost_utils

    def no_transfer(*args, **kwargs):
        raise AssertionError("a cross-process transfer with one process")

    for name in ("broadcast_one_to_all", "process_allgather", "sync_global_devices"):
        monkeypatch.setattr(multihost_utils, name, no_transfer)
    assert multihost.process_count() == 1
    assert multihost.broadcast_from_process_0(True) is True and multihost.broadcast_from_process_0(7) == 7
    assert multihost.broadcast_ints_from_process_0((3, 2)) == [3, 2]
    np.testing.assert_array_equal(multihost.gather([1, 5]), [[1, 5]])
    assert multihost.any_process(True) and not multihost.any_process(False)
    assert multihost.all_agree(12345)
    multihost.barrier("alone")
