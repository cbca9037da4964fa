"""The child process: imports and runs ONE solution (or a baseline) under the parent's orders.

Started by the parent as `python -m harness.child CMD_FD REPLY_FD GUARD_FD`. In this order, before any
solution code exists in the process:
  1. the first frame (the spec: paths, the channel's key, the sandbox's allow-lists) is read, and the size
     of any file the process writes is capped (its output goes to a file of the parent's);
  2. the process confines itself (harness/sandbox.py: Landlock) so it can write only its scratch and
     build folders and cannot touch the parent;
  3. a second thread takes over (Python runs signal handlers in the main thread only, and no solution
     code ever runs there), binds the channel's send/recv, imports torch and the harness, builds the
     timing loops over C-level primitives (timing.make_timer), seals torch's frame-evaluation hooks,
     takes the module-dict snapshot and installs the runtime guard (harness/guard.py, an audit hook
     that cannot be removed);
  4. only then is the solution imported.
Everything the child needs from then on is held in the serving thread's frames and closures (`serve`),
never in a module global. The child never draws an input, never sees a seed and never computes an expected
output: inputs and output slots are the parent's tensors (CUDA IPC, or shared files on the CPU), and
each reply is plain numbers and strings.
"""
from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

from .rules import Failure


def installed_versions(module: str) -> dict:
    """{distribution: version} for what provides an importable top-level module (quack -> quack-kernels)."""
    from importlib import metadata

    versions = {}
    for name in metadata.packages_distributions().get(module) or [module]:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def requirement_versions(distributions) -> dict:
    """{distribution: version} of what the given distributions require (extras and torch aside) and is
    installed: quack's speed follows the nvidia-cutlass-dsl it found, which quack does not pin."""
    import re
    from importlib import metadata

    versions = {}
    for dist in distributions:
        for requirement in metadata.requires(dist) or []:
            if "extra ==" in requirement:
                continue
            name = re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0]
            if name.lower() == "torch":
                continue
            try:
                versions[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                pass
    return versions


def classify(error: BaseException, phase: str) -> tuple:
    """(rule, one-line reason) for an exception raised by the target."""
    import torch

    if type(error) is Failure:  # exactly ours: a solution's exception names no rule
        return error.rule, error.reason
    text = str(error).strip()
    first = text.splitlines()[0] if text else type(error).__name__
    if isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in text.lower():
        return "out-of-memory", f"out of GPU memory while {phase}: {first[:300]}"
    if "CUDA error" in text or "cudaError" in text or "illegal memory access" in text or "device-side assert" in text:
        return "cuda-error", f"CUDA error while {phase}: {first[:300]}"
    where = ""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if "harness" not in Path(frame.filename).parts:
            where = f" (at {Path(frame.filename).name}:{frame.lineno})"
            break
    return "exception", f"{type(error).__name__} while {phase}: {first[:300]}{where}"


def main(argv) -> None:
    from .channel import recv_plain

    cmd_fd, reply_fd, guard_fd = (int(a) for a in argv[:3])
    spec = recv_plain(cmd_fd)
    # 1. no file may grow past the parent's limit (the build folder outlives this process; the output is read back),
    # and a write past it fails with EFBIG instead of killing the process
    import resource
    import signal

    resource.setrlimit(resource.RLIMIT_FSIZE, (spec["file_limit"], spec["file_limit"]))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    # 2. the sandbox, first of all (no thread exists yet: Landlock confines the calling thread and its children)
    sandbox_status = "none: the parent asked for no sandbox"
    if spec.get("sandbox"):
        from . import sandbox

        try:
            sandbox_status = sandbox.confine(spec["read_paths"], spec["write_paths"], spec.get("map_paths", ()),
                                             gpu=str(spec.get("device", "cpu")).startswith("cuda"))
        except sandbox.SandboxUnavailable as error:
            sandbox_status = f"none: {error}"
    # 3. Everything else runs in a second thread. Python runs signal handlers in the main thread only, and
    # hands them the main thread's frame: a handler the solution installs then finds this frame, which holds
    # nothing once the spec has been passed on, and never the serving thread's frames, closures or slots.
    import queue
    import threading

    handoff = queue.SimpleQueue()
    handoff.put((spec, guard_fd, sandbox_status))
    del spec
    worker = threading.Thread(target=_serve_thread, args=(cmd_fd, reply_fd, handoff), name="harness-child", daemon=True)
    worker.start()
    del handoff
    worker.join()
    os._exit(0)


def _serve_thread(cmd_fd: int, reply_fd: int, handoff) -> None:
    from .channel import open_channel

    spec, guard_fd, sandbox_status = handoff.get()
    send, recv = open_channel(cmd_fd, reply_fd, bytes.fromhex(spec.pop("key")))
    try:
        serve(spec, send, recv, guard_fd, sandbox_status)
    except BaseException as error:  # noqa: BLE001 - a failure outside a request is a verdict with a reason too
        # (SystemExit and the like included: otherwise the child would exit 0 with no word on why)
        traceback.print_exc()
        rule, reason = classify(error, "starting or between requests")
        try:
            send({"status": "fail", "rule": rule, "reason": reason})
        except Exception:  # noqa: BLE001
            pass
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def serve(spec: dict, send, recv, guard_fd: int, sandbox_status: str) -> None:
    import warnings

    warnings.simplefilter("ignore")  # library chatter (profiler, inductor) would bury the one-line verdicts
    import torch
    import torch._dynamo  # noqa: F401 - it rewraps some torch functions on import: before the snapshot
    import torch.utils.cpp_extension  # noqa: F401 - imported by solutions; its import adds to torch's dicts

    from . import build, guard, messages, profiling, timing
    from .channel import open_shared
    from .sandbox import pycache_prefix
    from .integrity import AtenOpRecorder, poison_freed
    from .problem import load_module, load_problem

    kind, device = spec["kind"], torch.device(spec["device"])
    cpus = timing.pin_near_device(device)
    problem = load_problem(spec["problem_dir"])
    problem.module  # noqa: B018 - import the reference before the solution
    marked = lambda: send({"status": "mark"})  # noqa: E731 - the parent reads its own clock as each mark arrives
    # The serving thread's dispatch keys as they are now: forward must leave them so (checked after every call)
    thread_keys = guard.ThreadDispatchKeys()
    key_changes = thread_keys.changes if kind == "solution" else (lambda expected=None: [])
    warm_up, timed_batch, burst_calls, queued_calls, issue_probe, after_call, seal, sync, guarded = timing.make_timer(
        device, marked, key_changes)
    keys_now = thread_keys.now
    # Bound now: the replies never pass through a lookup the solution could redirect (a thread of its own could
    # swap a module's name between the checkpoint and the send, and put it back)
    wire, sorted_ = messages.wire, sorted
    LoadReply, CallReply, TimeReply, BurstReply, QueuedReply, ProfileReply, ProbeReply, ReadyReply = (
        messages.LoadReply, messages.CallReply, messages.TimeReply, messages.BurstReply, messages.QueuedReply,
        messages.ProfileReply, messages.ProbeReply, messages.ReadyReply)
    kernel_summary, traced_ops = profiling.kernel_summary, profiling.traced_ops
    own_kernels = frozenset(spec.get("own_kernels") or ())  # what the solution's sources declare (the parent read them)
    # Bound now, for what the child reads after the solution's code and before the checkpoint (where a lookup
    # could be redirected for one use): the op names' type, an output's storage size.
    type_, str_, set_, tensor_type = type, str, set, torch.Tensor
    storage_of, storage_bytes = torch._C.TensorBase.untyped_storage, torch._C.StorageBase.nbytes
    trace_start, trace_stop = profiling.make_op_trace()
    kernel_start, kernel_stop = profiling.make_kernel_trace() if device.type == "cuda" else (None, None)
    is_solution = kind == "solution"
    if not is_solution:  # a baseline at fp32 computes in fp32: cuDNN's default TF32 convolutions miss fp32 tolerances
        torch.backends.cudnn.allow_tf32 = False
    hook_calls = guard.seal_frame_hooks() if is_solution else []
    library_calls = guard.seal_torch_library() if is_solution else []
    profiler_calls = guard.seal_profiler() if is_solution else []
    direct_calls = guard.seal_direct_calls() if is_solution else []
    fuser_calls = guard.seal_fusers() if is_solution else []
    # torch was imported from the bytecode beside it. From here on, before any solution code, no bytecode is written
    # (the guard refuses any .pyc write, and any .pyc read outside the installed packages), and what importlib
    # would look for is in scratch: a .pyc shipped beside a solution is never read in place of its source.
    sys.pycache_prefix, sys.dont_write_bytecode = pycache_prefix(spec["scratch"]), True
    snapshot_changes = guard.ModuleSnapshot().changes
    dispatch_changes = guard.DispatchTables(["aten::" + op for op in problem.core_op_names()]).changes
    # Every aten op's kernels, at the load's checkpoint and at a secret eighth of the others (a kernel that serves
    # the next request must be in place at this one's checkpoint: no solution code runs in between).
    aten_changes, urandom = guard.AtenKernels().changes, os.urandom
    active_modes = guard.active_modes
    set_phase = (guard.install(guard_fd, [spec["path"]], spec["write_paths"], spec["trusted_dirs"])
                 if is_solution and spec.get("guard", True) else (lambda phase: None))
    # Threads by two counts, neither taking a lock the solution could hold: every thread that runs Python now
    # (native ones too: torch's inter-op threads run Future callbacks), and _thread's, which counts a thread
    # from its start, before its first frame.
    thread_idents, raw_count, len_ = guard.make_thread_census(), getattr(__import__("_thread"), "_count", lambda: 0), len
    # And torch's inter-op pool, whose threads run TorchScript forks with no Python frame: counted from before the
    # import, so that one started by the solution, busy or idle, is a thread of its own.
    pool_threads = guard.make_pool_census()
    idents_before, raw_before, pool_before = thread_idents(), raw_count(), pool_threads()

    def no_threads(when: str):
        """background-thread when a thread of the solution's runs now (a solution's child only)."""
        count = max(len_(thread_idents() - idents_before), raw_count() - raw_before, pool_threads() - pool_before)
        if is_solution and count > 0:
            raise Failure("background-thread", f"{when}: {count} thread(s) still running")
    signals = __import__("_signal")
    getsignal, getitimer = signals.getsignal, signals.getitimer

    def handlers_now() -> dict:
        found = {}
        for number in range(1, 65):
            try:
                found[number] = getsignal(number)
            except (ValueError, OSError):
                pass
        return found

    handlers_before = handlers_now()
    state = {"module": None, "models": {}, "external": None, "unfreeze": False, "sealed": None, "held": None}

    def verify(phase: str):
        """The checkpoint after every phase that ran solution code. Threads first: a thread of the solution's
        that ran on through the checks below could undo what they look at."""
        if not is_solution:
            return
        no_threads(f"after {phase}")
        # Calls of sealed functions, even those the solution caught
        for refused in (hook_calls, profiler_calls, library_calls, direct_calls, fuser_calls):
            if refused:
                raise Failure(refused[0].rule, f"after {phase}: {refused[0].reason}")
        changed = snapshot_changes() + dispatch_changes() + key_changes()
        if phase == "loading" or urandom(1)[0] < 32:
            changed += aten_changes()
        if changed:
            raise Failure("tampering", f"after {phase}: {'; '.join(changed[:3])}")
        modes = active_modes()
        if modes:
            raise Failure("tampering", f"after {phase}: torch mode(s) left active: {', '.join(modes[:3])}")
        if handlers_now() != handlers_before or any(getitimer(which) != (0.0, 0.0) for which in (0, 1, 2)):
            raise Failure("tampering", f"after {phase}: a signal handler or interval timer was installed")

    gc_module = __import__("gc")
    gc_collect, gc_disable, gc_freeze, gc_unfreeze = gc_module.collect, gc_module.disable, gc_module.freeze, gc_module.unfreeze
    gc_disable()  # collections happen in release() alone: a finalizer is solution code, and must run where that may
    # What exists now (torch's heap, ours) is frozen: no collection looks at it again. A full one over it takes
    # ~200 ms, which every shape's change of models would otherwise pay.
    gc_collect()
    gc_freeze()

    def release(freeze: bool = False):
        """The end of a request's solution code: its garbage is collected now, so that its finalizers (solution
        code) run before the checkpoint, never between the checkpoint and the reply; the collector stays off
        after (the solution may have switched it on). The solution's module, once imported, is frozen too
        (`freeze`), so a collection looks only at what came since: models, which a change of shape drops, and
        each request's garbage. A baseline freezes after every request (torch.compile leaves a large heap), and
        unfreezes once its models were dropped, so that those in cycles are collected with what they hold."""
        state["sealed"] = state["held"] = None  # the last request's slots and records: callbacks hung on them run here
        if state["unfreeze"]:
            gc_unfreeze()
            state["unfreeze"] = False
        gc_collect()
        if freeze:
            gc_freeze()
        gc_disable()

    def load(_msg):
        versions = {}
        if kind == "solution":
            path = Path(spec["path"])
            build.prepare_build_env(path, problem.name)
            before = build.built_libraries(Path(spec["extension_dir"]))
            start = __import__("time").perf_counter()
            try:
                module = guarded(load_module)(path, f"solution_{path.stem}")
            except SyntaxError as error:
                raise Failure("import-error", f"syntax error at line {error.lineno}: {error.msg}") from None
            except BaseException as error:  # noqa: BLE001 - any failure to import is reported, not raised
                if build.is_build_failure(error):
                    raise Failure("compile-error", build.summarise_build_error(str(error))) from None
                rule, reason = classify(error, "importing the solution")
                raise Failure("import-error" if rule == "exception" else rule, reason) from None
            load_s = __import__("time").perf_counter() - start
            if not isinstance(getattr(module, "ModelNew", None), type):
                names = sorted(n for n, v in vars(module).items() if isinstance(v, type) and issubclass(v, torch.nn.Module))
                raise Failure("missing-ModelNew", "defines no class ModelNew" + (f" (nn.Module classes found: {', '.join(names)})" if names else ""))
            state["module"] = module
            after = build.built_libraries(Path(spec["extension_dir"]))
            verify("loading")
            set_phase("run")
            built = bool(after) and after != before
            return lambda: LoadReply(load_s, built, sandbox_status, cpus)
        if kind == "external":
            functions = load_module(problem.directory / "externals.py", f"externals_{problem.name}")
            for package in spec["requires"]:
                if __import__("importlib.util").util.find_spec(package) is None:
                    raise Failure("unavailable", f"{package} is not importable here")
                versions.update(installed_versions(package))
            state["external"] = getattr(functions, spec["function"])
        return lambda: LoadReply(0.0, False, sandbox_status, cpus, versions, requirement_versions(versions))

    def model_for(shape_name: str):
        if shape_name not in state["models"]:
            state["unfreeze"] = bool(state["models"]) and not is_solution  # a baseline's were frozen with its heap
            state["models"].clear()  # those in cycles go at this request's release
            shape = problem.shape(shape_name)
            extra = [state["module"]] if state["module"] is not None else []
            problem.apply_constants(shape, *extra)
            init = problem.module.get_init_inputs()
            if kind == "solution":
                set_phase("load")  # constructing is importing's kin: ModelNew.__init__ may build its extension
                model = guarded(state["module"].ModelNew)(*init)
            elif kind == "external":
                fn = state["external"]
                model = lambda *inputs: fn(*inputs)  # noqa: E731
            else:
                model = problem.module.Model(*init)
            if isinstance(model, torch.nn.Module):  # to() and eval() are the solution's to override, so checked too
                model = guarded(lambda: model.to(device).eval())()
            if kind == "compile":
                model = torch.compile(model, dynamic=False)
            state["models"][shape_name] = guarded(model) if is_solution else model
            verify("constructing the model")
            set_phase("run")
        return state["models"][shape_name]

    def opened(descriptions):
        return [open_shared(d["tensor"]) if "tensor" in d else d["value"] for d in descriptions]

    def call(msg):
        """One correctness trial: the call (its aten ops recorded), its output copied into the slot."""
        model = model_for(msg["shape"])
        inputs, slot = opened(msg["inputs"]), open_shared(msg["slot"])
        recorder = recorded = traced = None
        if is_solution:
            recorder = AtenOpRecorder()
        with torch.no_grad():
            if recorder is not None:
                # Two records of the aten ops: the dispatch mode, and the profiler's C++ callbacks (the one that
                # counts: a solution can reach the mode on torch's mode stack and empty its set, never the trace's
                # results, which only this frame holds). Its set is held here too, and read as the plain set it was.
                recorded = recorder.ops
                trace_start()
                try:
                    with recorder:
                        keys = keys_now()
                        out = model(*inputs)
                        # Copied while both records still run: what runs as they stop (torch's Python, which a
                        # patch that undoes itself can reach) can no longer change what the parent gets.
                        after_call(out, slot, 1, keys)
                finally:
                    traced = trace_stop()
            else:
                out = model(*inputs)
                after_call(out, slot)
        sync()
        sizes = [storage_bytes(storage_of(out))] if type_(out) is tensor_type else []
        del out, inputs, slot
        # The dispatch mode's record is read after the checkpoint (a class patched to hide an op for one read is still
        # in place there) and held until the next request's release (a finalizer hung on it runs there, not after the send).
        state["held"] = (recorder, recorded)

        def reply():
            ops = []
            if recorder is not None:
                if recorder.ops is not recorded or type_(recorded) is not set_:
                    raise Failure("tampering", "after the checked call: the op recorder's record was replaced")
                if traced is None:
                    raise Failure("tampering", "during the checked call: the op trace was stopped or replaced")
                plain = {op for op in recorded if type_(op) is str_}  # iterated, never compared: no solution code runs
                ops = sorted_(plain | traced)
            poison_freed(sizes if device.type == "cuda" else [])
            return CallReply(ops)
        return reply

    empty = torch.empty

    def time_batch(msg):
        model = model_for(msg["shape"])
        sets = [opened(s) for s in msg["sets"]]
        slots = [open_shared(s) for s in msg["slots"]]
        if msg.get("null"):  # the parent's yardstick: the same batch with a call that does nothing
            # Its output is made once, here: allocating it per call would hand the solution a lever on the
            # yardstick (an allocator it left fragmented slows every allocation but those it avoids itself).
            blank = empty(tuple(slots[0].shape), dtype=slots[0].dtype, device=device)
            model = lambda *inputs: blank  # noqa: E731
        with torch.no_grad():
            if msg.get("warmup_s"):
                warm_up(model, sets[0], msg["warmup_s"])
            times = timed_batch(model, sets, slots)
        del sets, slots, model
        return lambda: TimeReply(times)

    def burst(msg):
        model = model_for(msg["shape"])
        sets = [opened(s) for s in msg["sets"]]
        with torch.no_grad():
            result = burst_calls(model, sets, int(msg["calls"]))
        del sets, model
        return lambda: BurstReply(**result)

    def queued(msg):
        model = model_for(msg["shape"])
        sets = [opened(s) for s in msg["sets"]]
        slots = [open_shared(s) for s in msg["slots"]]
        with torch.no_grad():
            device_ms = queued_calls(model, sets, slots, float(msg["host_ms_per_call"]))
        del sets, slots, model
        return lambda: QueuedReply(device_ms)

    def profile(msg):
        """Two calls under the kernel trace (CPU ops and GPU activity), the second's output then copied into the
        slot: the profiled calls are checked as a trial is, their ops and their output. The copy follows the
        trace's end, which runs no Python (so no solution code), to keep the harness's copy out of the kernels."""
        model = model_for(msg["shape"])
        inputs, slot = opened(msg["inputs"]), open_shared(msg["slot"])
        out = None
        sync()
        kernel_start()
        try:
            with torch.no_grad():
                keys = keys_now()
                model(*inputs)
                out = model(*inputs)
                sync()
        finally:
            rows = kernel_stop()
        with torch.no_grad():
            after_call(out, slot, 0, keys)
        sync()
        del out, inputs, slot, model

        def reply():
            if rows is None:
                raise Failure("tampering", "during the profiled calls: the kernel trace was stopped or replaced")
            return ProfileReply(ops=sorted_(traced_ops(rows)), **kernel_summary(rows, own_names=own_kernels))
        return reply

    def probe(_msg):
        probe_us = issue_probe()
        return lambda: ProbeReply(probe_us)

    def ready(_msg):
        return lambda: ReadyReply()

    handlers = {"load": ("loading", load), "call": ("running a correctness trial", call), "time": ("timing", time_batch),
                "burst": ("the escape check", burst), "queued": ("timing queued calls", queued),
                "profile": ("profiling", profile), "probe": ("probing the host", probe), "ready": ("starting", ready)}
    while True:
        msg = recv()
        command = msg.get("cmd")
        if command == "quit":
            return
        phase, handler = handlers[command]
        try:
            # The handler runs the solution's code and hands back how to make the reply. Then the solution's last
            # code (its garbage's finalizers), the checkpoint, the outputs sealed into their slots, and only then
            # the reply: a patch the solution left to forge it, even one that undoes itself once used, is still
            # in place at the checkpoint, and nothing of the solution runs between the checkpoint and the send.
            make_reply = handler(msg)
            release(freeze=command == "load" or not is_solution)  # a baseline's torch.compile leaves a large heap
            verify(phase)
            state["sealed"] = seal()
            payload = {"status": "ok", **wire(make_reply())}
            del make_reply
            no_threads(f"after {phase}, once the reply was made")  # counted again: one born since the checkpoint
        except BaseException as error:  # noqa: BLE001 - every failure becomes a one-line reason
            rule, reason = classify(error, phase)
            send({"status": "fail", "rule": rule, "reason": reason})
            # A solution is done at its first failure; a baseline or another library may still run the
            # other shapes (Liger's softmax refuses rows over 64K), unless CUDA is broken.
            if is_solution or command == "load" or rule == "cuda-error":
                return
            continue
        send(payload)


if __name__ == "__main__":
    main(sys.argv[1:])
