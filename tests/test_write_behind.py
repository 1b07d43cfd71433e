"""Writes behind the training loop (scaling/store/write_behind.py): in order, failures raised later, waits bounded."""

import threading

import pytest

from scaling.store.write_behind import WriteBehind, WriteFailed


def test_writes_run_in_order_and_wait_returns_when_all_are_done():
    done, writer = [], WriteBehind()
    for index in range(20):
        writer.submit(f"write {index}", lambda index=index: done.append(index))
    writer.wait(60)
    assert done == list(range(20))


def test_a_failed_write_is_raised_at_the_next_submit_or_wait_and_later_writes_are_skipped():
    done, writer = [], WriteBehind()
    writer.submit("metrics rows of steps 1-10", lambda: (_ for _ in ()).throw(OSError("bucket gone")))
    writer.submit("metrics rows of steps 11-20", lambda: done.append(20))  # would leave a gap: skipped
    with pytest.raises(WriteFailed, match="metrics rows of steps 1-10 failed: OSError: bucket gone"):
        writer.wait(60)
    assert done == []


def test_a_wait_on_storage_that_does_not_answer_gives_up_and_discard_drops_what_has_not_started():
    release, done, writer = threading.Event(), [], WriteBehind()
    writer.submit("hung write", release.wait)
    writer.submit("queued write", lambda: done.append("queued"))
    with pytest.raises(WriteFailed, match="2 write.s. not finished after 0.2 s"):
        writer.wait(0.2)
    writer.discard()  # the run is another's now: the queued write must not happen
    release.set()
    writer.wait(60)
    assert done == []
