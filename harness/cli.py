"""`python -m harness COMMAND`: eval, eval-batch, build, new, prompt, import-suite, selfcheck, leaderboard, compare, list.

A problem is a name under problems/ or, for eval, a KernelBench-format .py file as it is (described in memory).

Exit status: 0 when everything evaluated was correct (or the command did what it was asked), 1 when a
solution was rejected or failed (or, for compare, a figure moved beyond the tolerance), 2 for a usage
error (an unknown problem, shape, option or file), 130 when interrupted.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import sys
from pathlib import Path

import torch

from . import leaderboard
from .problem import PROBLEMS_DIR, REPO_ROOT, SOLUTIONS_DIR, ProblemError, available_problems, discover_solutions, find_problem, load_problem
from .compare import TOLERANCE_PCT, CompareError, compare_runs, describe, outside, render, resolve_runs
from .records import RESULTS_DIR, SCRATCH_RESULTS_DIR, append_record, read_records
from .report import Reporter


class _ShowDefaults(argparse.HelpFormatter):
    """--help shows each option's default, where it has one worth showing and its help does not say it already."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default in (None, False, [], argparse.SUPPRESS) or "default" in text or "None:" in text:
            return text
        return f"{text} (default: {action.default})"


def _parser() -> argparse.ArgumentParser:
    # allow_abbrev=False everywhere: an abbreviation of a hidden option (`--problem` for `--problems-dir`) or of
    # one a subcommand lacks must be a usage error, never a silently different run.
    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__, allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    # every subcommand's --help shows its defaults
    sub.add_parser = functools.partial(sub.add_parser, allow_abbrev=False, formatter_class=_ShowDefaults)

    ev = sub.add_parser("eval", help="build, check and time solutions of problems, then refresh the leaderboard")
    ev.add_argument("problems", nargs="*",
                    help="problem names or KernelBench-format .py files (default: all, or the one holding --solution)")
    ev.add_argument("--solution", action="append", default=[], help="a solution file (repeatable); default: every file in solutions/<problem>/")
    ev.add_argument("--seed", type=int, help="replay a run with this master seed (written to results/seeds.jsonl when the run ends)")
    ev.add_argument("--json", action="store_true", help="print the records as JSON on stdout")
    ev.add_argument("--shape", action="append", default=[], help="only these shape names (repeatable)")
    ev.add_argument("--trials", type=int, default=5, help="correctness trials per shape (at least 5 unless testing)")
    ev.add_argument("--budget", type=float, default=2.0, help="timing budget in seconds per target and shape")
    ev.add_argument("--timeout", type=float, default=300.0, help="seconds a single call may take before it counts as hung")
    ev.add_argument("--build-timeout", type=float, default=1800.0, help="seconds a build may take")
    ev.add_argument("--host-bound-processes", type=int, default=5, metavar="N",
                    help="time a host-bound entry (issuing the call took most of its time) in N fresh processes in all and "
                         "record the median of their medians: such figures move more between processes than within one (1: off)")
    ev.add_argument("--no-baselines", action="store_true", help="skip the eager and torch.compile baselines")
    ev.add_argument("--no-externals", action="store_true", help="skip other libraries (quack, Liger)")
    ev.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ev.add_argument("--results", type=Path, default=None,
                    help=f"where runs.jsonl and the leaderboard go (default: {RESULTS_DIR.name}/ for GPU runs, the committed figures; "
                         f"{_relative(SCRATCH_RESULTS_DIR)}/ for CPU runs, which time nothing users should read)")
    ev.add_argument("--problems-dir", type=Path, default=PROBLEMS_DIR, help=argparse.SUPPRESS)

    lb = sub.add_parser("leaderboard", help="regenerate results/leaderboard.md and .json from runs.jsonl")
    lb.add_argument("--results", type=Path, default=RESULTS_DIR, help="the folder holding runs.jsonl")

    cp = sub.add_parser("compare", help="compare two runs' medians entry by entry (are the timings repeatable?)")
    cp.add_argument("runs", nargs="*", help="two run ids or unique prefixes (default: the last two runs of --problem)")
    cp.add_argument("--problem", help="compare this problem's last two timed runs")
    cp.add_argument("--tolerance", type=float, default=TOLERANCE_PCT, help="largest change allowed, in percent")
    cp.add_argument("--device-bound-only", action="store_true", help="do not count host-bound entries in the verdict")
    cp.add_argument("--results", type=Path, default=RESULTS_DIR, help="the folder holding runs.jsonl")

    sc = sub.add_parser("selfcheck", help="show that each problem's tolerances reject zeros, constants and wrong inputs")
    sc.add_argument("problems", nargs="*", help="problem names or KernelBench-format .py files (default: all)")
    sc.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")

    bt = sub.add_parser("eval-batch", help="evaluate every candidate file in a folder (or a suite's samples): one record each, "
                                          "and a summary (compile and correctness rates, fast_p, failures by rule)")
    bt.add_argument("problem", nargs="?", help="a problem name or a KernelBench-format .py file (or --suite)")
    bt.add_argument("--dir", type=Path, required=True, help="the candidates: every *.py in it, or with --suite DIR/<problem>/*.py")
    bt.add_argument("--suite", type=Path, help="a folder of problem folders (e.g. problems/kb_level1): every problem with samples in --dir")
    bt.add_argument("--results", type=Path, default=None,
                    help="where the batch's runs.jsonl and summary go (default: results/batch/<name>/ for GPU runs, "
                         ".scratch/batch/<name>/ for CPU runs; never the main leaderboard)")
    bt.add_argument("--resume", action="store_true", help="skip candidates that have a record already (same path and sha256)")
    bt.add_argument("--jobs", type=int, default=None,
                    help="builds at once (default: the CPU count less two per GPU worker; with --build-first, the CPU count)")
    bt.add_argument("--build-first", action="store_true",
                    help="build every candidate before evaluating any (default: evaluate each as its build ends; the "
                         "builds see no GPU and run at a low priority)")
    bt.add_argument("--gpus", type=int, default=None,
                    help="worker processes, one per GPU (default: every visible GPU; on a machine without one, 1 CPU worker)")
    bt.add_argument("--backend", choices=("local", "ray"), default="local",
                    help="local worker processes, or Ray tasks (pip install '.[ray]')")
    bt.add_argument("--shape", action="append", default=[], help="only these shape names (repeatable)")
    bt.add_argument("--trials", type=int, default=5, help="correctness trials per shape")
    bt.add_argument("--budget", type=float, default=2.0, help="timing budget in seconds per target and shape")
    bt.add_argument("--timeout", type=float, default=300.0, help="seconds a single call may take before it counts as hung")
    bt.add_argument("--build-timeout", type=float, default=1800.0, help="seconds a build may take")
    bt.add_argument("--host-bound-processes", type=int, default=5, metavar="N", help="as for eval")
    bt.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    bt.add_argument("--problems-dir", type=Path, default=PROBLEMS_DIR, help=argparse.SUPPRESS)

    bd = sub.add_parser("build", help="build every solution's extension in parallel (eval then finds them cached)")
    bd.add_argument("problems", nargs="*", help="problem names (default: all); with --dir, the one problem the candidates solve")
    bd.add_argument("--jobs", type=int, default=None, help="builds at once (default: 4; with --dir, the CPU count)")
    bd.add_argument("--dir", type=Path, default=None, help="build a batch's candidates ahead of time (as eval-batch would), no GPU needed")
    bd.add_argument("--suite", type=Path, default=None, help="with --dir: candidates under DIR/<problem>/ for each problem of the suite")

    nw = sub.add_parser("new", help="start a solution file from the problem's simple.py (or a template) and say where to begin")
    nw.add_argument("problem", help="the problem it solves")
    nw.add_argument("name", help="the file's name, without .py (solutions/<problem>/<name>.py)")

    pr = sub.add_parser("prompt", help="print a prompt asking a language model for a solution (ModelNew with CUDA kernels)")
    pr.add_argument("problem", help="a problem name, or a KernelBench-format .py file")

    sub.add_parser("list", help="list problems and their solutions")

    im = sub.add_parser("import-suite", help="make a problem folder (reference.py, generated problem.yaml) of each KernelBench-format "
                                             ".py file in a folder, leaving the files untouched")
    im.add_argument("source", type=Path, help="the folder of KernelBench files (e.g. KernelBench/level1)")
    im.add_argument("--into", type=Path, required=True, help="where the problem folders go, one per file (e.g. problems/kb_level1)")
    im.add_argument("--force", action="store_true", help="replace problem folders that exist already")
    return parser


def _device(name):
    if not name:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ProblemError(f"--device {name}: not a device torch knows (cuda or cpu)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ProblemError(f"--device {name}: no CUDA device is visible here (torch {torch.__version__} reports none); "
                           "leave --device out to run on the CPU")
    if device.type not in ("cuda", "cpu"):
        raise ProblemError(f"--device {name}: the harness runs on cuda or cpu")
    return device


def _results_dir(args, device) -> Path:
    """Where a run's records go: the committed results/ for a GPU run, a scratch folder for a CPU run,
    unless --results says otherwise."""
    if args.results is not None:
        return args.results
    return RESULTS_DIR if device.type == "cuda" else SCRATCH_RESULTS_DIR


def _resolve_solution(text: str) -> Path:
    path = Path(text)
    if not path.is_absolute() and not path.exists():
        path = REPO_ROOT / text
    if not path.is_file():
        folder = path.parent if path.parent.is_dir() else SOLUTIONS_DIR
        existing = sorted(str(p.relative_to(REPO_ROOT)) if p.is_relative_to(REPO_ROOT) else str(p) for p in folder.rglob("*.py"))[:20]
        raise ProblemError(f"no solution file {text!r}; files under {folder}: {', '.join(existing) or 'none'}")
    return path.resolve()


def _problem_of(path: Path, problems_dir: Path) -> str:
    for part in reversed(path.parent.parts):
        if (problems_dir / part / "problem.yaml").is_file():
            return part
    raise ProblemError(f"cannot tell which problem {path} is for: name it (e.g. `eval softmax --solution {path}`); problems: {', '.join(available_problems(problems_dir))}")


def _targets(problem, solutions: list, args, device) -> list:
    from .runner import Target

    targets = []
    if not args.no_baselines:
        targets.append(Target("eager", "eager"))
        if device.type == "cuda":
            targets.append(Target("compile", "torch.compile"))
    if not args.no_externals and device.type == "cuda":
        targets += [Target("external", e.name, requires=e.requires, function=e.function) for e in problem.externals]
    targets += [Target("solution", p.stem, path=p) for p in solutions]
    return targets


def _relative(path: Path) -> Path:
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def _check_shape_names(problems: list, names: list) -> tuple:
    """The problems to evaluate under `--shape names`. Every name must be a shape of at least one selected
    problem (ProblemError otherwise, before anything runs: an unknown name would select no shape at all and
    the run would check nothing). Each problem then runs the names it has; one that has none of them is
    left out, since it would run no shape either. Returns (problems to run, problems left out)."""
    if not names:
        return problems, []
    has = {p.name: {s.name for s in p.shapes} for p in problems}
    for name in dict.fromkeys(names):
        if any(name in shapes for shapes in has.values()):
            continue
        if len(problems) == 1:
            raise ProblemError(f"problem {problems[0].name} has no shape {name!r}; shapes: {', '.join(s.name for s in problems[0].shapes)}")
        listing = "; ".join(f"{p.name}: {', '.join(s.name for s in p.shapes)}" for p in problems)
        raise ProblemError(f"problems {', '.join(p.name for p in problems)} have no shape {name!r}; shapes: {listing}")
    chosen = [p for p in problems if has[p.name] & set(names)]
    return chosen, [p for p in problems if p not in chosen]


def _named_problem(name: str, problems_dir: Path):
    """A problem by name, or a KernelBench-format file (NAME.py) described in memory."""
    if name.endswith(".py"):
        if not Path(name).is_file():
            raise ProblemError(f"no KernelBench file {name!r} (a problem given as a .py file must exist)")
        return load_problem(Path(name))
    return find_problem(name, problems_dir)


def cmd_eval(args) -> int:
    named = [_resolve_solution(s) for s in args.solution]
    names = args.problems or sorted({_problem_of(p, args.problems_dir) for p in named}) or available_problems(args.problems_dir)
    problems, left_out = _check_shape_names([_named_problem(n, args.problems_dir) for n in names], args.shape)

    from .runner import Config, Run

    device = _device(args.device)
    reporter = Reporter(quiet=False)
    for problem in left_out:
        reporter.console.print(f"[yellow]{problem.name}: not evaluated, it has none of the shapes named by --shape "
                               f"({', '.join(dict.fromkeys(args.shape))})[/yellow]")
    if device.type != "cuda":
        reporter.console.print("[yellow]No CUDA device: solutions that build CUDA kernels need a GPU and will not be timed here; "
                               "pure-PyTorch solutions run on the CPU with a wall-clock timer.[/yellow]")
    config = Config(trials=args.trials, budget_s=args.budget, call_timeout_s=args.timeout, build_timeout_s=args.build_timeout,
                    shapes=tuple(args.shape), host_bound_processes=args.host_bound_processes)
    results = _results_dir(args, device)
    if results == SCRATCH_RESULTS_DIR:
        reporter.console.print(f"[yellow]CPU run: records go to {_relative(results)}/, not results/ (--results results to keep them)[/yellow]")
    run = Run(device, results / "runs.jsonl", config, seed=args.seed, reporter=reporter)
    reporter.console.print(f"run {run.run_id}, seed {run.seed} (replay with --seed {run.seed}); device {run.env['gpu']}"
                           + (f", copy bandwidth {run.copy_bw / 1e12:.2f} TB/s" if run.copy_bw else ""))
    all_records, rejected = [], False
    for problem in problems:
        if named and len(problems) == 1:
            solutions = named
        elif named:
            solutions = [p for p in named if _problem_of(p, args.problems_dir) == problem.name]
        else:
            solutions = discover_solutions(problem.name)
        solutions = [_relative(p) for p in solutions]
        reporter.heading(f"{problem.name}: {problem.description}")
        if device.type == "cuda" and len(solutions) > 1:
            from .runner import prebuild

            reporter(f"building {len(solutions)} solutions in parallel")
            run.prebuilt.update(prebuild([(problem, p) for p in solutions], device))
        records = run.evaluate_problem(problem, _targets(problem, solutions, args, device))
        reporter.table(problem.name, run.env["gpu"], records)
        all_records += records
        rejected |= any(r["status"] == "failed" and r["kind"] == "solution" for r in records)
    # The seed is written only now: nothing a solution could read while the run went on held it.
    append_record({"run_id": run.run_id, "seed": run.seed, "date": run.env["date"]}, results / "seeds.jsonl")
    summary = leaderboard.regenerate(results)
    reporter.console.print(f"leaderboard: {_relative(results / 'leaderboard.md')} ({summary['records']} records)")
    if args.json:
        print(json.dumps(all_records, indent=1, default=str))
    return 1 if rejected else 0


def cmd_compare(args) -> int:
    """Exit 0 when every compared entry is within the tolerance, 1 otherwise."""
    records, _ = read_records(args.results / "runs.jsonl")
    first, second = resolve_runs(records, args.runs, args.problem)
    rows = compare_runs(records, first, second)
    count = not args.device_bound_only
    print(render(rows, first, second, args.tolerance, count, header=(describe(records, first), describe(records, second))))
    return 1 if outside(rows, args.tolerance, count) else 0


def cmd_selfcheck(args) -> int:
    from .correctness import self_check

    device = _device(args.device)
    reporter = Reporter()
    bad = 0
    for name in args.problems or available_problems():
        lines = self_check(_named_problem(name, PROBLEMS_DIR), device)
        wrong = [l for l in lines if not l.ok]
        bad += len(wrong)
        reporter.console.print(f"{name}: {len(lines) - len(wrong)}/{len(lines)} self-check cases as expected")
        for l in wrong:
            reporter.console.print(f"  [red]{l.shape}: {l.case} should {l.expected} but did {l.got}[/red]")
    return 1 if bad else 0


def _batch_candidates(args) -> tuple:
    """(problem refs, candidates, the batch's name) for eval-batch and build --dir."""
    from . import batch

    if args.suite is not None:
        if getattr(args, "problem", None) or getattr(args, "problems", None):
            raise ProblemError("name a problem or --suite, not both")
        refs, candidates = batch.suite_candidates(args.suite, args.dir)
        return refs, candidates, args.suite.resolve().name
    names = [args.problem] if getattr(args, "problem", None) else list(getattr(args, "problems", None) or [])
    if len(names) != 1:
        raise ProblemError("name one problem (a name or a KernelBench .py file), or --suite FOLDER")
    ref = batch.problem_ref(names[0], getattr(args, "problems_dir", PROBLEMS_DIR))
    candidates = batch.candidates_for(ref, args.dir)
    if not candidates:
        raise ProblemError(f"--dir {args.dir}: no *.py candidates in it")
    return [ref], candidates, candidates[0].problem


def cmd_eval_batch(args) -> int:
    """Exit 0 when every candidate has a record (whatever its verdict), 1 when some have none."""
    from . import batch

    refs, candidates, name = _batch_candidates(args)
    device = _device(args.device)
    results = args.results or batch.default_results(name, device.type == "cuda")
    options = batch.Options(trials=args.trials, budget=args.budget, timeout=args.timeout, build_timeout=args.build_timeout,
                            shapes=tuple(args.shape), host_bound_processes=args.host_bound_processes, jobs=args.jobs or 0,
                            gpus=args.gpus, device=device.type, resume=args.resume,
                            build_first=args.build_first)
    reporter = Reporter(quiet=False)
    # SIGTERM (a job scheduler's, timeout's) ends the batch as Ctrl-C does: its workers are killed on the way out,
    # and the records already written stay
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))
    if args.backend == "ray":
        try:
            from .ray_backend import run_batch_ray
        except ImportError as error:
            raise ProblemError(f"--backend ray needs ray ({error}): pip install '.[ray]'") from None
        summary = run_batch_ray(refs, candidates, results, options, name, console=reporter.console)
    else:
        summary = batch.run_batch(refs, candidates, results, options, name, console=reporter.console)
    print((results / "summary.md").read_text())
    reporter.console.print(f"summary: {_relative(results / 'summary.md')} and summary.json; records: {_relative(results / 'runs.jsonl')}")
    return 1 if summary.get("unrecorded") else 0


def cmd_build(args) -> int:
    from .runner import prebuild

    if args.dir is not None:
        from . import batch

        _, candidates, _ = _batch_candidates(args)
        outcomes = batch.build_candidates(candidates, args.jobs or os.cpu_count() or 1, _device(None),
                                          report=lambda text: print(text))
        for c in candidates:
            if str(c.path) in outcomes:
                ok, detail = outcomes[str(c.path)]
                state = ("cached" if not detail else f"built ({detail:.0f} s)") if ok else f"FAILED: {detail}"
                print(f"{c.problem}: {_relative(c.path)}: {state}")
        print(f"{sum(ok for ok, _ in outcomes.values())} of {len(outcomes)} candidate(s) that build CUDA code are built")
        return 0 if all(ok for ok, _ in outcomes.values()) else 1
    if args.suite is not None:
        raise ProblemError("--suite goes with --dir")
    items = [(find_problem(name), path) for name in (args.problems or available_problems()) for path in discover_solutions(name)]
    outcomes = prebuild(items, _device(None), jobs=args.jobs or 4)
    for problem, path in items:
        if str(path) in outcomes:
            ok, detail = outcomes[str(path)]
            print(f"{problem.name}: {_relative(path)}: " + (f"built ({detail:.0f} s)" if ok else f"FAILED: {detail}"))
    return 0 if all(ok for ok, _ in outcomes.values()) else 1


def cmd_new(args) -> int:
    from .scaffold import new_solution

    path = new_solution(find_problem(args.problem), args.name)
    print(f"wrote {_relative(path)}: its header says where to start; check and time it with\n"
          f"  make eval PROBLEM={args.problem} SOLUTION={_relative(path)}")
    return 0


def cmd_prompt(args) -> int:
    from .prompt import build_prompt

    sys.stdout.write(build_prompt(_named_problem(args.problem, PROBLEMS_DIR)))
    return 0


def cmd_list(_args) -> int:
    for name in available_problems():
        problem = find_problem(name)
        solutions = ", ".join(p.name for p in discover_solutions(name)) or "no solutions yet"
        print(f"{name}: {problem.description}\n  solutions: {solutions}\n  timing shapes: {', '.join(s.name for s in problem.shapes_for('timing'))}")
    return 0


def cmd_import_suite(args) -> int:
    """One line per file: what was made of it, or why it was skipped. Exit 1 when any file was skipped."""
    from .kernelbench import import_suite

    results = import_suite(args.source, args.into, args.force)
    for name, ok, line in results:
        print(f"{'imported' if ok else 'skipped'} {name}: {line}")
    made = sum(ok for _, ok, _ in results)
    print(f"{made} of {len(results)} files imported into {_relative(args.into)}")
    return 0 if made == len(results) else 1


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "eval":
            return cmd_eval(args)
        if args.command == "eval-batch":
            return cmd_eval_batch(args)
        if args.command == "leaderboard":
            summary = leaderboard.regenerate(args.results)
            print(f"wrote {args.results / 'leaderboard.md'} and leaderboard.json from {summary['records']} records"
                  + (f" ({summary['skipped_lines']} unreadable lines skipped)" if summary["skipped_lines"] else ""))
            return 0
        if args.command == "compare":
            return cmd_compare(args)
        if args.command == "selfcheck":
            return cmd_selfcheck(args)
        if args.command == "build":
            return cmd_build(args)
        if args.command == "new":
            return cmd_new(args)
        if args.command == "prompt":
            return cmd_prompt(args)
        if args.command == "import-suite":
            return cmd_import_suite(args)
        return cmd_list(args)
    except (ProblemError, CompareError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: records already written are kept", file=sys.stderr)
        return 130
    finally:
        sys.stdout.flush()
