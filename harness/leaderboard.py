"""results/leaderboard.md and results/leaderboard.json, rebuilt from runs.jsonl.

Per problem and device: the latest run's baselines (eager, torch.compile) and other libraries as
reference rows (a library that did not import in the latest run keeps its last measured row, marked
with that run); each solution's latest record; correct solutions ranked by the geometric mean of their
speedup over eager (both measured in the same run) across the timing shapes; failures below, with why.
A solution file since removed from the repository drops off the board; its records stay in runs.jsonl. One
whose file changed since its record (sha256) stays, marked: its figures are the earlier version's.

A partial record (a run of only some shapes, or of fewer correctness trials) never displaces a full one:
the row shown is the newest full record, and a partial one only where no full record exists, marked
with the shapes it ran. A record whose process ran without the sandbox is marked "unsandboxed", and one whose
forward called some of the reference's own ops (allowed where the problem says `custom: partial`, as imported
KernelBench problems do) "with reference ops"; both are ranked like any other.
Records lacking the fields the board reads (or holding them with the wrong type) are skipped and
counted as unreadable.
"""
from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

from .problem import REPO_ROOT
from .records import Record, code_hash, file_sha256, read_records, write_atomic
from .rules import one_line
from .timing import HOST_BOUND, entry_is_host_bound


def geomean(values) -> float | None:
    """The geometric mean of the finite positive numbers among `values` (None when there are none)."""
    values = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v) and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def readable(record) -> bool:
    """True for a record holding the fields the board reads, of the right types (records.Record.from_json)."""
    return Record.from_json(record) is not None


def is_partial(record: dict) -> bool:
    """A run of only some of the problem's shapes, or of fewer correctness trials than the default. A record
    without the field (written before it existed) counts as full; any value but false/absent counts as partial."""
    return record.get("partial") not in (None, False)


def is_unsandboxed(record: dict) -> bool:
    sandbox = record.get("sandbox")
    return isinstance(sandbox, str) and sandbox.startswith("none")


def _shapes_run(record: dict) -> list:
    """The shapes a record checked or timed, in order."""
    checks = record.get("checks") if isinstance(record.get("checks"), list) else []
    names = [c.get("shape") for c in checks if isinstance(c, dict)] + [t["shape"] for t in record["timings"]]
    return [str(n) for n in dict.fromkeys(names) if n]


def _latest(records: list, rename=lambda path: path) -> dict:
    """The record shown per (problem, device, kind, name-or-path): the newest full one; a partial record
    only where that key has no full record. A "skipped" record (another library that did not import on that
    run's machine) does not hide an earlier measured one: that row stays, marked with its run. Newest is by
    env.date, ties going to the later line of the file. Unreadable records are ignored."""
    best = {}
    for index, r in enumerate(records):
        if not readable(r):
            continue
        key = (r.get("problem"), r.get("device"), r.get("kind"), rename(r.get("path")) or r.get("name"))
        rank = (not is_partial(r), r["status"] != "skipped", r["env"]["date"], index)
        if key not in best or rank > best[key][0]:
            best[key] = (rank, r)
    return {key: r for key, (_, r) in best.items()}


def git_renames() -> dict:
    """{old path: path now} for solution files that git saw renamed (following chains), so that a row keeps
    its last figures under the file's present name until it is measured again. {} without git."""
    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), "log", "--diff-filter=R", "--name-status", "--format=", "-M", "--", "solutions"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return {}
    moves = {}
    for line in reversed(out.stdout.splitlines() if out.returncode == 0 else []):  # oldest first
        parts = line.split("\t")
        if len(parts) == 3 and parts[0].startswith("R"):
            moves = {old: (parts[2] if new == parts[1] else new) for old, new in moves.items()}
            moves[parts[1]] = parts[2]
    return moves


def still_shipped(path: str | None) -> bool:
    """False for a solution recorded by its path inside the repository whose file is gone."""
    return not path or Path(path).is_absolute() or (REPO_ROOT / path).exists()


def file_changed(path: str | None, sha256: str | None, code_sha256: str | None = None) -> bool:
    """True for a solution whose code, as it is now, is not what the record measured: the figures belong
    to an earlier version. Records that carry a code hash compare code only (a comment-only edit keeps the
    row current); older ones compare the whole file's sha256."""
    if not path or not (sha256 or code_sha256):
        return False
    file = Path(path) if Path(path).is_absolute() else REPO_ROOT / path
    try:
        if code_sha256:
            return code_hash(file) != code_sha256
        return file_sha256(file) != sha256
    except OSError:
        return False


def build(records: list, keep=lambda path: True, changed=lambda path, sha256, code_sha256: False, renames=None) -> dict:
    """{problem: {device: {...}}} with ranked solutions, reference rows and failures; solutions for
    which keep(path) is false are left out, and those for which changed(path, sha256, code_sha256) is true
    are marked. `renames` ({old path: new path}) files a record of a renamed file under its new name."""
    renames = renames or {}
    rename = lambda path: renames.get(path, path)  # noqa: E731
    board = {}
    for (problem, device, kind, _), r in sorted(_latest(records, rename).items(), key=lambda kv: kv[1]["env"]["date"]):
        path = rename(r.get("path"))
        if kind == "solution" and not keep(path):
            continue
        cell = board.setdefault(problem, {}).setdefault(device, {"references": [], "ranked": [], "failed": [], "skipped": [], "shapes": []})
        for t in r["timings"]:
            if t["shape"] not in cell["shapes"]:
                cell["shapes"].append(t["shape"])
        summary = {
            "name": r.get("name") or path or "?", "path": path, "measured_as": r.get("path") if path != r.get("path") else None, "kind": kind, "status": r["status"], "rule": r.get("rule", ""),
            "reason": r.get("reason", ""), "date": r["env"]["date"], "torch": str(r["env"].get("torch", "?")), "run_id": r["run_id"],
            "commit": r["env"].get("harness_commit"), "harness_sha": r["env"].get("harness_sha"), "sha256": r.get("sha256"),
            "timings": {t["shape"]: {k: t.get(k) for k in ("median_ms", "speedup_eager", "speedup_compile", "pct_copy_bw", "pct_floor", "floor_bound", "GBps", "TFLOPs", "reps", "se_pct", "processes", "device_ms", "rule", "error")}
                        | {"host_bound": entry_is_host_bound(t)} for t in r["timings"]},
            "geomean_speedup_eager": geomean([t.get("speedup_eager") for t in r["timings"]]),
            "own_kernel_share": r["profile"].get("own_share") if isinstance(r.get("profile"), dict) else None,
            "versions": r["versions"] if isinstance(r.get("versions"), dict) else {},
            "requirement_versions": r["requirement_versions"] if isinstance(r.get("requirement_versions"), dict) else {},
            "file_changed": kind == "solution" and (path != r.get("path") or changed(path, r.get("sha256"), r.get("code_sha256"))),
            "env": r["env"],
            "partial": is_partial(r), "partial_shapes": _shapes_run(r) if is_partial(r) else [],
            "sandbox": r["sandbox"] if isinstance(r.get("sandbox"), str) else None, "unsandboxed": is_unsandboxed(r),
            "uses_reference_ops": r.get("uses_reference_ops") is True,
        }
        if r["status"] == "failed":
            cell["failed"].append(summary)
        elif r["status"] == "skipped":
            cell["skipped"].append(summary)
        elif kind == "solution":
            cell["ranked"].append(summary)
        else:
            cell["references"].append(summary)
    for devices in board.values():
        for cell in devices.values():
            cell["ranked"].sort(key=lambda s: -(s["geomean_speedup_eager"] or 0))
            for rank, s in enumerate(cell["ranked"], 1):
                s["rank"] = rank
    return board


def _fmt(value, spec, suffix=""):
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:{spec}}{suffix}"


def _speedup(s: dict, t: dict, kind: str) -> str:
    """'1.00x' for the baseline itself, the measured ratio otherwise."""
    if s["kind"] == kind:
        return "1.00x"
    return _fmt(t.get(f"speedup_{kind}"), ".2f", "x")


def _share(t: dict) -> str:
    """The share of the floor (the least time the bytes or flops allow), or of the copy ceiling in older records."""
    if t.get("pct_floor") is not None:
        return f"{_fmt(t['pct_floor'], '.0f', '%')} of floor" + (" (flops)" if t.get("floor_bound") == "flops" else "")
    if t.get("pct_copy_bw") is not None:
        return f"{_fmt(t['pct_copy_bw'], '.0f', '%')} copy BW"
    return "no ceiling (CPU)"


def _row(s: dict, shapes: list, label: str, notes: list) -> str:
    """One table row; a shape's failure is a numbered note (appended to `notes`), whole, below the table."""
    timed = sum(1 for shape in shapes if (s["timings"].get(shape) or {}).get("median_ms"))
    geomean = "1.00x" if s["kind"] == "eager" else _fmt(s["geomean_speedup_eager"], ".2f", "x")
    if s["geomean_speedup_eager"] is not None and timed < len(shapes):
        geomean += f" ({timed} of {len(shapes)} shapes)"
    cells = [label, geomean]
    for shape in shapes:
        t = s["timings"].get(shape)
        if not t:
            cells.append("-")
        elif t.get("error"):
            notes.append(f"{s['name']} at {shape}: **{t.get('rule') or 'failed'}**: {_text(t['error'])}")
            cells.append(f"failed ({t.get('rule') or 'see'} note {len(notes)})")
        else:
            cells.append(f"{_fmt(t['median_ms'], '.4g')} ms · {_speedup(s, t, 'eager')} eager · {_speedup(s, t, 'compile')} compile · "
                         f"{_share(t)}" + _host_mark(t))
    return "| " + " | ".join(cells) + " |"


def _hardware(env: dict) -> str:
    """One line naming the GPU, its software and the ceilings this run measured."""
    gpu = [f"{env.get('sm_count')} SMs" if env.get("sm_count") else "", f"sm_{env['capability'].replace('.', '')}" if env.get("capability") else "",
           f"{env['memory_bytes'] / 2**30:.0f} GiB" if env.get("memory_bytes") else ""]
    clocks = ", ".join(f"{label} {env[key]} MHz" for key, label in (("sm_clock_max_MHz", "SM max"), ("memory_clock_max_MHz", "memory max"),
                                                                     ("sm_clock_applications_MHz", "SM application")) if env.get(key))
    ceilings = ", ".join(f"{label} {env[key] / 1e3:.2f} TB/s" for key, label in (("copy_bw_GBps", "copy"), ("read_bw_GBps", "read")) if env.get(key))
    if env.get("bf16_matmul_TFLOPs"):
        ceilings += f", bf16 matrix {env['bf16_matmul_TFLOPs']:.0f} TFLOP/s"
    detail = ", ".join(p for p in gpu if p)
    parts = [f"{env.get('gpu', '?')}" + (f" ({detail})" if detail else ""), f"driver {env.get('driver', '?')}", f"CUDA {env.get('cuda', '?')}",
             f"Python {env.get('python', '?')}"]
    return ("Hardware and software: " + "; ".join(parts) + (f"; clocks: {clocks}" if clocks else "") + "."
            + (f" Ceilings measured in that run: {ceilings}." if ceilings else ""))


def _versions(s: dict) -> str:
    """', quack-kernels 0.6.5' for a library's reference row (the release it timed), where the record says."""
    return "".join(f", {name} {version}" for name, version in sorted(s.get("versions", {}).items()))


def _marks(s: dict) -> str:
    """' · partial (shapes: a, b) · unsandboxed · with reference ops' for a row that is any of them."""
    mark = ""
    if s.get("partial"):
        mark += f" · partial (shapes: {', '.join(s['partial_shapes'])})" if s.get("partial_shapes") else " · partial"
    if s.get("unsandboxed"):
        mark += " · unsandboxed"
    if s.get("uses_reference_ops"):
        mark += " · with reference ops"
    return mark


def _host_mark(t: dict) -> str:
    """The † of a host-bound figure, with the number of processes whose medians it is the median of, and
    its device time with the host far ahead, where measured."""
    if not t.get("host_bound"):
        return ""
    shown = t.get("device_ms") and t.get("median_ms") and t["device_ms"] < 0.98 * t["median_ms"]
    return (" · host-bound†" + (f" ({t['processes']} processes)" if (t.get("processes") or 1) > 1 else "")
            + (f" · device {_fmt(t['device_ms'], '.4g')} ms" if shown else ""))


HEADER = ["# Leaderboard", "",
          "Generated from `results/runs.jsonl` by `make leaderboard`. Per problem and GPU: correct solutions ranked by the",
          "geometric mean of their speedup over eager PyTorch across the timing shapes, both timed in the same run",
          "(median of CUDA-event timings, L2 flushed before every call, fresh inputs). Each cell: median time · speedup",
          "over eager · over torch.compile · share of the floor: the least time the shape's bytes allow at the ceilings",
          "measured in that run (reads at the read ceiling, writes at what a copy costs), or its flops at the bf16 matrix",
          "rate where that is longer (marked flops). 100% of floor is the physical limit; the harness rejects a time",
          "more than 5% below it (`impossible-time`).", ""]


def _footnotes(cell: dict, newest: dict | None, earlier) -> list:
    """The notes that explain the marks used in one table, and only those."""
    out = []
    shown = [s for group in ("ranked", "references", "failed", "skipped") for s in cell[group]]
    if any(s.get("file_changed") for s in cell["ranked"]):
        out += ["", "Rows marked \"code changed\" were measured on an earlier version of their file (its code, comments and"
                    " docstrings aside, is not what the record measured; \"measured as\" names the file's name then): the figures"
                    " are that version's until `make eval` runs again."]
    if any(earlier(s) for group in ("ranked", "references") for s in cell[group]):
        out += ["", f"Rows marked \"run X\" come from an earlier run than the latest ({newest['run_id'][:6]}, {newest['date'][:10]}),"
                    " which did not time them; their speedups are against that earlier run's eager and torch.compile."]
    timings = [t for group in ("ranked", "references") for x in cell[group] for t in x["timings"].values()]
    if any(t.get("pct_floor") is None and t.get("pct_copy_bw") is not None for t in timings):
        out += ["", "\"copy BW\": records older than the floor figure give bytes read and written over the measured copy"
                    " bandwidth instead; a read-mostly kernel can pass 100% of it, since reading alone is faster than copying."]
    if any(s.get("partial") for s in shown):
        out += ["", "Rows marked \"partial\" come from a run of only some shapes (those listed) or of fewer correctness"
                    " trials than the default; they are shown only because no full run of them is recorded, and a full"
                    " record, even an older one, always takes their place."]
    if any(s.get("unsandboxed") for s in shown):
        out += ["", "Rows marked \"unsandboxed\" ran without the sandbox (the record's `sandbox` field says why): the"
                    " solution's process could write files and read the parent's (the harness's) memory, so its"
                    " verdict and figures are weaker evidence than a sandboxed row's."]
    if any(s.get("uses_reference_ops") for s in shown):
        out += ["", "Rows marked \"with reference ops\" call some of the reference's own operators beside kernels of their"
                    " own, which the problem allows (`custom: partial` in its problem.yaml, as for imported KernelBench"
                    " problems): their speedups are not those of a fully custom solution."]
    if any(t.get("host_bound") for t in timings):
        out += ["", f"† host-bound: issuing the call (its launches, or a synchronisation inside it) took at least {HOST_BOUND:.0%} of"
                    " its median, so the figure follows the host CPU as much as the GPU, and moves between processes and runs"
                    " far more than a device-bound one (`docs/perf-notes.md` gives the spread measured). Compare such figures"
                    " within one run only."]
        if any((t.get("processes") or 1) > 1 for t in timings if t.get("host_bound")):
            out.append("Those marked (N processes) were timed in N fresh processes; the figure is the median of their medians.")
        if any(t.get("device_ms") for t in timings if t.get("host_bound")):
            out.append("\"device\": the same calls' median with the host queueing them far ahead (a device-side wait first), the"
                       " part of the figure that does not follow the host; shown where it is below the median, never ranked.")
    return out


def _text(text) -> str:
    """Record text (a reason, a file name) as inert markdown on one line: a solution chooses its exception's text,
    a batch its candidates' names, and neither may start a section, a table row, a comment, a link or an image."""
    text = one_line(text).replace("`", "'").replace("<", "&lt;")
    for mark in "\\|[]*":
        text = text.replace(mark, "\\" + mark)
    return text


def _label(s: dict, earlier, marks: str) -> str:
    name = _text(Path(s["path"]).name if s["path"] else s["name"])
    if s["kind"] != "solution":
        return f"*{s['name']}* (reference{_versions(s)}){earlier(s)}{marks}"
    changed = ""
    if s.get("file_changed"):
        changed = f" · code changed since run {s['run_id'][:6]}" + (f" (measured as {Path(s['measured_as']).name})" if s.get("measured_as") else "")
    return f"**{s['rank']}. {name}**{earlier(s)}{changed}{marks}"


def render_markdown(board: dict) -> str:
    out = list(HEADER)
    for problem in sorted(board):
        for device, cell in sorted(board[problem].items(), key=lambda kv: str(kv[0])):
            shapes = cell["shapes"]
            timed = [s for group in ("ranked", "references") for s in cell[group]]
            newest = max(timed or [s for group in ("failed", "skipped") for s in cell[group]], key=lambda s: s["date"], default=None)
            out += [f"## {problem} on {device}", ""]
            if timed and shapes:
                dates = sorted({s["date"][:10] for s in timed})
                # The hash of the harness sources names the code that timed them (a git commit can be stale on a copied tree).
                harnesses = sorted({s["harness_sha"] for s in timed if s.get("harness_sha")})
                torches = sorted({s["torch"] for s in timed})
                out += [f"Measured {', '.join(dates)}; torch {', '.join(torches)}" + (f"; harness sources {', '.join(harnesses)}" if harnesses else "") + ".",
                        _hardware(newest.get("env") or {}), ""]
                out.append("| solution | geomean vs eager | " + " | ".join(shapes) + " |")
                out.append("|" + "---|" * (len(shapes) + 2))
                earlier = lambda s: f" · run {s['run_id'][:6]}" if s["run_id"] != newest["run_id"] else ""  # noqa: E731
                notes = []
                for s in cell["ranked"] + cell["references"]:
                    out.append(_row(s, shapes, _label(s, earlier, _marks(s)), notes))
                out += [""] + [f"{n}. {text}" for n, text in enumerate(notes, 1)] if notes else []
                with_requirements = [s for s in cell["references"] if s.get("requirement_versions")]
                if with_requirements:
                    out += [""] + [f"*{s['name']}* ran with " + ", ".join(f"{n} {v}" for n, v in sorted(s["requirement_versions"].items()))
                                   + " (what it requires, as installed)." for s in with_requirements]
                out += _footnotes(cell, newest, earlier)
            else:
                out.append("Nothing was timed (every target failed or was skipped).")
            out.append("")
            if cell["failed"]:
                out += ["Rejected or failed:", ""]
                out += [f"- `{_text(s['path'] or s['name'])}`{' (code changed since that run)' if s.get('file_changed') else ''}"
                        f"{_marks(s)}: **{s['rule']}**: {_text(s['reason'])}" for s in cell["failed"]]
                out.append("")
            if cell["skipped"]:
                out += ["Not run:", ""] + [f"- `{_text(s['path'] or s['name'])}`{_marks(s)}: {_text(s['reason'])}" for s in cell["skipped"]] + [""]
    if len(out) == len(HEADER):
        out.append("No runs recorded yet: `make eval PROBLEM=<name>` on a GPU machine.")
    return "\n".join(out) + "\n"


def regenerate(results_dir: Path) -> dict:
    records, skipped = read_records(results_dir / "runs.jsonl")
    usable = [r for r in records if readable(r)]
    skipped += len(records) - len(usable)  # a line that parsed but lacks the fields the board reads counts as unreadable
    board = build(usable, keep=still_shipped, changed=file_changed, renames=git_renames())
    write_atomic(results_dir / "leaderboard.md", render_markdown(board))
    write_atomic(results_dir / "leaderboard.json", json.dumps(board, indent=1, sort_keys=True, default=str) + "\n")
    return {"records": len(usable), "skipped_lines": skipped, "problems": sorted(board)}
