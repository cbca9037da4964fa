"""Every rule that can reject a target, in one table, and the one exception that carries a rejection.

The README's table of rules is this table (tests/test_rules.py holds them equal), so a rule is named,
explained and checked in one place. `Failure` refuses a rule name that is not in the table: a typo in a
rule name is a harness bug, caught where it is raised.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Rule:
    names: tuple  # rules that share one line of evidence in the README
    evidence: str
    child_may_report: bool  # whether the solution's own process may name it; the parent decides all others


RULES = (
    Rule(("compile-error", "import-error", "missing-ModelNew"), "the build or import failed (first compiler error lines)", True),
    Rule(("exception", "cuda-error", "out-of-memory"), "forward raised, hit a CUDA error or ran out of memory", True),
    Rule(("crash", "timeout"), "the solution's process died (signal named) or hung past `--timeout`", False),
    Rule(("bad-output",), "not a plain tensor of the right shape, dtype and device", True),
    Rule(("wrong-output", "uninitialised-output"), "outside tolerance; or holding the poison pattern of freed memory", False),
    Rule(("input-mutated",), "an input differs after the call from what the checker drew", False),
    Rule(("timed-output-wrong",), "the output of a timed call (a secret quarter of every batch, the whole last batch) is wrong, for a "
                                  "solution and a baseline alike", False),
    Rule(("impossible-time",), "faster than the bytes allow (reads at the measured read ceiling, writes at what a copy "
                               "costs, 5% margin) or the flops at the measured bf16 matrix rate", False),
    Rule(("escaped-timing",), "the parent's clock over the timed batches, or a device-synchronised batch of ~5 ms, took "
                              "longer than the events saw (on the CPU, than the child's clock)", True),
    Rule(("introspection",), "frames, gc, ctypes, code objects, tracing, exec of strings, `/proc` of another process, "
                             "torch's frame-evaluation hooks, a call of torch's ops below the op records (`_op_dk`, "
                             "`redispatch_boxed`, `torch.library.get_kernel`, TorchScript's fusers): in the source (static "
                             "scan) or at run time (the guard and the seals)", True),
    Rule(("sandbox-violation",), "a write outside the scratch folder, a signal to another process, a socket, a process "
                                 "started after loading", True),
    Rule(("background-thread",), "a thread of the solution's still running at a checkpoint: a Python one, a native one "
                                 "running Python, or torch's inter-op pool (TorchScript's fork)", True),
    Rule(("background-process",), "a process still alive after a call", False),
    Rule(("tampering",), "torch, harness or core module dicts changed, a torch mode or a signal handler left behind", True),
    Rule(("bad-reply",), "a message from the child that is malformed, forged or names a rule no solution can earn", False),
    Rule(("not-custom-kernel",), "forward dispatched the problem's own aten op (a dispatch mode and the profiler's C++ "
                                 "callbacks record them, in the trials and the profiled calls), or the profile at a timing "
                                 "shape saw no kernel of its own, or its own kernels took under half the GPU time", False),
    Rule(("harness-error",), "the checker itself failed (e.g. out of memory computing the reference): not a verdict on "
                             "the solution, and the run goes on", False),
)

ALL = frozenset(name for rule in RULES for name in rule.names)
# What a child may report of a solution; anything else in a failure reply (a rule meant for the parent, or
# "unavailable" for another library) is itself a bad reply.
CHILD_MAY_REPORT = frozenset(name for rule in RULES if rule.child_may_report for name in rule.names)
# Rules the child's guard (audit hook, snapshot) raises; its report pipe may name only these.
GUARD = frozenset({"introspection", "sandbox-violation", "background-thread", "tampering"})
# A worker that crashed, hung, broke its CUDA context or spoke out of turn can run nothing more.
WORKER_LOST = ("crash", "timeout", "cuda-error", "bad-reply")
# Not rejections: a baseline or another library that cannot run on this machine.
NOT_RUN = frozenset({"unavailable", "skipped"})


def one_line(text) -> str:
    """`text` as one line of printable characters. A reason can come from the solution's process (an exception's
    message, its class's name): it is printed to a terminal and written into the leaderboard's markdown."""
    return "".join(ch if ch.isprintable() else " " for ch in str(text))


class Failure(Exception):
    """A rejection (or a reference that could not run): `rule` names it, `reason` is one line of evidence."""

    def __init__(self, rule: str, reason: str):
        if rule not in ALL and rule not in NOT_RUN:
            raise ValueError(f"unknown rule {rule!r}: add it to harness/rules.py RULES (and the README's table)")
        reason = one_line(reason)
        super().__init__(reason)
        self.rule, self.reason = rule, reason


def markdown_table() -> str:
    """The README's table of rules, as this module states it."""
    lines = ["| rule | evidence |", "|---|---|"]
    lines += ["| " + ", ".join(f"`{n}`" for n in rule.names) + f" | {rule.evidence} |" for rule in RULES]
    return "\n".join(lines)
