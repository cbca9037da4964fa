"""What sharing one CUDA buffer with a child costs per request, as the harness does it (harness/channel.py).

    python benchmarks/ipc_probe.py [--sizes-mb 64 512 6144] [--requests 20]

For each size: the parent allocates one buffer and, per request, describes it afresh (describe_shared); the child
maps it (open_shared), reads one element, drops it and answers. Prints the round trip per request (first and the
rest) and the parent's allocated/reserved memory after the requests, before and after torch.cuda.ipc_collect().
The question it answers: can the parent's clock over a batch resolve a kernel, and do shares pile up?
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

CHILD = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
import torch
from lab import open_shared
torch.cuda.init()  # the harness's child has a CUDA context before it maps anything
for line in sys.stdin:
    try:
        t = open_shared(json.loads(line))
        reply = {"ok": float(t.reshape(-1)[0].item())}
        del t
    except Exception as error:
        reply = {"error": f"{type(error).__name__}: {error}"}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
"""


def main() -> int:
    import torch

    from lab import describe_shared

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[64, 512, 6144])
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args()
    here = str(Path(__file__).resolve().parent)  # the child imports lab from here
    child = subprocess.Popen([sys.executable, "-c", CHILD, here], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    for size in args.sizes_mb:
        buffer = torch.ones(size * (1 << 20) // 4, device="cuda")
        torch.cuda.synchronize()
        times = []
        for _ in range(args.requests):
            t0 = time.perf_counter()
            child.stdin.write(json.dumps(describe_shared(buffer)) + "\n")
            child.stdin.flush()
            line = child.stdout.readline()
            reply = json.loads(line) if line else {"error": f"the child died (exit status {child.wait()})"}
            times.append((time.perf_counter() - t0) * 1e3)
            if "error" in reply:
                print(f"{size} MB: the child could not map the buffer: {reply['error']}")
                return 1
        before = (torch.cuda.memory_allocated() >> 20, torch.cuda.memory_reserved() >> 20)
        del buffer
        torch.cuda.empty_cache()
        mid = (torch.cuda.memory_allocated() >> 20, torch.cuda.memory_reserved() >> 20)
        torch.cuda.ipc_collect()
        torch.cuda.empty_cache()
        after = (torch.cuda.memory_allocated() >> 20, torch.cuda.memory_reserved() >> 20)
        print(f"{size} MB: first {times[0]:.2f} ms, then median {statistics.median(times[1:]):.2f} ms "
              f"(max {max(times[1:]):.2f}); parent MB allocated/reserved: held {before}, freed {mid}, after ipc_collect {after}")
    child.stdin.close()
    child.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
