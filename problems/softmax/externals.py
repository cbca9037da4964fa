"""Other libraries' softmax, timed beside ours when importable (listed in problem.yaml `externals`).
Each takes the reference's inputs and returns the reference's output (shape and dtype)."""


def quack_softmax(x):
    from quack.softmax import softmax_fwd

    return softmax_fwd(x)


def liger_softmax(x):
    from liger_kernel.ops.softmax import LigerSoftmaxFunction

    return LigerSoftmaxFunction.apply(x)
