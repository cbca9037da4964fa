"""`harness compare`: two runs' medians entry by entry, the repeatability check."""
import pytest

from harness import cli
from harness.compare import CompareError, compare_runs, outside, render, resolve_runs
from harness.records import append_record


def _record(run, name, medians, date, kind="solution", sha="aaa", launch=None, probe=None, device=None):
    timings = [{"shape": f"s{i}", "median_ms": m, "host_probe_us": probe} for i, m in enumerate(medians)]
    if device is not None:
        timings[0]["device_ms"] = device
    if launch is not None:
        timings[0]["batch"] = {"launch_ms_per_call": launch, "wall_ms_per_call": medians[0]}
    return {"run_id": run, "problem": "softmax", "kind": kind, "name": name, "status": "ok", "timings": timings,
            "path": f"solutions/softmax/{name}.py" if kind == "solution" else None, "sha256": sha if kind == "solution" else None,
            "device": "NVIDIA H200", "env": {"date": date, "torch": "2.11.0", "harness_sha": "f00d", "harness_commit": "abc"}}


RUN1 = [_record("aaa111", "eager", (2.0, 4.0), "2026-11-30T10:00:00", kind="eager", launch=1.9, probe=10.0, device=1.0),
        _record("aaa111", "fast", (1.0, 2.0), "2026-11-30T10:01:00")]
RUN2 = [_record("bbb222", "eager", (1.5, 4.04), "2026-11-30T11:00:00", kind="eager", launch=1.4, probe=7.5, device=1.01),
        _record("bbb222", "fast", (1.02, 2.5), "2026-11-30T11:01:00")]


def test_the_last_two_runs_of_a_problem_are_compared_entry_by_entry():
    records = RUN1 + RUN2
    first, second = resolve_runs(records, [], "softmax")
    assert (first, second) == ("aaa111", "bbb222")
    rows = {(row.target, row.shape): row for row in compare_runs(records, first, second)}
    assert rows[("eager", "s0")].change_pct == pytest.approx(-25.0) and rows[("eager", "s0")].host_bound
    assert rows[("solutions/softmax/fast.py", "s0")].change_pct == pytest.approx(2.0)
    bad = {(row.target, row.shape) for row in outside(list(rows.values()))}
    assert bad == {("eager", "s0"), ("solutions/softmax/fast.py", "s1")}
    assert {(row.target, row.shape) for row in outside(list(rows.values()), count_host_bound=False)} == {("solutions/softmax/fast.py", "s1")}


def test_a_changed_solution_file_is_listed_but_not_judged():
    changed = [dict(r, sha256="bbb") if r["kind"] == "solution" else r for r in RUN2]
    rows = compare_runs(RUN1 + changed, "aaa111", "bbb222")
    assert {row.target for row in outside(rows)} == {"eager"}
    text = render(rows, "aaa111", "bbb222")
    assert "file changed (not judged)" in text and text.splitlines()[-1].startswith("1 of 2 entries within 3%")


@pytest.mark.parametrize("names, problem, words", [
    (["aaa"], None, "name two runs"),
    (["a", "zzz"], None, "'zzz' matches 0 runs"),
    ([], "softmax", "has 1 timed run"),
])
def test_runs_that_cannot_be_named_give_a_clear_error(names, problem, words):
    with pytest.raises(CompareError, match=words):
        resolve_runs(RUN1, names, problem)


def test_the_compare_command_exits_non_zero_when_an_entry_moved(tmp_path, capsys):
    for record in RUN1 + RUN2:
        append_record(record, tmp_path / "runs.jsonl")
    assert cli.main(["compare", "aaa", "bbb", "--results", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "aaa111: 2026-11-30T10:00:00, NVIDIA H200, torch 2.11.0, harness sources f00d" in out
    assert "<-- outside" in out and "2 of 4 entries within 3%" in out
    assert "host-bound (host issue time -25%) (device time +1.0%)" in out  # the host moved, the device work did not
    assert cli.main(["compare", "--problem", "softmax", "--tolerance", "30", "--results", str(tmp_path)]) == 0
    assert cli.main(["compare", "--problem", "infonce", "--results", str(tmp_path)]) == 2
    assert "infonce has 0 timed run(s)" in capsys.readouterr().err
