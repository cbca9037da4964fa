"""Do two runs agree? Entry by entry (target x shape), the change of the median from one run of a problem
to another, read from runs.jsonl: the check behind "the same eval twice gives medians within 3%".

Runs are named by their run ids (a unique prefix is enough), or taken as the last two runs of a problem.
Host-bound entries (issuing the call took most of its time: the figure is partly the host CPU's) are
marked, because they are the ones expected to move; they still count, unless asked otherwise. Beside them
goes the change of their device time (measured with the host far ahead), which should not move. A solution
whose file changed between the runs (its sha256) is listed but not judged: that is not the same code.
"""
from __future__ import annotations

import dataclasses
import math

from .timing import entry_is_host_bound

TOLERANCE_PCT = 3.0


class CompareError(Exception):
    """A run that cannot be found or named unambiguously, or two runs with nothing in common."""


@dataclasses.dataclass
class Row:
    problem: str
    target: str
    shape: str
    first_ms: float
    second_ms: float
    host_bound: bool
    same_code: bool = True
    probe_change_pct: float | None = None  # change of the host's issue time (timing.host_issue_probe)
    device_change_pct: float | None = None  # change of a host-bound entry's device time (the child's queued loop, timing.make_timer)

    @property
    def change_pct(self) -> float:
        return 100.0 * (self.second_ms / self.first_ms - 1.0) if self.first_ms > 0 else math.inf


def _run_order(records: list) -> list:
    """Run ids, oldest first (by the earliest record of each run)."""
    first_seen = {}
    for r in records:
        date = r.get("env", {}).get("date", "")
        if r["run_id"] not in first_seen or date < first_seen[r["run_id"]]:
            first_seen[r["run_id"]] = date
    return sorted(first_seen, key=lambda run: first_seen[run])


def resolve_runs(records: list, names: list, problem: str | None) -> tuple:
    """The two run ids to compare: `names` (two run ids or unique prefixes), or the last two runs that
    timed `problem`."""
    runs = _run_order(records)
    if names:
        if len(names) != 2:
            raise CompareError(f"name two runs to compare, got {len(names)}")
        chosen = []
        for name in names:
            matches = [run for run in runs if run.startswith(name)]
            if len(matches) != 1:
                raise CompareError(f"run '{name}' matches {len(matches)} runs" + (f": {', '.join(matches[:5])}" if matches else
                                   f" (known: {', '.join(runs[-6:]) or 'none'})"))
            chosen.append(matches[0])
        return tuple(chosen)
    if not problem:
        raise CompareError("name two runs, or a problem whose last two runs to compare")
    timed = [run for run in runs if any(r["run_id"] == run and r.get("problem") == problem and r.get("timings") for r in records)]
    if len(timed) < 2:
        raise CompareError(f"{problem} has {len(timed)} timed run(s) in the results; two are needed")
    return timed[-2], timed[-1]


def describe(records: list, run: str) -> str:
    """One line on where and when a run was made."""
    r = next(r for r in records if r["run_id"] == run)
    env = r.get("env", {})
    # The sources' hash names the harness code; a git commit can be stale where the tree was copied (+dirty).
    return (f"{run}: {env.get('date', '?')}, {r.get('device', '?')}, torch {env.get('torch', '?')}, harness sources "
            f"{env.get('harness_sha', '?')} (git {env.get('harness_commit', '?')})")


def _entries(records: list, run: str) -> dict:
    """{(problem, target, shape): (median_ms, host_bound, sha256, host_probe_us, device_ms)} of one run's timed entries."""
    out = {}
    for r in records:
        if r["run_id"] != run:
            continue
        target = r.get("path") or r.get("name")
        for t in r.get("timings", []):
            if t.get("median_ms"):
                out[(r["problem"], target, t["shape"])] = (t["median_ms"], entry_is_host_bound(t), r.get("sha256"),
                                                           t.get("host_probe_us"), t.get("device_ms"))
    return out


def compare_runs(records: list, first: str, second: str) -> list:
    """A Row for every entry timed in both runs."""
    a, b = _entries(records, first), _entries(records, second)
    common = [key for key in a if key in b]
    if not common:
        raise CompareError(f"runs {first} and {second} have no timed entry in common")
    def change(pa, pb):
        return 100.0 * (pb / pa - 1.0) if pa and pb else None

    return [Row(*key, a[key][0], b[key][0], a[key][1] or b[key][1], a[key][2] == b[key][2], change(a[key][3], b[key][3]),
                change(a[key][4], b[key][4])) for key in common]


def outside(rows: list, tolerance_pct: float = TOLERANCE_PCT, count_host_bound: bool = True) -> list:
    """The rows of unchanged code whose median moved by more than the tolerance (host-bound ones only if
    they count)."""
    return [row for row in rows if row.same_code and abs(row.change_pct) > tolerance_pct and (count_host_bound or not row.host_bound)]


def render(rows: list, first: str, second: str, tolerance_pct: float = TOLERANCE_PCT, count_host_bound: bool = True,
           header: tuple = ()) -> str:
    """Optional header lines, a plain-text table, then one verdict line."""
    width = max(len(row.target) for row in rows)
    bad = outside(rows, tolerance_pct, count_host_bound)
    lines = list(header) + [f"{'target':{width}s}  {'shape':20s}  {first[:12]:>12s}  {second[:12]:>12s}  change"]
    for row in sorted(rows, key=lambda r: (r.problem, r.shape, r.target)):
        marks = ("  host-bound" if row.host_bound else "") + ("" if row.same_code else "  file changed (not judged)")
        if row.host_bound and row.probe_change_pct is not None:
            marks += f" (host issue time {row.probe_change_pct:+.0f}%)"
        if row.host_bound and row.device_change_pct is not None:
            marks += f" (device time {row.device_change_pct:+.1f}%)"
        marks += "  <-- outside" if row in bad else ""
        lines.append(f"{row.target:{width}s}  {row.shape:20s}  {row.first_ms:9.4f} ms  {row.second_ms:9.4f} ms  "
                     f"{row.change_pct:+6.1f}%{marks}")
    judged = [row for row in rows if row.same_code]
    worst = max((abs(row.change_pct) for row in judged if not row.host_bound), default=0.0)
    scope = "" if count_host_bound else " (host-bound entries not counted)"
    lines.append(f"{len(judged) - len(bad)} of {len(judged)} entries within {tolerance_pct:g}%{scope}; worst device-bound change "
                 f"{worst:.1f}%; {sum(row.host_bound for row in judged)} host-bound; {len(rows) - len(judged)} with a changed file")
    return "\n".join(lines)
