"""Every failure kind becomes a one-line reason for that solution, and the run goes on."""
import pytest

from conftest import evaluate, write_solution

HONEST_SOFTMAX = """
import torch
class ModelNew(torch.nn.Module):
    def forward(self, x):
        e = (x.float() - x.float().amax(-1, keepdim=True)).exp()
        return (e / e.sum(-1, keepdim=True)).to(x.dtype)
"""


def _one_line(record):
    assert record["reason"] and "\n" not in record["reason"]
    return record


def test_honest_solution_passes_and_is_timed(tmp_path):
    record = evaluate("softmax", write_solution(tmp_path, HONEST_SOFTMAX), tmp_path)
    assert record["status"] == "ok", record["reason"]
    assert [c["shape"] for c in record["checks"]] == ["one_row", "not_vector_multiple"]
    assert all(c["trials"] == 3 for c in record["checks"])  # 2 trials + the cache probe
    assert record["timings"] and record["timings"][0]["reps"] >= 3 and record["timings"][0]["median_ms"] > 0
    assert record["sha256"] and "seed" not in record  # the seed is written only when the run ends


@pytest.mark.parametrize("source, rule, words", [
    pytest.param("import torch\nclass NotIt(torch.nn.Module):\n    pass\n", "missing-ModelNew", "NotIt", marks=pytest.mark.slow),
    pytest.param("import torch\nraise ImportError('no such kernel library')\n", "import-error", "no such kernel library", marks=pytest.mark.slow),
    pytest.param("def broken(:\n", "import-error", "syntax error", marks=pytest.mark.slow),
    ("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        raise ValueError('bad grid')\n", "exception", "ValueError"),
    pytest.param("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x * 0\n", "wrong-output", "outside atol", marks=pytest.mark.slow),
    ("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        e = (x.float() - x.float().amax(-1, keepdim=True)).exp()\n        y = (e / e.sum(-1, keepdim=True)).to(x.dtype)\n        x.zero_()\n        return y\n", "input-mutated", "input 0"),
    pytest.param("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return [x]\n", "bad-output", "list", marks=pytest.mark.slow),
])
def test_failure_kinds_have_their_rule(tmp_path, source, rule, words):
    record = _one_line(evaluate("softmax", write_solution(tmp_path, source), tmp_path))
    assert record["status"] == "failed"
    assert record["rule"] == rule, record["reason"]
    assert words in record["reason"]


def test_crash_is_reported_with_its_signal(tmp_path):
    # pthread_kill, not os.kill: a signal sent to the process may land on another thread while this one
    # returns None and replies (bad-output) before the process dies.
    source = ("import signal, threading, torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
              "        signal.pthread_kill(threading.get_ident(), signal.SIGSEGV)\n")
    record = _one_line(evaluate("softmax", write_solution(tmp_path, source), tmp_path))
    assert record["rule"] == "crash" and "SIGSEGV" in record["reason"]


def test_hang_is_killed_after_the_timeout(tmp_path):
    source = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        while True:\n            pass\n"
    record = _one_line(evaluate("softmax", write_solution(tmp_path, source), tmp_path, timeout=2))
    assert record["rule"] == "timeout" and "2 s" in record["reason"]


@pytest.mark.slow
def test_out_of_memory_is_named(tmp_path):
    source = ("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
              "        raise torch.cuda.OutOfMemoryError('CUDA out of memory. Tried to allocate 900.00 GiB')\n")
    record = _one_line(evaluate("softmax", write_solution(tmp_path, source), tmp_path))
    assert record["rule"] == "out-of-memory"


@pytest.mark.slow
def test_compile_error_gives_the_first_compiler_lines(tmp_path):
    source = """
import torch
from torch.utils.cpp_extension import load_inline
_ext = load_inline(name="harness_test_broken_build", cpp_sources="int broken( { return 0; }", functions=["broken"])
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x
"""
    record = _one_line(evaluate("softmax", write_solution(tmp_path, source), tmp_path, timeout=600))
    assert record["rule"] == "compile-error"
    assert "error" in record["reason"].lower() and "Traceback" not in record["reason"]


def test_compile_error_summary_picks_compiler_lines():
    from harness.build import summarise_build_error

    log = ("Error building extension 'x': [1/2] c++ -c main.cpp\nFAILED: main.o\n"
           "/tmp/ext/x/main.cpp:3:14: error: expected ')' before '{' token\n    3 | int broken( {\n"
           "/tmp/ext/x/cuda.cu(12): error: identifier \"blockIdxx\" is undefined\nninja: build stopped: subcommand failed.\n")
    summary = summarise_build_error(log)
    assert summary.startswith("main.cpp:3:14: error: expected ')'") and "blockIdxx" in summary and "ninja" not in summary


def test_a_fault_of_the_checker_is_reported_and_the_run_goes_on(tmp_path, monkeypatch):
    from harness import runner

    def broken_reference(*_args, **_kwargs):
        raise MemoryError("no room for the float64 reference")

    monkeypatch.setattr(runner, "reference_output", broken_reference)
    record = _one_line(evaluate("softmax", write_solution(tmp_path, HONEST_SOFTMAX), tmp_path))
    assert record["status"] == "failed" and record["rule"] == "harness-error" and "not the solution's verdict" in record["reason"]


def test_the_parent_cleans_what_the_child_wrote_without_following_it_out(tmp_path):
    """The child may write its scratch and its extension folder; the parent later removes the one and clears
    stale locks and lists libraries in the other. A tree a thousand folders deep (shutil.rmtree recurses per
    level) and a symlink to a folder outside (a `lock` there would be unlinked) must do nothing to it."""
    import os

    from harness import build
    from harness.runner import remove_tree

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "lock").write_text("")
    (outside / "x.so").write_text("")
    extension = tmp_path / "extension"
    (extension / "softmax_v1").mkdir(parents=True)
    (extension / "softmax_v1" / "lock").write_text("")
    (extension / "softmax_v1" / "softmax_v1.so").write_text("")
    os.symlink(outside, extension / "evil")
    assert build.built_libraries(extension) == {str(extension / "softmax_v1" / "softmax_v1.so"):
                                                (extension / "softmax_v1" / "softmax_v1.so").stat().st_mtime}
    assert build.clear_stale_locks(extension) == [extension / "softmax_v1" / "lock"]
    assert (outside / "lock").exists()

    scratch = tmp_path / "scratch"
    deep, name = os.open(tmp_path, os.O_RDONLY), "scratch"
    os.mkdir(name, dir_fd=deep)
    for _ in range(1200):  # each level opened relative to the last: the whole path would be too long
        level = os.open(name, os.O_RDONLY, dir_fd=deep)
        os.close(deep)
        deep, name = level, "d"
        os.mkdir(name, dir_fd=deep)
    os.close(deep)
    os.symlink(outside, scratch / "link")
    remove_tree(scratch)
    assert not os.path.lexists(scratch) and (outside / "lock").exists()
