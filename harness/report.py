"""Terminal output: progress lines while a run goes, then one table per problem."""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .rules import one_line


class Reporter:
    def __init__(self, quiet: bool = False, stream=None):
        self.console = Console(file=stream or sys.stderr, highlight=False, soft_wrap=True)
        self.quiet = quiet
        self.start = time.monotonic()  # progress lines say when they happened: a log shows where the time went

    def __call__(self, message: str = "", record: dict | None = None):
        if self.quiet:
            return
        if record is not None:
            self.console.print(f"  [bold]{_plain(record.get('path') or record['name'])}[/bold]: {verdict_text(record)}")
        elif message:
            self.console.print(f"  [dim]{time.monotonic() - self.start:6.1f} s  {escape(message)}[/dim]")

    def heading(self, text: str):
        if not self.quiet:
            self.console.rule(text)

    def table(self, problem: str, device: str, records: list):
        shapes = []
        for r in records:
            for t in r["timings"]:
                if t["shape"] not in shapes:
                    shapes.append(t["shape"])
        table = Table(title=f"{problem} on {device}", show_lines=False)
        table.add_column("target")
        table.add_column("verdict")
        for shape in shapes:
            table.add_column(shape, justify="right")
        for r in records:
            timings = {t["shape"]: t for t in r["timings"]}
            cells = []
            for shape in shapes:
                t = timings.get(shape)
                cells.append(timing_cell(t) if t else "-")
            label = Path(r["path"]).name if r.get("path") else r["name"]  # full paths are in the lines below
            table.add_row(_plain(label), verdict_text(r, short=True), *cells)
        self.console.print(table)
        for r in records:
            line = unsandboxed_warning(r)
            if line:
                self.console.print(f"[bold yellow]{escape(line)}[/bold yellow]")
            if r["status"] != "ok" and r.get("reason"):
                self.console.print(f"[red]{_plain(r.get('path') or r['name'])}[/red]: {_plain(r.get('rule') or r['status'])}: {_plain(r['reason'])}")
            for t in r["timings"]:
                if "error" in t and r["status"] == "ok":
                    self.console.print(f"[yellow]{_plain(r['name'])}[/yellow] on {t['shape']}: {_plain(t.get('rule', 'failed'))}: {_plain(t['error'])}")
            for warning in r.get("warnings", [])[:4]:
                if r["kind"] == "solution":
                    self.console.print(f"[yellow]warning[/yellow] {_plain(r.get('path'))}: {_plain(warning)}")


def _plain(text) -> str:
    """Record text printed as itself: a reason can come from the solution (its exception's text), and rich would
    read "[/x]" in it as markup (and fail on it, ending the run)."""
    return escape(one_line(text))


def unsandboxed_warning(record: dict) -> str | None:
    """The warning for a record whose process ran without the sandbox (its `sandbox` field starts with
    "none", e.g. "none: landlock unavailable"); None for a sandboxed record or one written before the field."""
    sandbox = record.get("sandbox")
    if not isinstance(sandbox, str) or not sandbox.startswith("none"):
        return None
    reason = sandbox[len("none"):].lstrip(":").strip() or "no reason recorded"
    return f"warning: {record.get('path') or record['name']} ran UNSANDBOXED ({reason}): its verdict is weaker"


def _num(value, spec):
    return "-" if value is None or not math.isfinite(value) else format(value, spec)


def timing_cell(t: dict) -> str:
    if "error" in t:
        return f"failed: {t.get('rule', 'error')}"
    parts = [f"{_num(t['median_ms'], '.4g')} ms"]
    if "speedup_eager" in t:
        parts.append(f"{_num(t['speedup_eager'], '.2f')}x eager")
    if "speedup_compile" in t:
        parts.append(f"{_num(t['speedup_compile'], '.2f')}x compile")
    if "pct_copy_bw" in t:
        parts.append(f"{_num(t['pct_copy_bw'], '.0f')}% BW")
    if t.get("processes", 1) > 1:
        parts.append(f"median of {t['processes']} processes")
    if t.get("device_ms"):
        parts.append(f"device {_num(t['device_ms'], '.4g')} ms")
    return "\n".join(parts)


def verdict_text(record: dict, short: bool = False) -> str:
    if record["status"] == "ok":
        checked = sum(c["trials"] for c in record["checks"])
        text = "correct" if record["kind"] == "solution" else "reference"
        if record.get("versions"):  # another library's row: the release that ran
            text += " " + _plain(", ".join(f"{name} {version}" for name, version in sorted(record["versions"].items())))
        if checked and not short:
            text += f" ({checked} trials over {len(record['checks'])} shapes)"
        return f"[green]{text}[/green]"
    if record["status"] == "skipped":
        return "[yellow]not run[/yellow]" + ("" if short else f": {_plain(record['reason'])}")
    return f"[red]REJECTED: {_plain(record['rule'])}[/red]" + ("" if short else f": {_plain(record['reason'])}")
