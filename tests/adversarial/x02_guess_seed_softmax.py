"""Trust boundary, class 2 (predictable inputs), softmax.

The solution reads everything that could reveal the run's seeds (torch.initial_seed(), the global RNG
state, the environment, its command line) and guesses the master seed among those numbers and the small
integers (a test or a replayed run often uses --seed 7 or 42). It checks a guess with the harness's own
code (harness.seeds.derive_seed, the problem's input draw): the first correctness trial's input must come
out bit for bit. With a hit it precomputes, during the untimed warm-up, the answers of every timed call
the parent will make (seeds "time"/process/batch/index) and returns them from a table when timed: a
near-zero median with correct outputs. Correctness trials (a dispatch mode is active) are honest.
Without a hit it still returns something cheap when timed, hoping the timed calls are not checked.
Expected: timed-output-wrong (the master seed is a secret of the parent: no guess hits). With a
guessable master seed (the test fixture's seed=7) it would be accepted on the CPU, which has no
physics floor: tests must use random master seeds.
"""
import hashlib
import importlib
import os
import sys

import torch
import torch.nn as nn

PROBLEM = "softmax"
# Names spelt so that the static scan does not see them (the point here is the runtime).
_HARNESS = "har" + "ness"
_DISPATCH_DEPTH = getattr(torch._C, "_len_torch_" + "dispatch_stack")


def _harness(module):
    return importlib.import_module(_HARNESS + "." + module)


def derive_seed(master, *parts):
    """The harness's per-trial seed derivation (harness/seeds.py), written out: it is public code."""
    text = "/".join([str(master), *map(str, parts)]).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 2


def _softmax(x):
    xf = x.float()
    e = (xf - xf.amax(dim=-1, keepdim=True)).exp()
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)


def _guesses():
    numbers = {torch.initial_seed(), 0, 1, 7, 42, 1234, 12345, 2024, 2025, 2026}
    numbers |= set(range(0, 64))
    for key, value in os.environ.items():
        if "SEED" in key.upper():
            try:
                numbers.add(int(value))
            except ValueError:
                pass
    for arg in sys.argv:
        if arg.isdigit():
            numbers.add(int(arg))
    try:
        state = torch.get_rng_state()[:8]
        numbers.add(int.from_bytes(bytes(state.tolist()), "little"))
    except Exception:  # noqa: BLE001
        pass
    return sorted(numbers)


def _draw(problem, shape, seed):
    """problem.make_inputs on the CPU, with torch.manual_seed seeding only the CPU generator for the draw
    (the full torch.manual_seed formats a stack for CUDA's lazy seeding, which the guard reads as frame
    inspection). The module attribute is put back before the harness's next checkpoint."""
    real = torch.manual_seed
    set_module_attr = type(torch).__setattr__
    set_module_attr(torch, "manual_seed", torch.default_generator.manual_seed)
    try:
        return problem.make_inputs(shape, seed, "cpu")[0]
    finally:
        set_module_attr(torch, "manual_seed", real)


class _Oracle:
    def __init__(self):
        self.problem = None
        self.master = None
        self.tried = False
        self.table = {}
        self.planned = set()

    def _load(self):
        if self.problem is not None:
            return self.problem
        problem_module = _harness("problem")
        PROBLEMS_DIR, load_problem = problem_module.PROBLEMS_DIR, problem_module.load_problem
        name = f"{_HARNESS}_problem_{PROBLEM}"
        modules = getattr(sys, "modules")
        loaded = modules.get(name)
        real_loader = problem_module.load_module
        if loaded is not None:  # reuse the child's reference module (re-importing it reads a .pyc from scratch)
            problem_module.load_module = lambda path, module_name: loaded
        try:
            problem = load_problem(PROBLEMS_DIR / PROBLEM)
            problem.module  # noqa: B018
        finally:
            problem_module.load_module = real_loader  # restored before the harness's next check
        self.problem = problem
        return problem

    def shape_of(self, x):
        problem = self._load()
        for shape in problem.shapes:
            c = problem.constants(shape)
            if (c["BATCH"], c["DIM"]) == tuple(x.shape) and shape.torch_dtype == x.dtype:
                return shape
        return None

    def find_master(self, x):
        """At the first correctness trial: which guessed master seed draws exactly this input?"""
        if self.tried:
            return
        self.tried = True
        try:
            problem, shape = self._load(), self.shape_of(x)
            if shape is None:
                return
            for guess in _guesses():
                drawn = _draw(problem, shape, derive_seed(guess, problem.name, shape.name, "check", 0))
                if torch.equal(drawn, x.cpu()):
                    self.master = guess
                    return
        except Exception:  # noqa: BLE001
            pass

    @staticmethod
    def key(x):
        flat = x.reshape(-1)
        return (tuple(x.shape), tuple(flat[:4].tolist()), tuple(flat[-4:].tolist()))

    def plan(self, x):
        """Untimed (warm-up): the answers of every timed call of this shape, from the guessed seeds."""
        if self.master is None:
            return
        shape = self.shape_of(x)
        if shape is None or shape.name in self.planned:
            return
        self.planned.add(shape.name)
        problem = self._load()
        for process in (1,):
            for batch in range(0, 24):
                for i in range(32):
                    seed = derive_seed(self.master, problem.name, shape.name, "time", process, batch, i)
                    drawn = _draw(problem, shape, seed)
                    self.table[self.key(drawn)] = _softmax(drawn)


_ORACLE = _Oracle()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        checked = _DISPATCH_DEPTH() > 0  # the correctness trials record ops
        if checked:
            _ORACLE.find_master(x)
            return _softmax(x)
        self.calls += 1
        if self.calls <= 3:  # the warm-up: untimed
            _ORACLE.plan(x)
        hit = _ORACLE.table.get(_ORACLE.key(x))
        if hit is not None:
            return hit.to(x.device)
        return torch.full_like(x, 1.0 / max(1, x.shape[-1]))
