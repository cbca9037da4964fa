"""A KernelBench-style harness: check custom CUDA solutions against reference models and time both.

Modules, one job each:
  problem      load a problem folder (reference module + problem.yaml) and draw its inputs
  seeds        derive per-trial seeds from the run's secret seed
  rules        every rule that can reject a target (the README's table), and the one Failure type
  correctness  compare an output with a float64 reference; the self-check of each problem's tolerances
  timing       the child's timing loops (over C-level primitives) and the parent's bounds and ceilings
  channel      authenticated JSON frames between parent and child; shared tensors described as data
  prompt       a prompt asking a language model for a solution, generated from the rules and the problem
  messages     the parent-child protocol as types: one dataclass per request and reply; replies are read strictly
  sandbox      Landlock confinement of the child; the parent as subreaper of strays
  guard        the child's audit hook, module snapshot and sealed torch hooks (introspection is a verdict)
  integrity    the aten-op recorder and the poisoning of freed memory, inside the solution's process
  build        where extensions are built and how build errors are summarised
  scaffold     a new solution file from the problem's simple.py or a template (`make new`)
  child        the process that imports and runs one solution (or baseline) under the parent's orders
  runner       the parent: draws inputs, spawns children, verifies outputs, applies the rules, writes records
  batch        many candidates: parallel builds, one worker per GPU, resume, the summary with fast_p (ray_backend: on Ray)
  profiling    which kernels a solution launched
  scan         static rejections and warnings about solution source
  kernelbench  a KernelBench problem file as it is: its problem description, measured; import-suite
  records      results/runs.jsonl (atomic appends) and the environment stamp
  leaderboard  results/leaderboard.md and .json from runs.jsonl
  compare      two runs' medians entry by entry (is a timing repeatable?)
  report       the terminal tables
  cli          `python -m harness ...`
"""

__version__ = "0.1.0"
