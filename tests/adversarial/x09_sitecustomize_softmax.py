"""Trust boundary, guard indirection (class 9): code planted for later interpreters, softmax.

At import the solution writes a sitecustomize.py, a usercustomize.py and a .pth file into every folder
it may write (its scratch folder, which is its working directory, its TMPDIR, its build folder and
/dev/shm). A later interpreter that put one of those folders on sys.path (the next worker of the same
solution, a compiler wrapper written in Python, the parent) would run them at start-up; each would
create /dev/shm/x09-planted-ran. It also tries LD_PRELOAD-style planting: a build subprocess started
now with LD_PRELOAD naming a library it cannot have (it has no compiler output outside its folders).
Then it is an honest plain-torch softmax.
Expected: nothing ever runs the planted files (no marker); the verdict may be "ok" (writes to its own
folders are allowed).
"""
import os
import subprocess

import torch
import torch.nn as nn

MARKER = "/dev/shm/x09-planted-ran"
_PAYLOAD = f"import os\nos.close(os.open({MARKER!r}, os.O_WRONLY | os.O_CREAT, 0o644))\n"


def _plant():
    folders = {os.getcwd(), os.environ.get("TMPDIR", ""), os.environ.get("TORCH_EXTENSIONS_DIR", ""), "/dev/shm"}
    for folder in filter(None, folders):
        for name, text in (("sitecustomize.py", _PAYLOAD), ("usercustomize.py", _PAYLOAD),
                           ("x09-planted.pth", "import os; os.close(os.open(%r, os.O_WRONLY | os.O_CREAT, 0o644))\n" % MARKER)):
            try:
                with open(os.path.join(folder, name), "w") as handle:
                    handle.write(text)
            except OSError:
                pass
    try:  # a subprocess of the build phase with the planted folders on its path
        env = dict(os.environ, PYTHONPATH=os.getcwd(), LD_PRELOAD=os.path.join(os.getcwd(), "x09-missing.so"))
        subprocess.run(["/bin/true"], env=env, timeout=10, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except Exception:  # noqa: BLE001
        pass


_plant()


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        e = (xf - xf.amax(dim=-1, keepdim=True)).exp()
        return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)
