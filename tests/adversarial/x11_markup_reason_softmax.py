"""Trust boundary, class 11, CPU. An exception whose message is rich markup ("[/zz]"): the parent printed the
reason as markup, rich raised MarkupError, and the eval died there, the solutions after it never evaluated and
the leaderboard never regenerated. Was a CRASH of the parent (red team) until record text was printed escaped."""
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        raise ValueError("[/zz] nothing here")
