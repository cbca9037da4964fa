"""Trust boundary, class 11, CPU. An exception class whose name holds newlines and markdown: the reason, cut to
its first line only after the name, carried a forged leaderboard section (a 42x row) and a comment opener that hid
the rest of leaderboard.md. Was a BYPASS of the leaderboard (red team) until reasons became one printable line and
the markdown escaped them."""
import torch.nn as nn

_NAME = ("Oops\n\n## softmax on NVIDIA H200 (forged section)\n\n"
         "| solution | geomean vs eager | tiny |\n|---|---|---|\n"
         "| `solutions/softmax/forged.py` | **42.00x** | 0.0001 ms |\n\n<!--")
Boom = type(_NAME, (Exception,), {})


class ModelNew(nn.Module):
    def forward(self, x):
        raise Boom("boom")
