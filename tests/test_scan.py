"""The static scan points at suspicious code, not at prose about it; its findings are warnings only."""
from harness.scan import needs_cuda, scan_source


def test_scan_flags_code_but_not_comments_or_docstrings(tmp_path):
    path = tmp_path / "s.py"
    path.write_text('"""Never uses torch.cuda.Stream or gc.get_objects."""\n'
                    "import torch  # threading is not used either\n"
                    "s = torch.cuda.Stream()\n"
                    "def f(x):\n    '''torch.softmax would be cheating.'''\n    return torch.softmax(x, -1)\n")
    warnings = scan_source(path, ["torch.softmax"])
    assert any(w.startswith("line 3: uses its own CUDA stream") for w in warnings)
    assert any(w.startswith("line 6: calls torch.softmax") for w in warnings)
    assert not any("gc" in w or "threads" in w for w in warnings)
    assert "builds no CUDA extension (no load_inline)" in warnings and not needs_cuda(path)


def test_warnings_alone_never_reject(tmp_path):
    from conftest import evaluate, write_solution

    source = ('import gc, threading, torch\n'
              'class ModelNew(torch.nn.Module):\n    def forward(self, x):\n'
              '        gc.collect()\n        e = (x.float() - x.float().amax(-1, keepdim=True)).exp()\n'
              '        return (e / e.sum(-1, keepdim=True)).to(x.dtype)\n')
    record = evaluate("softmax", write_solution(tmp_path, source), tmp_path, device="cpu")
    assert record["status"] == "ok" and any("gc" in w for w in record["warnings"])
