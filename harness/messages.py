"""The parent-child protocol as types: one dataclass per request and per reply.

A request is the parent's (trusted) order; `wire()` turns it into the JSON object the channel carries, with
`cmd` naming the child's handler. A reply comes from the solution's process and is evidence only:
`read(ReplyType, message, phase)` accepts it when every field has its declared type (bool is not a number,
numbers are finite) and otherwise raises Failure("bad-reply"), never a crash of the parent. Failure
replies (`{"status": "fail", "rule", "reason"}`) are handled by Worker.request before a reply is read.
"""
from __future__ import annotations

import dataclasses
import math
import typing

from .rules import Failure


# ----- requests (parent -> child) ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Request:
    cmd: typing.ClassVar[str] = ""

    def wire(self) -> dict:
        return {"cmd": self.cmd, **dataclasses.asdict(self)}


@dataclasses.dataclass(frozen=True)
class Load(Request):
    """Build and import the solution (or load the baseline)."""
    cmd: typing.ClassVar[str] = "load"


@dataclasses.dataclass(frozen=True)
class Call(Request):
    """One correctness trial: run forward on `inputs`, copy the output into `slot`, record the ops."""
    cmd: typing.ClassVar[str] = "call"
    shape: str
    inputs: list  # shared-tensor descriptions
    slot: dict


@dataclasses.dataclass(frozen=True)
class Time(Request):
    """One timed batch over `sets`, each output copied into its slot."""
    cmd: typing.ClassVar[str] = "time"
    shape: str
    sets: list
    slots: list
    warmup_s: float = 0.0  # the first batch warms up first, in the same flush-and-call pattern
    null: bool = False  # the parent's yardstick: the same batch with a call that does nothing


@dataclasses.dataclass(frozen=True)
class Burst(Request):
    """`calls` back-to-back calls ending in one device-wide synchronise: the escape check."""
    cmd: typing.ClassVar[str] = "burst"
    shape: str
    sets: list
    calls: int


@dataclasses.dataclass(frozen=True)
class Queued(Request):
    """A batch queued behind a device-side wait: the device time of a host-bound call."""
    cmd: typing.ClassVar[str] = "queued"
    shape: str
    sets: list
    slots: list
    host_ms_per_call: float


@dataclasses.dataclass(frozen=True)
class Profile(Request):
    """Two calls under the kernel trace: which kernels ran, the solution's own share; the second call's output
    goes to the slot, to be checked as a trial's is."""
    cmd: typing.ClassVar[str] = "profile"
    shape: str
    inputs: list
    slot: dict


@dataclasses.dataclass(frozen=True)
class Ready(Request):
    """Answered once the child has started: torch imported, CUDA's context made, the guard in place. A child
    started ahead of its turn is asked this before another target is timed, so its start never overlaps timing."""
    cmd: typing.ClassVar[str] = "ready"


@dataclasses.dataclass(frozen=True)
class Probe(Request):
    """The host's time to issue one tiny operation."""
    cmd: typing.ClassVar[str] = "probe"


# ----- replies (child -> parent) ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LoadReply:
    load_s: float
    rebuilt: bool
    sandbox: str
    cpus: str = ""
    versions: dict = dataclasses.field(default_factory=dict)
    requirement_versions: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class CallReply:
    ops: list  # aten op names, str


@dataclasses.dataclass(frozen=True)
class TimeReply:
    times_ms: list  # one finite, non-negative number per set


@dataclasses.dataclass(frozen=True)
class BurstReply:
    calls: int
    launch_ms_per_call: float
    wall_ms_per_call: float
    events_ms_per_call: float | None = None


@dataclasses.dataclass(frozen=True)
class QueuedReply:
    device_ms: float | None = None  # None: the host could not get ahead (the call synchronises inside)


@dataclasses.dataclass(frozen=True)
class ProfileReply:
    ops: list  # the aten ops the profiled calls ran, as a trial's
    kernel_count: int
    own_kernels: int
    own_share: float
    kernels: list  # {"name", "own", ...} per kernel


@dataclasses.dataclass(frozen=True)
class ReadyReply:
    pass


@dataclasses.dataclass(frozen=True)
class ProbeReply:
    probe_us: float


_ITEM_TYPES = {(CallReply, "ops"): str, (TimeReply, "times_ms"): float, (ProfileReply, "kernels"): dict,
               (ProfileReply, "ops"): str}


def _fits(value, kind) -> bool:
    """`value` is of the declared type: bool is never a number, numbers are finite, None only where allowed."""
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def wire(reply, _getattr=getattr, _type=type) -> dict:
    """A reply as the plain mapping the channel sends: its fields, read off the instance. No dataclasses.asdict:
    it looks itself up and copies values through `copy` at call time, both modules a solution could rewrite; and
    the builtins it calls are bound at import, before any solution code runs."""
    return {name: _getattr(reply, name) for name in _type(reply).__dataclass_fields__}


def read(reply_type, message: dict, phase: str):
    """The reply as `reply_type`, or Failure("bad-reply") naming the first field that is missing or mistyped."""
    hints = typing.get_type_hints(reply_type)
    values = {}
    for field in dataclasses.fields(reply_type):
        required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        if field.name not in message or (message[field.name] is None and not required):
            if required:
                raise Failure("bad-reply", f"while {phase}: the reply has no {field.name!r}")
            continue
        value, hint = message[field.name], hints[field.name]
        kinds = [k for k in typing.get_args(hint) if k is not type(None)] or [hint]
        if not any(_fits(value, k) for k in kinds):
            raise Failure("bad-reply", f"while {phase}: the reply's {field.name!r} is {type(value).__name__}, not what the harness asked for")
        item = _ITEM_TYPES.get((reply_type, field.name))
        if item is not None and not all(_fits(v, item) for v in value):
            raise Failure("bad-reply", f"while {phase}: the reply's {field.name!r} holds an item that is not {item.__name__}")
        values[field.name] = value
    return reply_type(**values)
