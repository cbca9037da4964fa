"""Issue 4's adversarial suite: every known exploit in tests/adversarial/ is rejected, by the rule
that catches it, and the honest controls are not. Exploits that need no GPU run on the CPU (also in
CI); all but the CPU-only controls also run on a GPU when there is one."""
from pathlib import Path

import pytest
import yaml

from conftest import HAS_CUDA, SMALL, correctness_shapes, evaluate, sweep
from harness.problem import find_problem

HERE = Path(__file__).resolve().parent / "adversarial"
MANIFEST = yaml.safe_load((HERE / "manifest.yaml").read_text())
CPU_CASES = [e for e in MANIFEST if not e.get("gpu_only")]
GPU_CASES = [e for e in MANIFEST if not e.get("cpu_only")]


def _ids(entries):
    return [e["file"].removesuffix(".py") for e in entries]


def _assert_verdict(record, entry, allowed):
    if allowed == ["pass"]:
        assert record["status"] == "ok", f"honest code rejected: {record['rule']}: {record['reason']}"
        return
    assert record["status"] == "failed", f"{entry['file']} was accepted ({entry['note']})"
    assert record["rule"] in allowed, f"{entry['file']}: rejected by {record['rule']} ({record['reason']}), expected one of {allowed}"
    assert record["reason"] and "\n" not in record["reason"]


def test_manifest_covers_every_exploit_of_the_issue():
    assert {e["exploit"] for e in MANIFEST} >= set(range(0, 15))
    for entry in MANIFEST:
        assert (HERE / entry["file"]).is_file(), entry["file"]


# `make test` runs these and every exploit the static scan rejects; `make test-all` runs them all.
# honest_softmax_torch passes in test_cli and e04 (input mutated) has its twin in test_failures: `make test` runs two.
QUICK = {"e14_reference_cross_entropy.py", "e06_thread_cpu_softmax.py"}


@pytest.mark.parametrize("entry", sweep(CPU_CASES, HERE, QUICK))
def test_exploit_is_rejected_on_cpu(tmp_path, entry):
    record = evaluate(entry["problem"], HERE / entry["file"], tmp_path, device="cpu", trials=3, timeout=60,
                      shapes=correctness_shapes(entry["problem"]))
    _assert_verdict(record, entry, entry["expect"])


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("entry", GPU_CASES, ids=_ids(GPU_CASES))
def test_exploit_is_rejected_on_gpu(tmp_path, entry):
    problem = entry["problem"]
    shapes = SMALL[problem] + (find_problem(problem).default_shape.name,)  # the big shape exposes timing tricks
    record = evaluate(problem, HERE / entry["file"], tmp_path, device="cuda", shapes=shapes, trials=3, timeout=300, budget=0.3)
    allowed = entry["expect"] + (["not-custom-kernel"] if entry.get("pure_torch") and entry["expect"] != ["pass"] else [])
    _assert_verdict(record, entry, allowed)
