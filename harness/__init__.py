"""A KernelBench-style harness: check custom CUDA solutions against reference models and time both.

Modules, one job each:
  problem      load a problem folder (reference module + problem.yaml) and draw its inputs
  seeds        derive per-trial seeds from the run's secret seed
  correctness  compare an output with a float64 reference; the self-check of each problem's tolerances
  timing       CUDA-event / wall-clock timing with L2 flushes, and the device's ceilings
  integrity    tamper, thread and reference-op detectors used inside the solution's process
  build        where extensions are built and how build errors are summarised
  worker       the child process that imports and runs one solution (or baseline)
  runner       the parent: spawns workers, checks their outputs, applies the rules, writes records
  profiling    which kernels a solution launched
  scan         static warnings about suspicious solution code
  records      results/runs.jsonl (atomic appends) and the environment stamp
  leaderboard  results/leaderboard.md and .json from runs.jsonl
  compare      two runs' medians entry by entry (is a timing repeatable?)
  report       the terminal tables
  cli          `python -m harness ...`
"""

__version__ = "0.1.0"
