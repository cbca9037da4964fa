"""results/leaderboard.md and results/leaderboard.json, rebuilt from runs.jsonl.

Per problem and device: the latest run's baselines (eager, torch.compile) and other libraries as
reference rows (a library that did not import in the latest run keeps its last measured row, marked
with that run); each solution's latest record; correct solutions ranked by the geometric mean of their
speedup over eager (both measured in the same run) across the timing shapes; failures below, with why.
A solution file since removed from the repository drops off the board; its records stay in runs.jsonl. One
whose file changed since its record (sha256) stays, marked: its figures are the earlier version's.

A partial record (a run of only some shapes, or of fewer correctness trials) never displaces a full one:
the row shown is the newest full record, and a partial one only where no full record exists, marked
with the shapes it ran. A record whose process ran without the sandbox is marked "unsandboxed".
Records lacking the fields the board reads (or holding them with the wrong type) are skipped and
counted as unreadable.
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from .problem import REPO_ROOT
from .records import Record, code_hash, read_records, write_atomic
from .timing import HOST_BOUND, entry_is_host_bound


def _geomean(values):
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


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


def _latest(records: list) -> dict:
    """The record shown per (problem, device, kind, name-or-path): the newest full one; a partial record
    only where that key has no full record. A "skipped" record (another library that did not import on that
    run's machine) does not hide an earlier measured one: that row stays, marked with its run. Newest is by
    env.date, ties going to the later line of the file. Unreadable records are ignored."""
    best = {}
    for index, r in enumerate(records):
        if not readable(r):
            continue
        key = (r.get("problem"), r.get("device"), r.get("kind"), r.get("path") or r.get("name"))
        rank = (not is_partial(r), r["status"] != "skipped", r["env"]["date"], index)
        if key not in best or rank > best[key][0]:
            best[key] = (rank, r)
    return {key: r for key, (_, r) in best.items()}


def still_shipped(path: str | None) -> bool:
    """False for a solution recorded by its path inside the repository whose file is gone."""
    return not path or Path(path).is_absolute() or (REPO_ROOT / path).exists()


def file_changed(path: str | None, sha256: str | None) -> bool:
    """True for a solution whose file, as it is now, is not what the record measured (its sha256 differs):
    the figures belong to an earlier version of the file."""
    if not path or not sha256:
        return False
    file = Path(path) if Path(path).is_absolute() else REPO_ROOT / path
    try:
        return hashlib.sha256(file.read_bytes()).hexdigest() != sha256
    except OSError:
        return False


def build(records: list, keep=lambda path: True, changed=lambda path, sha256: False) -> dict:
    """{problem: {device: {...}}} with ranked solutions, reference rows and failures; solutions for
    which keep(path) is false are left out, and those for which changed(path, sha256) is true are marked."""
    board = {}
    for (problem, device, kind, _), r in sorted(_latest(records).items(), key=lambda kv: kv[1]["env"]["date"]):
        if kind == "solution" and not keep(r.get("path")):
            continue
        cell = board.setdefault(problem, {}).setdefault(device, {"references": [], "ranked": [], "failed": [], "skipped": [], "shapes": []})
        for t in r["timings"]:
            if t["shape"] not in cell["shapes"]:
                cell["shapes"].append(t["shape"])
        summary = {
            "name": r.get("name") or r.get("path") or "?", "path": r.get("path"), "kind": kind, "status": r["status"], "rule": r.get("rule", ""),
            "reason": r.get("reason", ""), "date": r["env"]["date"], "torch": str(r["env"].get("torch", "?")), "run_id": r["run_id"],
            "commit": r["env"].get("harness_commit"), "harness_sha": r["env"].get("harness_sha"), "sha256": r.get("sha256"),
            "timings": {t["shape"]: {k: t.get(k) for k in ("median_ms", "speedup_eager", "speedup_compile", "pct_copy_bw", "GBps", "TFLOPs", "reps", "se_pct", "processes", "device_ms", "rule", "error")}
                        | {"host_bound": entry_is_host_bound(t)} for t in r["timings"]},
            "geomean_speedup_eager": _geomean([t.get("speedup_eager") for t in r["timings"]]),
            "own_kernel_share": r["profile"].get("own_share") if isinstance(r.get("profile"), dict) else None,
            "versions": r["versions"] if isinstance(r.get("versions"), dict) else {},
            "requirement_versions": r["requirement_versions"] if isinstance(r.get("requirement_versions"), dict) else {},
            "file_changed": kind == "solution" and changed(r.get("path"), r.get("sha256")),
            "partial": is_partial(r), "partial_shapes": _shapes_run(r) if is_partial(r) else [],
            "sandbox": r["sandbox"] if isinstance(r.get("sandbox"), str) else None, "unsandboxed": is_unsandboxed(r),
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


def _row(s: dict, shapes: list, label: str) -> str:
    timed = sum(1 for shape in shapes if (s["timings"].get(shape) or {}).get("median_ms"))
    geomean = _fmt(s["geomean_speedup_eager"], ".2f", "x")
    if s["geomean_speedup_eager"] is not None and timed < len(shapes):
        geomean += f" ({timed} of {len(shapes)} shapes)"
    cells = [label, geomean]
    for shape in shapes:
        t = s["timings"].get(shape)
        if not t or t.get("error"):
            cells.append(f"failed: {(t['rule'] + ': ') if t.get('rule') else ''}{t['error'][:80]}" if t else "-")
            continue
        cells.append(f"{_fmt(t['median_ms'], '.4g')} ms · {_fmt(t.get('speedup_eager'), '.2f', 'x')} eager · "
                     f"{_fmt(t.get('speedup_compile'), '.2f', 'x')} compile · {_fmt(t.get('pct_copy_bw'), '.0f', '%')} BW"
                     + _host_mark(t))
    return "| " + " | ".join(cells) + " |"


def _versions(s: dict) -> str:
    """', quack-kernels 0.6.5' for a library's reference row (the release it timed), where the record says."""
    return "".join(f", {name} {version}" for name, version in sorted(s.get("versions", {}).items()))


def _marks(s: dict) -> str:
    """' · partial (shapes: a, b) · unsandboxed' for a row that is either."""
    mark = ""
    if s.get("partial"):
        mark += f" · partial (shapes: {', '.join(s['partial_shapes'])})" if s.get("partial_shapes") else " · partial"
    if s.get("unsandboxed"):
        mark += " · unsandboxed"
    return mark


def _host_mark(t: dict) -> str:
    """The † of a host-bound figure, with the number of processes whose medians it is the median of, and
    its device time with the host far ahead, where measured."""
    if not t.get("host_bound"):
        return ""
    return (" · host-bound†" + (f" ({t['processes']} processes)" if (t.get("processes") or 1) > 1 else "")
            + (f" · device {_fmt(t['device_ms'], '.4g')} ms" if t.get("device_ms") else ""))


def render_markdown(board: dict) -> str:
    out = ["# Leaderboard", "",
           "Generated from `results/runs.jsonl` by `make leaderboard`. Per problem and GPU: correct solutions ranked by the",
           "geometric mean of their speedup over eager PyTorch across the timing shapes, both timed in the same run",
           "(median of CUDA-event timings, L2 flushed before every call, fresh inputs). Each cell: median time · speedup",
           "over eager · over torch.compile · share of the device's measured copy bandwidth (bytes read + written).", ""]
    for problem in sorted(board):
        for device, cell in sorted(board[problem].items(), key=lambda kv: str(kv[0])):
            shapes = cell["shapes"]
            dates = sorted({s["date"][:10] for group in ("ranked", "references") for s in cell[group]})
            torches = sorted({s["torch"] for group in ("ranked", "references") for s in cell[group]})
            # The hash of the harness sources names the code that timed them (a git commit can be stale on a copied tree).
            harnesses = sorted({s["harness_sha"] for group in ("ranked", "references") for s in cell[group] if s.get("harness_sha")})
            out += [f"## {problem} on {device}", "", f"Measured {', '.join(dates) or '-'}; torch {', '.join(torches) or '-'}"
                    + (f"; harness sources {', '.join(harnesses)}" if harnesses else "") + ".", ""]
            out.append("| solution | geomean vs eager | " + " | ".join(shapes) + " |")
            out.append("|" + "---|" * (len(shapes) + 2))
            newest = max((s for group in ("ranked", "references") for s in cell[group]), key=lambda s: s["date"], default=None)
            earlier = lambda s: f" · run {s['run_id'][:6]}" if newest and s["run_id"] != newest["run_id"] else ""  # noqa: E731
            stale = lambda s: f" · file changed since run {s['run_id'][:6]}" if s.get("file_changed") else ""  # noqa: E731
            for s in cell["ranked"]:
                out.append(_row(s, shapes, f"**{s['rank']}. {Path(s['path']).name if s['path'] else s['name']}**{earlier(s)}{stale(s)}{_marks(s)}"))
            for s in cell["references"]:
                out.append(_row(s, shapes, f"*{s['name']}* (reference{_versions(s)}){earlier(s)}{_marks(s)}"))
            with_requirements = [s for s in cell["references"] if s.get("requirement_versions")]
            if with_requirements:
                out += [""] + [f"*{s['name']}* ran with " + ", ".join(f"{n} {v}" for n, v in sorted(s["requirement_versions"].items()))
                               + " (what it requires, as installed)." for s in with_requirements]
            if any(s.get("file_changed") for s in cell["ranked"]):
                out += ["", "Rows marked \"file changed\" were measured on an earlier version of their file (the sha256 in the"
                            " record is not the file's now; `git log` on the file shows what changed): the figures are that"
                            " version's until `make eval` runs again."]
            if any(earlier(s) for group in ("ranked", "references") for s in cell[group]):
                out += ["", f"Rows marked \"run X\" come from an earlier run than the latest ({newest['run_id'][:6]}, {newest['date'][:10]}),"
                            " which did not time them; their speedups are against that earlier run's eager and torch.compile."]
            shown = [s for group in ("ranked", "references", "failed", "skipped") for s in cell[group]]
            if any(s.get("partial") for s in shown):
                out += ["", "Rows marked \"partial\" come from a run of only some shapes (those listed) or of fewer correctness"
                            " trials than the default; they are shown only because no full run of them is recorded, and a full"
                            " record, even an older one, always takes their place."]
            if any(s.get("unsandboxed") for s in shown):
                out += ["", "Rows marked \"unsandboxed\" ran without the sandbox (the record's `sandbox` field says why): the"
                            " solution's process could write files and read the parent's (the harness's) memory, so its"
                            " verdict and figures are weaker evidence than a sandboxed row's."]
            timings = [t for group in ("ranked", "references") for x in cell[group] for t in x["timings"].values()]
            if any(t.get("host_bound") for t in timings):
                out += ["", f"† host-bound: issuing the call (its launches, or a synchronisation inside it) took at least "
                            f"{HOST_BOUND:.0%} of its", "median, so the figure measures the host CPU as much as the GPU; on the H200 "
                            "machine such figures moved by", "up to 3.1x between processes and up to 60% between runs, even as medians "
                            "over processes, while their device time repeated within 0.5% (`docs/perf-notes.md`).",
                            "Compare them within one run only."]
                if any((t.get("processes") or 1) > 1 for t in timings if t.get("host_bound")):
                    out.append("Those marked (N processes) were timed in N fresh processes; the figure is the median of their medians.")
                if any(t.get("device_ms") for t in timings if t.get("host_bound")):
                    out.append("\"device\": the same calls' median with the host queueing them far ahead (a device-side wait first),"
                               " the part of the figure that does not follow the host's speed; not used for ranking.")
            out.append("")
            if cell["failed"]:
                out += ["Rejected or failed:", ""]
                out += [f"- `{s['path'] or s['name']}`{' (file changed since that run)' if s.get('file_changed') else ''}{_marks(s)}:"
                        f" **{s['rule']}**: {s['reason']}" for s in cell["failed"]]
                out.append("")
            if cell["skipped"]:
                out += ["Not run:", ""] + [f"- `{s['path'] or s['name']}`{_marks(s)}: {s['reason']}" for s in cell["skipped"]] + [""]
    if len(out) == 6:
        out.append("No runs recorded yet: `make eval PROBLEM=<name>` on a GPU machine.")
    return "\n".join(out) + "\n"


def regenerate(results_dir: Path) -> dict:
    records, skipped = read_records(results_dir / "runs.jsonl")
    usable = [r for r in records if readable(r)]
    skipped += len(records) - len(usable)  # a line that parsed but lacks the fields the board reads counts as unreadable
    board = build(usable, keep=still_shipped, changed=file_changed)
    write_atomic(results_dir / "leaderboard.md", render_markdown(board))
    write_atomic(results_dir / "leaderboard.json", json.dumps(board, indent=1, sort_keys=True, default=str) + "\n")
    return {"records": len(usable), "skipped_lines": skipped, "problems": sorted(board)}
