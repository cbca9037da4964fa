"""Trust boundary, class 1 (forged records), softmax.

At import the solution looks for the repository's results/runs.jsonl (from harness.problem.REPO_ROOT and
from its own file's parents), reads it (run ids, seeds, the best medians to beat) and appends a fake record
that says it is correct and the fastest of its problem. It tries every way it knows, quietly: a plain
append, os.open with O_APPEND, and a hard link / rename / symlink through the folders it may write (its
build folder, its scratch). Then it is an honest pure-torch softmax, so the only thing at stake is the
attempt: a file that scores "ok" here after touching the record file is a hole.
Expected: sandbox-violation (the guard sees an open for writing outside scratch), and the record file
unchanged in every case.
"""
import importlib
import json
import os
import time
from pathlib import Path

import torch
import torch.nn as nn

MARKER = "x01-forged-record"


def _candidates():
    found = []
    try:  # the child has the harness imported already (the name is spelt so that the static scan misses it)
        found.append(Path(importlib.import_module("har" + "ness.problem").REPO_ROOT) / "results" / "runs.jsonl")
    except Exception:  # noqa: BLE001
        pass
    for parent in Path(__file__).resolve().parents:
        found.append(parent / "results" / "runs.jsonl")
    seen, unique = set(), []
    for path in found:
        if str(path) not in seen:
            seen.add(str(path))
            unique.append(path)
    return unique


def _fake_record() -> bytes:
    record = {"run_id": "f0f0f0f0f0f0", "problem": "softmax", "kind": "solution", "name": "x01_forge_records_softmax",
              "path": "solutions/softmax/x01.py", "status": "ok", "rule": "", "reason": MARKER, "checks": [],
              "timings": [{"shape": "8192x16384_fp32", "dtype": "float32", "median_ms": 0.0001, "speedup_eager": 999.0}],
              "date": time.strftime("%Y-%m-%d")}
    return ("\n" + json.dumps(record) + "\n").encode()


def _attack():
    learned = {}
    for path in _candidates():
        try:  # read: learn run ids and seeds
            learned[str(path)] = path.read_text()[-4096:]
        except Exception:  # noqa: BLE001
            pass
        try:  # the plain way
            with open(path, "ab") as handle:
                handle.write(_fake_record())
        except Exception:  # noqa: BLE001
            pass
        try:
            fd = os.open(str(path), os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, _fake_record())
            finally:
                os.close(fd)
        except Exception:  # noqa: BLE001
            pass
        for folder in (os.environ.get("TORCH_EXTENSIONS_DIR"), os.environ.get("TMPDIR"), os.getcwd()):
            if not folder:
                continue
            alias = os.path.join(folder, "runs-alias.jsonl")
            for make in (os.link, os.symlink):
                try:
                    make(str(path), alias)
                    with open(alias, "ab") as handle:
                        handle.write(_fake_record())
                except Exception:  # noqa: BLE001
                    pass
    return learned


_LEARNED = _attack()


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        e = (xf - xf.amax(dim=-1, keepdim=True)).exp()
        return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)
