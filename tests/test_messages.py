"""Replies from the solution's process are typed evidence: a field of the wrong type is a bad reply, never a
crash of the parent or a number it takes on trust."""
import math

import pytest

from harness import messages
from harness.rules import Failure


@pytest.mark.parametrize("reply_type, message, words", [
    (messages.BurstReply, {"calls": 20, "launch_ms_per_call": True, "wall_ms_per_call": 1.0}, "'launch_ms_per_call' is bool"),
    (messages.BurstReply, {"calls": 20, "launch_ms_per_call": math.nan, "wall_ms_per_call": 1.0}, "'launch_ms_per_call' is float"),
    (messages.BurstReply, {"calls": 20, "wall_ms_per_call": 1.0}, "no 'launch_ms_per_call'"),
    (messages.TimeReply, {"times_ms": [0.1, "0.1"]}, "not float"),
    (messages.CallReply, {"ops": "aten::mm"}, "'ops' is str"),
    (messages.ProfileReply, {"ops": [], "kernel_count": 1.5, "own_kernels": 1, "own_share": 1.0, "kernels": []}, "'kernel_count' is float"),
    (messages.LoadReply, {"load_s": 1.0, "rebuilt": 1, "sandbox": "landlock"}, "'rebuilt' is int"),
])
def test_a_mistyped_reply_is_a_bad_reply(reply_type, message, words):
    with pytest.raises(Failure) as caught:
        messages.read(reply_type, message, "testing")
    assert caught.value.rule == "bad-reply" and words in caught.value.reason


def test_a_well_typed_reply_reads_as_its_type_and_extra_fields_are_ignored():
    reply = messages.read(messages.QueuedReply, {"status": "ok", "device_ms": None, "extra": 1}, "testing")
    assert reply == messages.QueuedReply(None)
    load = messages.read(messages.LoadReply, {"load_s": 2, "rebuilt": False, "sandbox": "landlock", "cpus": "0-3"}, "testing")
    assert load.cpus == "0-3" and load.versions == {}


def test_a_request_goes_on_the_wire_with_its_command():
    assert messages.Time("s", [], [], warmup_s=0.1).wire() == {"cmd": "time", "shape": "s", "sets": [], "slots": [], "warmup_s": 0.1, "null": False}
    assert messages.Load().wire() == {"cmd": "load"}
