"""The parent-child channel carries data only: authenticated JSON frames, read whole or not at all."""
import os
import threading
import time

import pytest

from harness.channel import ChannelError, new_key, open_channel


def _pair():
    down_r, down_w = os.pipe()
    up_r, up_w = os.pipe()
    key = new_key()
    return open_channel(up_r, down_w, key), open_channel(down_r, up_w, key), (down_w, up_w)


def test_messages_travel_as_plain_data():
    (send, _), (_, recv), _ = _pair()
    send({"times_ms": [0.015, float("inf")], "ops": ["mm"], "nested": {"ok": True, "none": None}})
    message = recv(1.0)
    assert message["ops"] == ["mm"] and message["times_ms"][1] == float("inf") and message["nested"] == {"ok": True, "none": None}
    with pytest.raises(TypeError):
        send({"tensor": object()})  # nothing but JSON values travel


def test_a_forged_or_replayed_frame_is_refused():
    (send, _), (_, recv), (down_w, _) = _pair()
    os.write(down_w, (5).to_bytes(4, "big") + b"\0" * 32 + b'{"a":1}'[:5])
    with pytest.raises(ChannelError, match="authentication"):
        recv(1.0)
    (send, _), (_, recv), (down_w, _) = _pair()
    send({"n": 1})
    recv(1.0)
    send({"n": 2})  # the counter moved on: a copy of the first frame would no longer pass
    assert recv(1.0) == {"n": 2}


def test_an_authenticated_frame_nested_too_deep_is_a_channel_error_not_a_crash():
    """A child that holds the key (native code can read it) may send any bytes: JSON nested deeper than the
    scanner goes must be refused like any malformed frame, never raise RecursionError in the parent."""
    import hashlib
    import hmac

    down_r, down_w = os.pipe()
    key = new_key()
    _, recv = open_channel(down_r, os.pipe()[1], key)
    payload = b"[" * 20000 + b"]" * 20000
    tag = hmac.new(key, (0).to_bytes(8, "big") + payload, hashlib.sha256).digest()
    os.write(down_w, len(payload).to_bytes(4, "big") + tag + payload)
    with pytest.raises(ChannelError, match="not JSON: RecursionError"):
        recv(1.0)


def test_a_frame_that_arrives_in_pieces_is_read_whole_past_the_timeout():
    """A timeout applies to the start of a frame only: a slow writer never leaves the reader mid-frame."""
    key = new_key()
    raw_r, raw_w = os.pipe()
    in_r, in_w = os.pipe()
    spare_r, spare_w = os.pipe()
    send, _ = open_channel(spare_r, raw_w, key)
    _, recv = open_channel(in_r, spare_w, key)
    send({"status": "ok", "pad": "x" * 1000})
    frame = os.read(raw_r, 1 << 16)
    writer = threading.Thread(target=lambda: (os.write(in_w, frame[:10]), time.sleep(0.3), os.write(in_w, frame[10:])))
    writer.start()
    assert recv(0.1)["status"] == "ok"  # begun within the timeout, finished well after it
    writer.join()
    with pytest.raises(TimeoutError):
        recv(0.05)  # nothing began: a plain timeout


def test_with_no_timeout_the_reader_waits_for_a_frame_as_long_as_it_takes(monkeypatch):
    """The child waits for its next request with no timeout, and the parent may be busy for minutes between
    two requests (a host-bound figure timed again in four fresh processes of a slow-loading baseline): only a
    frame that has begun is bound by FRAME_SECONDS. Seen on an H100: torch.compile's InfoNCE child gave up
    after 60 s idle and was reported as a crash."""
    from harness import channel

    monkeypatch.setattr(channel, "FRAME_SECONDS", 0.1)
    (send, _), (_, recv), _ = _pair()
    writer = threading.Thread(target=lambda: (time.sleep(0.4), send({"cmd": "probe"})))
    writer.start()
    assert recv() == {"cmd": "probe"}  # idle four times FRAME_SECONDS, then a whole frame
    writer.join()


def test_a_reply_written_just_before_the_child_exits_is_read_not_taken_for_a_crash():
    """The parent waits in short slices and checks whether the child lives between them; a child that
    replies and exits inside one slice must still be heard (a solution's child exits after its first failure)."""
    import subprocess

    from harness.rules import Failure
    from harness.runner import Worker

    key = new_key()
    to_parent_r, to_parent_w = os.pipe()
    to_child_r, to_child_w = os.pipe()
    parent_send, parent_recv = open_channel(to_parent_r, to_child_w, key)
    child_send, _ = open_channel(to_child_r, to_parent_w, key)
    worker = Worker.__new__(Worker)
    worker.spec, worker.send = {"kind": "solution"}, parent_send
    worker.process = subprocess.Popen(["true"])
    worker.process.wait()
    worker.strays = lambda: []
    calls = []

    def recv(timeout=None):
        calls.append(timeout)
        if len(calls) == 1:  # the slice ends just before the reply lands
            child_send({"status": "fail", "rule": "exception", "reason": "forward raised"})
            raise TimeoutError
        return parent_recv(timeout)

    worker.recv = recv
    with pytest.raises(Failure) as caught:
        worker.request({"cmd": "load"}, 5, "loading")
    assert caught.value.rule == "exception", caught.value.reason
