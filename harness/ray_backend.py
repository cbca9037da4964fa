"""`eval-batch --backend ray`: the batch's per-candidate work as Ray tasks, one GPU each (`pip install '.[ray]'`).

The same work as the local workers (batch.Evaluator: one Run, Run.evaluate_target, every check and the sandboxed
child), spread by Ray over a cluster's GPUs: per problem one task times the self-check and the baselines, then one
task per candidate (num_gpus=1; Ray sets CUDA_VISIBLE_DEVICES) is handed those baselines. A task sends the file's
bytes with it, so a node need not see the driver's folder; the problem is read from the same path on every node
(the repository's checkout, or a shared filesystem). The driver appends each record to the batch's runs.jsonl as it
returns, and writes the summary. A task whose process dies is retried once by Ray, then recorded as a crash.

GPU tasks run with max_calls=1 (a fresh process per task: a CUDA context is tied to the GPU it was made on);
CPU tasks reuse their process and its Run. Importing this module imports ray: the command line reports its
absence as a usage error.
"""
from __future__ import annotations

import datetime
import json
import os
import tempfile
import time
from pathlib import Path

import ray

from . import batch
from .problem import REPO_ROOT
from .records import append_record, read_records

_EVALUATORS = {}


def _evaluator(device: str, config: dict):
    import torch

    key = (device, json.dumps(config, sort_keys=True))
    if key not in _EVALUATORS:
        batch.use_content_keys()
        scratch = Path(tempfile.mkdtemp(prefix="harness-ray-"))
        _EVALUATORS[key] = batch.Evaluator(torch.device(device), scratch / "runs.jsonl", config)
    return _EVALUATORS[key]


def _baselines(ref: str, device: str, config: dict) -> dict:
    from .problem import ProblemError

    evaluator = _evaluator(device, config)
    try:
        medians, records = evaluator.baselines(ref, write=False)
    except ProblemError as error:
        return {"error": str(error)}
    return {"baselines": medians, "records": records, "seed": _seed(evaluator)}


def _candidate(ref: str, name: str, source: bytes, baselines: dict, built, device: str, config: dict) -> dict:
    import hashlib

    evaluator = _evaluator(device, config)
    folder = Path(tempfile.gettempdir()) / "harness-ray-candidates" / hashlib.sha256(source).hexdigest()[:20]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if not path.is_file() or path.read_bytes() != source:
        path.write_bytes(source)
    record = evaluator.evaluate(ref, str(path), baselines, built, write=False)
    return {"record": record, "seed": _seed(evaluator)}


def _seed(evaluator) -> dict:
    run = evaluator.run
    return {"run_id": run.run_id, "seed": run.seed, "date": run.env["date"]}


def run_batch_ray(refs: list, candidates: list, results: Path, options, title: str, console=None) -> dict:
    import torch

    cuda = (options.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    results.mkdir(parents=True, exist_ok=True)
    batch.use_content_keys()
    say = (lambda text: console.print(text)) if console is not None else (lambda text: None)
    if not ray.is_initialized():
        pythonpath = os.pathsep.join([str(REPO_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
        ray.init(address=os.environ.get("RAY_ADDRESS"), log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": pythonpath, "HARNESS_BUILD_KEY": "content"}})
    resources = {"num_gpus": 1, "max_calls": 1} if cuda else {"num_cpus": 1}
    retries = batch.MAX_ATTEMPTS - 1
    remote_baselines = ray.remote(max_retries=retries, **resources)(_baselines)
    remote_candidate = ray.remote(max_retries=retries, **resources)(_candidate)
    device = "cuda" if cuda else "cpu"
    config = options.config()

    existing, _ = read_records(results / "runs.jsonl")
    done = set(batch.latest_records(existing)) if options.resume else set()
    todo = [c for c in candidates if c.key not in done]
    say(f"{len(candidates)} candidate(s), {len(candidates) - len(todo)} already recorded; Ray: {ray.cluster_resources()}")
    started = time.monotonic()
    jobs = options.jobs or os.cpu_count() or 1
    built = batch.build_candidates(todo, jobs, torch.device(device), options.build_timeout, say) if todo else {}
    build_s = time.monotonic() - started
    progress = batch.Progress(len(todo), sum(1 for c in todo if built.get(str(c.path), (True,))[0]), console, 0)

    by_ref = {}
    for c in todo:
        by_ref.setdefault(c.ref, []).append(c)
    pending, errors, seeds, deaths = {}, {}, {}, 0
    for ref, group in by_ref.items():
        known = batch.recorded_baselines(existing, group[0].problem) if options.resume else {}
        if known:
            for c in group:
                pending[_submit(remote_candidate, c, known, built, device, config)] = c
        else:
            pending[remote_baselines.remote(ref, device, config)] = ref
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        item = pending.pop(ready[0])
        try:
            reply = ray.get(ready[0])
        except (ray.exceptions.RayTaskError, ray.exceptions.WorkerCrashedError, ray.exceptions.RayError) as error:
            deaths += 1
            if isinstance(item, batch.Candidate):
                append_record(batch.death_record(item, type(error).__name__, device), results / "runs.jsonl")
                progress.finished(item.record_path, {"status": "failed", "rule": "crash"})
            else:
                errors[item] = f"the task timing its baselines failed: {type(error).__name__}"
            continue
        seeds[reply.get("seed", {}).get("run_id")] = reply.get("seed")
        if isinstance(item, batch.Candidate):
            record = reply["record"]
            record["path"] = item.record_path  # where the driver has it, not the node's copy
            append_record(record, results / "runs.jsonl")
            progress.finished(item.record_path, {"status": record["status"], "rule": record.get("rule", ""),
                                                 "reason": record.get("reason", ""), "checked": batch.is_compiled(record)})
        elif reply.get("error"):
            errors[item] = reply["error"]
            say(f"[red]{item}: not evaluated: {reply['error']}[/red]")
        else:
            for record in reply["records"]:
                append_record(record, results / "runs.jsonl")
            for c in by_ref[item]:
                pending[_submit(remote_candidate, c, reply["baselines"], built, device, config)] = c
    for seed in seeds.values():
        if seed:
            append_record(seed, results / "seeds.jsonl")
    eval_s = time.monotonic() - started - build_s
    names = {c.ref: c.problem for c in candidates}
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "device": device,
            "workers": "ray", "results": str(results), "build_s": round(build_s, 1),
            "evaluate_s": round(eval_s, 1), "evaluated": progress.done, "backend": "ray"}
    return batch.write_summary(results, candidates, refs, title, meta, {names.get(r, r): e for r, e in errors.items()}, deaths)


def _submit(remote, candidate, baselines: dict, built: dict, device: str, config: dict):
    return remote.remote(candidate.ref, candidate.path.name, candidate.path.read_bytes(), baselines,
                         built.get(str(candidate.path)), device, config)
