"""runs.jsonl appends are atomic and tolerant of torn lines; the leaderboard ranks and explains."""
import json
import multiprocessing

from harness import leaderboard
from harness.records import append_record, read_records


def _record(name, kind="solution", status="ok", medians=(1.0, 2.0), eager=(2.0, 2.0), date="2026-11-30T10:00:00+00:00", **extra):
    timings = [{"shape": f"s{i}", "median_ms": m, "speedup_eager": e / m, "speedup_compile": 1.0, "pct_copy_bw": 80.0}
               for i, (m, e) in enumerate(zip(medians, eager))] if status == "ok" else []
    return {"run_id": "r1", "seed": 1, "problem": "softmax", "kind": kind, "name": name, "path": f"/elsewhere/solutions/softmax/{name}.py" if kind == "solution" else None,
            "status": status, "rule": extra.get("rule", ""), "reason": extra.get("reason", ""), "checks": [], "timings": timings,
            "warnings": [], "profile": None, "device": "NVIDIA H200", "env": {"date": date, "torch": "2.11.0", "harness_commit": "abc", "harness_sha": "f00d"}}


def _append_many(path, start):
    for i in range(50):
        append_record(_record(f"w{start}_{i}"), path)


def test_concurrent_appends_never_interleave(tmp_path):
    path = tmp_path / "runs.jsonl"
    workers = [multiprocessing.get_context("spawn").Process(target=_append_many, args=(path, k)) for k in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    records, skipped = read_records(path)
    assert len(records) == 150 and skipped == 0


def test_a_torn_last_line_is_skipped_and_earlier_records_survive(tmp_path):
    path = tmp_path / "runs.jsonl"
    append_record(_record("a"), path)
    with open(path, "a") as handle:
        handle.write('{"run_id": "interrupted", "proble')
    records, skipped = read_records(path)
    assert [r["name"] for r in records] == ["a"] and skipped == 1
    append_record(_record("b"), path)  # a later run still appends a whole, separate record
    records, skipped = read_records(path)
    assert [r["name"] for r in records] == ["a", "b"] and skipped == 1


def test_leaderboard_ranks_by_geomean_and_lists_failures(tmp_path):
    path = tmp_path / "runs.jsonl"
    append_record(_record("eager", kind="eager", medians=(2.0, 2.0)), path)
    append_record(_record("slow", medians=(1.9, 1.9)), path)
    append_record(_record("fast", medians=(1.0, 1.0)), path)
    append_record(_record("cheat", status="failed", rule="impossible-time", reason="s0: median below the floor"), path)
    summary = leaderboard.regenerate(tmp_path)
    assert summary["records"] == 4
    text = (tmp_path / "leaderboard.md").read_text()
    assert text.index("1. fast.py") < text.index("2. slow.py")
    assert "*eager* (reference)" in text and "Measured 2026-11-30; torch 2.11.0; harness sources f00d." in text
    assert "**impossible-time**: s0: median below the floor" in text
    board = json.loads((tmp_path / "leaderboard.json").read_text())
    ranked = board["softmax"]["NVIDIA H200"]["ranked"]
    assert [s["name"] for s in ranked] == ["fast", "slow"] and abs(ranked[0]["geomean_speedup_eager"] - 2.0) < 1e-9


def test_a_solution_removed_from_the_repository_drops_off_the_board(tmp_path):
    path = tmp_path / "runs.jsonl"
    shipped, removed = _record("simple", medians=(1.5, 1.5)), _record("retired_v0", medians=(1.0, 1.0))
    shipped["path"], removed["path"] = "solutions/softmax/simple.py", "solutions/softmax/retired_v0.py"
    for record in (_record("eager", kind="eager", medians=(2.0, 2.0)), shipped, removed):
        append_record(record, path)
    summary = leaderboard.regenerate(tmp_path)
    text = (tmp_path / "leaderboard.md").read_text()
    assert summary["records"] == 3 and "1. simple.py" in text and "retired_v0" not in text


def test_leaderboard_keeps_only_the_latest_record_of_a_solution(tmp_path):
    path = tmp_path / "runs.jsonl"
    append_record(_record("fast", medians=(1.0, 1.0), date="2026-11-29T10:00:00+00:00"), path)
    append_record(_record("fast", status="failed", rule="wrong-output", reason="x", date="2026-11-30T10:00:00+00:00"), path)
    board = leaderboard.build(read_records(path)[0])
    cell = board["softmax"]["NVIDIA H200"]
    assert not cell["ranked"] and [s["name"] for s in cell["failed"]] == ["fast"]


def test_a_library_that_did_not_import_in_the_latest_run_keeps_its_measured_row_marked_with_its_run(tmp_path):
    path = tmp_path / "runs.jsonl"
    quack = _record("quack", kind="external", medians=(0.9, 1.8), date="2026-11-29T10:00:00+00:00")
    quack["run_id"] = "old111"
    for record in (_record("eager", kind="eager", medians=(2.0, 2.0), date="2026-11-29T10:00:00+00:00") | {"run_id": "old111"}, quack,
                   _record("eager", kind="eager", medians=(2.0, 2.0), date="2026-11-30T10:00:00+00:00") | {"run_id": "new222"},
                   _record("quack", kind="external", status="skipped", reason="quack is not importable here",
                           date="2026-11-30T10:01:00+00:00") | {"run_id": "new222"}):
        append_record(record, path)
    leaderboard.regenerate(tmp_path)
    text = (tmp_path / "leaderboard.md").read_text()
    row = next(line for line in text.splitlines() if "*quack*" in line)
    assert row.startswith("| *quack* (reference) · run old111 | ") and "0.9 ms" in row
    assert "*eager* (reference) |" in text  # the eager row is the latest run's: no mark
    assert 'Rows marked "run X" come from an earlier run than the latest (new222, 2026-11-30)' in text
    assert "Not run" not in text
    # With no measured record at all, the skipped one is listed as before.
    only_skipped = [r for r in read_records(path)[0] if r["run_id"] == "new222"]
    cell = leaderboard.build(only_skipped)["softmax"]["NVIDIA H200"]
    assert [s["name"] for s in cell["skipped"]] == ["quack"]


def test_a_reference_row_keeps_the_shapes_it_could_time(tmp_path):
    path = tmp_path / "runs.jsonl"
    liger = _record("liger", kind="external", medians=(1.0, 2.0))
    liger["timings"][1] = {"shape": "s1", "dtype": "float32", "rule": "exception", "error": "n = 393216 exceeds the blocksize"}
    append_record(_record("eager", kind="eager", medians=(2.0, 2.0)), path)
    append_record(liger, path)
    leaderboard.regenerate(tmp_path)
    row = next(line for line in (tmp_path / "leaderboard.md").read_text().splitlines() if "*liger*" in line)
    assert "(1 of 2 shapes)" in row and "failed (exception note 1)" in row
    assert "1. liger at s1: **exception**: n = 393216 exceeds the blocksize" in (tmp_path / "leaderboard.md").read_text()


def test_a_host_bound_figure_is_marked_and_explained(tmp_path):
    path = tmp_path / "runs.jsonl"
    eager = _record("eager", kind="eager", medians=(2.0, 2.0))
    eager["timings"][0]["batch"] = {"calls": 20, "launch_ms_per_call": 1.9, "wall_ms_per_call": 2.0}
    eager["timings"][1]["batch"] = {"calls": 20, "launch_ms_per_call": 0.1, "wall_ms_per_call": 2.0}
    append_record(eager, path)
    leaderboard.regenerate(tmp_path)
    text = (tmp_path / "leaderboard.md").read_text()
    row = next(line for line in text.splitlines() if "*eager*" in line)
    assert row.count("host-bound†") == 1 and "† host-bound" in text
    board = json.loads((tmp_path / "leaderboard.json").read_text())
    timings = board["softmax"]["NVIDIA H200"]["references"][0]["timings"]
    assert timings["s0"]["host_bound"] is True and timings["s1"]["host_bound"] is False


def test_a_figure_from_several_processes_says_so(tmp_path):
    path = tmp_path / "runs.jsonl"
    eager = _record("eager", kind="eager", medians=(3.0, 2.0))
    # The batch ran in the first process: 1.9 ms of launches is host-bound against its 2.0 ms median,
    # though not against the 3.0 ms median of the three processes.
    eager["timings"][0].update(batch={"calls": 20, "launch_ms_per_call": 1.9, "wall_ms_per_call": 2.0}, processes=3,
                               process_medians_ms=[2.0, 3.0, 3.1], median_of="processes", device_ms=0.8)
    append_record(eager, path)
    leaderboard.regenerate(tmp_path)
    text = (tmp_path / "leaderboard.md").read_text()
    row = next(line for line in text.splitlines() if "*eager*" in line)
    assert "3 ms · 1.00x eager · 1.00x compile · 80% copy BW · host-bound† (3 processes) · device 0.8 ms |" in row
    assert "Those marked (N processes) were timed in N fresh processes; the figure is the median of their medians." in text
    assert '"device": the same calls' in text
    board = json.loads((tmp_path / "leaderboard.json").read_text())
    timings = board["softmax"]["NVIDIA H200"]["references"][0]["timings"]
    assert timings["s0"]["processes"] == 3 and timings["s0"]["host_bound"] is True and timings["s1"]["processes"] is None


def test_the_terminal_table_says_when_a_figure_is_a_median_of_processes():
    from harness.report import timing_cell

    assert timing_cell({"median_ms": 0.25, "processes": 5}).splitlines() == ["0.25 ms", "median of 5 processes"]
    assert timing_cell({"median_ms": 0.25}) == "0.25 ms"
    assert timing_cell({"median_ms": 0.25, "processes": 5, "device_ms": 0.08}).splitlines()[-1] == "device 0.08 ms"


def test_a_library_row_names_the_release_it_timed(tmp_path):
    quack = _record("quack", kind="external", medians=(0.9, 1.8)) | {"versions": {"quack-kernels": "0.6.5"},
                                                                      "requirement_versions": {"nvidia-cutlass-dsl": "4.8.1", "einops": "0.8.1"}}
    for record in (_record("eager", kind="eager", medians=(2.0, 2.0)), quack):
        append_record(record, tmp_path / "runs.jsonl")
    leaderboard.regenerate(tmp_path)
    text = (tmp_path / "leaderboard.md").read_text()
    assert "| *quack* (reference, quack-kernels 0.6.5) | " in text
    assert "| *eager* (reference) | " in text  # no versions recorded: no suffix
    assert "*quack* ran with einops 0.8.1, nvidia-cutlass-dsl 4.8.1 (what it requires, as installed)." in text


def test_a_solution_edited_after_its_run_is_marked_as_not_the_measured_code(tmp_path):
    """The board's figures belong to the file the run hashed; an edited file is flagged until it is run again."""
    import hashlib

    edited, kept, broken = (tmp_path / f"{n}.py" for n in ("edited", "kept", "broken"))
    for file in (edited, kept, broken):
        file.write_text("# measured version\n")
    sha = hashlib.sha256(b"# measured version\n").hexdigest()
    records = [_record("eager", kind="eager", medians=(2.0, 2.0)),
               _record("edited", medians=(1.0, 1.0)) | {"path": str(edited), "sha256": sha},
               _record("kept", medians=(1.5, 1.5)) | {"path": str(kept), "sha256": sha},
               _record("broken", status="failed", rule="wrong-output", reason="s0: outside atol") | {"path": str(broken), "sha256": sha}]
    for record in records:
        append_record(record, tmp_path / "runs.jsonl")
    edited.write_text("# a faster version, not yet measured\n")
    broken.write_text("# fixed, not yet measured\n")
    leaderboard.regenerate(tmp_path)
    text = (tmp_path / "leaderboard.md").read_text()
    assert "| **1. edited.py** · code changed since run r1 | " in text
    assert "| **2. kept.py** | " in text
    assert 'Rows marked "code changed" were measured on an earlier version of their file' in text
    assert f"- `{broken}` (code changed since that run): **wrong-output**" in text
    board = json.loads((tmp_path / "leaderboard.json").read_text())["softmax"]["NVIDIA H200"]
    assert [s["file_changed"] for s in board["ranked"]] == [True, False]


def test_a_partial_run_never_displaces_a_full_one(tmp_path):
    """Per key the board shows the newest full record; a partial one (`--shape`, fewer trials) only where no full one exists."""
    path = tmp_path / "runs.jsonl"
    full = _record("fast", medians=(1.0, 1.0), date="2026-11-29T10:00:00+00:00")
    full["checks"] = [{"shape": "c0", "trials": 6}]
    partial = _record("fast", medians=(4.0,), eager=(2.0,), date="2026-11-30T10:00:00+00:00") | {"partial": True, "run_id": "p1"}
    partial["checks"] = [{"shape": "c0", "trials": 3}]
    only_partial = _record("newcomer", medians=(1.5,), eager=(2.0,), date="2026-11-30T10:00:00+00:00") | {"partial": True, "run_id": "p1"}
    only_partial["checks"] = [{"shape": "c9", "trials": 3}]
    broken_partial = _record("fast", status="failed", rule="wrong-output", reason="c0: outside atol",
                             date="2026-12-01T10:00:00+00:00") | {"partial": True}
    for record in (_record("eager", kind="eager", medians=(2.0, 2.0), date="2026-11-29T10:00:00+00:00"), full, partial,
                   broken_partial, only_partial, _record("eager", kind="eager", medians=(2.0,), eager=(2.0,), date="2026-11-30T10:00:00+00:00") | {"partial": False, "run_id": "p1"}):
        append_record(record, path)
    board = leaderboard.build(read_records(path)[0])["softmax"]["NVIDIA H200"]
    ranked = {s["name"]: s for s in board["ranked"]}
    assert ranked["fast"]["date"].startswith("2026-11-29") and ranked["fast"]["partial"] is False  # the older full record still ranks
    assert ranked["newcomer"]["partial"] is True and ranked["newcomer"]["partial_shapes"] == ["c9", "s0"]
    assert not board["failed"]  # a partial failure does not hide the full record either
    leaderboard.regenerate(tmp_path)
    text = (tmp_path / "leaderboard.md").read_text()
    assert "| **1. fast.py** · run r1 | 2.00x |" in text
    assert "| **2. newcomer.py** · partial (shapes: c9, s0) | " in text
    assert 'Rows marked "partial" come from a run of only some shapes' in text


def test_the_latest_record_breaks_date_ties_by_file_order_and_skips_malformed_ones(tmp_path):
    path = tmp_path / "runs.jsonl"
    append_record(_record("fast", medians=(1.0, 1.0)), path)
    append_record(_record("fast", medians=(1.6, 1.6)), path)  # same date, later line: this one is shown
    malformed = [_record("bad_env") | {"env": "2026-12-01"}, _record("bad_status") | {"status": None},
                 _record("bad_timings") | {"timings": {"s0": 1.0}}, {k: v for k, v in _record("no_run_id").items() if k != "run_id"},
                 _record("bad_entry") | {"timings": ["s0"]}, _record("fast", medians=(0.1, 0.1), date="2026-12-02T10:00:00+00:00") | {"run_id": 7}]
    for record in malformed:
        append_record(record, path)
    with open(path, "a") as handle:
        handle.write("[1, 2]\n")
    summary = leaderboard.regenerate(tmp_path)
    assert summary["records"] == 2 and summary["skipped_lines"] == len(malformed) + 1
    ranked = json.loads((tmp_path / "leaderboard.json").read_text())["softmax"]["NVIDIA H200"]["ranked"]
    assert [(s["name"], s["timings"]["s0"]["median_ms"]) for s in ranked] == [("fast", 1.6)]
    cell = leaderboard.build(read_records(path)[0])["softmax"]["NVIDIA H200"]  # build() alone ignores them too
    assert [s["name"] for s in cell["ranked"]] == ["fast"]


def test_an_unsandboxed_row_is_marked_and_explained(tmp_path):
    path = tmp_path / "runs.jsonl"
    for record in (_record("eager", kind="eager", medians=(2.0, 2.0)) | {"sandbox": "landlock ABI 7 (fs, signals, net)"},
                   _record("boxed", medians=(1.0, 1.0)) | {"sandbox": "landlock ABI 7 (fs, signals, net)"},
                   _record("loose", medians=(1.5, 1.5)) | {"sandbox": "none: kernel without landlock"}):
        append_record(record, path)
    leaderboard.regenerate(tmp_path)
    text = (tmp_path / "leaderboard.md").read_text()
    assert "| **1. boxed.py** | " in text and "| **2. loose.py** · unsandboxed | " in text and "| *eager* (reference) | " in text
    assert "could write files and read the parent's (the harness's) memory" in text
    board = json.loads((tmp_path / "leaderboard.json").read_text())["softmax"]["NVIDIA H200"]
    assert [(s["name"], s["unsandboxed"], s["sandbox"]) for s in board["ranked"]] == [
        ("boxed", False, "landlock ABI 7 (fs, signals, net)"), ("loose", True, "none: kernel without landlock")]


def test_the_terminal_report_warns_loudly_about_an_unsandboxed_record():
    import io

    from harness.report import Reporter, unsandboxed_warning

    loose = _record("loose", medians=(1.5, 1.5)) | {"sandbox": "none: landlock unavailable [kernel 5.4]"}
    boxed = _record("boxed", medians=(1.0, 1.0)) | {"sandbox": "landlock ABI 7 (fs, signals, net)"}
    stream = io.StringIO()
    Reporter(stream=stream).table("softmax", "NVIDIA H200", [boxed, loose, _record("old", medians=(1.0, 1.0))])
    lines = [line for line in stream.getvalue().splitlines() if "UNSANDBOXED" in line]
    assert lines == [f"warning: {loose['path']} ran UNSANDBOXED (landlock unavailable [kernel 5.4]): its verdict is weaker"]
    assert unsandboxed_warning(boxed) is None and unsandboxed_warning(_record("old")) is None


def test_a_comment_only_edit_keeps_the_row_current_and_a_code_edit_does_not(tmp_path):
    from harness.records import code_hash

    commented, recoded = tmp_path / "commented.py", tmp_path / "recoded.py"
    for file in (commented, recoded):
        file.write_text('"""doc"""\nX = 1  # one\n')
    records = [_record("eager", kind="eager", medians=(2.0, 2.0))]
    records += [_record(f.stem, medians=(1.0, 1.0)) | {"path": str(f), "sha256": "old", "code_sha256": code_hash(f)} for f in (commented, recoded)]
    for record in records:
        append_record(record, tmp_path / "runs.jsonl")
    commented.write_text('"""A new docstring."""\n\nX = 1  # a longer comment\n')
    recoded.write_text('"""doc"""\nX = 2  # one\n')
    leaderboard.regenerate(tmp_path)
    board = json.loads((tmp_path / "leaderboard.json").read_text())["softmax"]["NVIDIA H200"]
    assert {s["name"]: s["file_changed"] for s in board["ranked"]} == {"commented": False, "recoded": True}


def test_a_renamed_file_keeps_its_figures_under_its_new_name(tmp_path):
    old, new = "solutions/softmax/fast_v4.py", "solutions/softmax/register_rows.py"
    records = [_record("eager", kind="eager", medians=(2.0, 2.0)), _record("fast_v4", medians=(1.0, 1.0)) | {"path": old, "sha256": "x"}]
    cell = leaderboard.build(records, renames={old: new})["softmax"]["NVIDIA H200"]
    assert [(s["path"], s["measured_as"], s["file_changed"]) for s in cell["ranked"]] == [(new, old, True)]
    text = leaderboard.render_markdown(leaderboard.build(records, renames={old: new}))
    assert "**1. register_rows.py** · code changed since run r1 (measured as fast_v4.py)" in text


def test_a_cpu_only_board_has_no_broken_table():
    records = [_record("simple", status="skipped", reason="needs a CUDA GPU") | {"device": "cpu (no CUDA device)"}]
    text = leaderboard.render_markdown(leaderboard.build(records))
    assert "Nothing was timed" in text and "Measured -" not in text and "|  |" not in text
