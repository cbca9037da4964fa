"""The runtime guard of the child that imports a solution: introspection is a verdict, not a warning.

`install` adds an audit hook (sys.addaudithook: it can never be removed) that watches what the solution
does and kills the process at once (status GUARD_EXIT, after one "rule<TAB>reason" line on report_fd)
when it inspects the interpreter, writes outside its scratch folders or starts threads or processes when
it must not. The solution cannot catch the kill: there is no exception, and no code of its own runs.

Who did it: an event is the solution's when a solution frame (its file, its scratch folders, code that is
not a real file, anything outside the trusted folders) is among the NEAR frames nearest to it, so that
inspect.stack() or traceback.walk_stack() called by the solution count. A frame read further away is the
solution's too, at any depth, unless a trusted consumer (namedtuple's module name, logging's caller,
torch.library, a lazily imported trusted module) stands between: library helpers that hand frames back
lead by f_back to the child's serving frame. Holes this leaves, and what covers them:
  - frame attributes (f_back, f_locals, f_globals), closure cells, __globals__ and module or class
    attribute writes raise no audit event: the static scan (harness/scan.py) and ModuleSnapshot
    cover them, and a frame or a gc object list cannot be had without an audited call in the first place;
  - torch's helpers that switch dispatch modes off raise no event: the scan and active_modes();
  - native code (the solution's own C++/CUDA, or torch's raw-pointer helpers) raises no event: the
    scan of its sources and the sandbox (Landlock) cover it;
  - on Python 3.11 starting a thread raises no event (3.12 audits _thread.start_new_thread): a thread
    is caught by its first audited action, or by the child's thread count at each checkpoint, and the
    ops it runs during a trial by the trial's op trace, which records every thread;
  - the `open` event carries no dir_fd: a name relative to a descriptor is judged as if relative to the
    working folder (Landlock holds the line; relative names of /proc's memory entries are refused).
Bytecode: the child writes none once the solution may run, so only the installed packages' .pyc files are
read, and only importlib's get_code unmarshals; a code object named as an installed file is never made while
solution code is on the stack (it would run with that file's trust, through importlib's loader if need be).

ModuleSnapshot: identity snapshot of the dicts of the modules (and classes) the harness and torch rely
on, to find attributes a solution replaced or added (shadowing `super` in torch.cuda.streams makes
Event.elapsed_time return a chosen number). active_modes(): torch function and dispatch modes left active.
"""
from __future__ import annotations

import functools
import os
import sys
import types

GUARD_EXIT = 86  # exit status of a child killed by the guard
PHASES = ("load", "run")
NEAR = 4    # a solution frame this close to an event makes it the solution's
REACH = 8   # how many frames above an event are looked at to find who asked for it
RULES = ("introspection", "sandbox-violation", "background-thread")

# Audit events that hand out frames, every object, or tracing of other code ("introspection").
_FRAME_EVENTS = {
    "sys._getframe": ("_getframe",),
    "sys._getframemodulename": ("_getframemodulename",),           # 3.12
    "sys._current_frames": ("_current_frames",),
    "sys._current_exceptions": ("_current_exceptions",),
    "sys.settrace": ("settrace", "settrace_all_threads", "_settraceallthreads"),
    "sys.setprofile": ("setprofile", "setprofile_all_threads", "_setprofileallthreads"),
    "sys.monitoring.register_callback": ("register_callback",),    # 3.12
    "gc.get_objects": ("get_objects",),
    "gc.get_referrers": ("get_referrers",),
    "gc.get_referents": ("get_referents",),
    "builtins.breakpoint": ("breakpoint",),
}
# Attributes whose read is audited (object.__getattr__): a frame, or a code object.
_FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
_CODE_ATTRS = frozenset({"__code__", "f_code", "gi_code", "cr_code", "ag_code"})
# Attributes whose write is audited (object.__setattr__) and that rewrite behaviour.
_REWRITE_ATTRS = frozenset({"__code__", "__defaults__", "__kwdefaults__", "__class__", "__bases__"})
# Making code or functions from parts, loading bytecode, raw memory: introspection as well.
_MAKER_EVENTS = frozenset({
    "code.__new__", "function.__new__", "marshal.loads", "marshal.load", "sys.addaudithook",
    "ctypes.addressof", "ctypes.call_function", "ctypes.cdata", "ctypes.cdata/buffer", "ctypes.create_string_buffer",
    "ctypes.create_unicode_buffer", "ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.get_errno",
    "ctypes.get_last_error", "ctypes.set_errno", "ctypes.set_exception", "ctypes.set_last_error", "ctypes.string_at",
    "ctypes.wstring_at", "ctypes.memoryview_at", "ctypes.PyObj_FromPtr",
})
_PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.posix_spawn", "os.spawn", "os.exec", "os.fork",
                             "os.forkpty", "pty.spawn", "os.startfile"})
_SOCKET_EVENTS = frozenset({"socket.__new__", "socket.bind", "socket.connect", "socket.sendto", "socket.sendmsg",
                            "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo"})
# File system events: event -> (index of a path argument it changes, index of that path's dir_fd or None), each.
_WRITE_EVENTS = {
    "os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),), "os.chmod": ((0, 2),),
    "os.chown": ((0, 3),), "os.utime": ((0, 3),), "os.truncate": ((0, None),), "os.mkfifo": ((0, 2),),
    "os.mknod": ((0, 3),), "os.setxattr": ((0, None),), "os.removexattr": ((0, None),),
    "os.rename": ((0, 2), (1, 3)), "os.link": ((0, 2), (1, 3)), "os.symlink": ((1, 2),),  # src_dir_fd, dst_dir_fd
}
_LIST_EVENTS = frozenset({"os.listdir", "os.scandir"})
_THREAD_EVENTS = frozenset({"_thread.start_new_thread"})  # 3.12
# Device files anybody may write (subprocess opens /dev/null read-write for DEVNULL).
_DEVICES = frozenset({"/dev/null", "/dev/zero", "/dev/full"})
_RAW_MEMORY = frozenset({"/dev/mem", "/dev/kmem", "/dev/port", "/proc/kcore"})

# Trusted functions that look at their caller's frame and hand nothing of it back: when one of them is
# between an event and the solution, the event is theirs. (file suffix, qualified name, via): the frames
# between the event and the function must all be in its own file (the function itself, or a helper such as
# logging's currentframe), or, where `via` is a file suffix, all in that file (traceback's walkers under a
# formatter that returns text). A function that calls what it is handed (torch.library's pystub check,
# torch.cuda._lazy_call once CUDA runs) would hand frames out, so only the functions themselves are listed.
# The top level of any trusted module counts as well: torch imports modules lazily during a call.
_CONSUMERS = (
    ("/collections/__init__.py", "namedtuple", None),       # the caller's module name; sets its own __new__.__defaults__
    ("/typing.py", "_caller", None),                        # TypeVar, NewType, TypedDict: the caller's module name
    ("/typing_extensions.py", "_caller", None),             # the same, in the backport torch uses
    ("/typing_extensions.py", "_has_generic_or_protocol_as_origin", None),  # Generic[...]: a yes/no about typing's frame
    ("/typing.py", "NamedTupleMeta.__new__", None),         # class X(NamedTuple): sets the new class's __bases__
    ("/enum.py", "EnumType._create_", None),                # Enum('Name', 'a b'): the caller's module name
    ("/logging/__init__.py", "Logger.findCaller", None),    # file, line, function of a log record; its stack as text
    ("/subprocess.py", "_text_encoding", None),             # -X warn_default_encoding: a warning's stack level
    ("/torch/library.py", "Library.__init__", None),        # torch.library.Library: where it was made
    ("/torch/library.py", "Library._register_fake", None),  # register_fake: the caller's module
    ("/torch/_library/utils.py", "get_source", None),       # "file:line" of a custom op's registration
    ("/torch/cuda/__init__.py", "_lazy_call", "/traceback.py"),  # a call queued before CUDA starts keeps its stack as text
    # traceback's formatters: text, never frames (walk_tb and walk_stack called directly still hand frames out)
    *(("/traceback.py", name, None) for name in (
        "print_exc", "format_exc", "print_exception", "format_exception", "print_tb", "format_tb", "extract_tb",
        "print_stack", "format_stack", "extract_stack", "print_last", "TracebackException.__init__")),
)
# What the consumers call with a frame in hand (module dicts and their classes' dicts, checked at each event).
_CONSUMER_MODULES = ("logging", "inspect", "linecache", "tokenize", "traceback", "posixpath", "os", "typing",
                     "typing_extensions", "enum", "collections", "subprocess", "io", "codecs", "functools",
                     "torch.library", "torch._library.utils", "torch.cuda")
# Library code that uses the frames it asks inspect for itself (names and lines for its own messages) rather than
# hand them back, as a generic helper such as tree_map would: (path part, a path part that must stand between it
# and the solution, or None). torch._jit_internal's resolution callbacks read any frame's locals for whoever
# calls them: they count only under torch.jit's own entry points.
_FRAME_CONSUMERS = (("/filelock/", None), ("/setuptools/command/install.py", None), ("/torch/_jit_internal.py", "/torch/jit/"),
                    ("/torch/jit/_trace.py", None), ("/torch/utils/_traceback.py", None), ("/torch/_sources.py", None),
                    ("/torch/jit/frontend.py", None))


def _real(path) -> str:
    import os

    return os.path.realpath(os.path.abspath(str(path)))


def _roots(paths) -> tuple:
    return tuple(sorted({_real(p) for p in paths if p}))


def _solution_paths(solution_files) -> frozenset:
    """The solution files as given and resolved."""
    return frozenset({str(p) for p in solution_files} | {_real(p) for p in solution_files})


def make_thread_census():
    """thread_idents() -> frozenset: the idents of every thread running Python now. Native threads count too: a
    Future callback on torch's inter-op pool (a TorchScript fork's) has a thread state and a frame, and neither
    threading's count nor _thread's sees it. Takes no lock a solution could hold (threading.active_count does).
    The guard lets this function alone read every thread's frames: only the idents leave it."""
    current_frames, idents = sys._current_frames, frozenset
    def thread_idents() -> frozenset:
        return idents(current_frames())
    return thread_idents


_CENSUS_CODE = make_thread_census().__code__

# torch's inter-op thread pool (c10's ThreadPool names its threads so): TorchScript's fork and at::launch run work
# there with no Python frame, which no census of Python threads sees. Honest forwards never start it.
POOL_THREAD_NAME = b"PTThreadPool"


def make_pool_census():
    """pool_threads() -> int: how many of this process's threads are torch's inter-op pool's, read by name from
    /proc/self/task (0 where there is none). Bound now, before any solution code: os is a module it may rewrite."""
    listdir, os_open, os_read, os_close, flags, name = os.listdir, os.open, os.read, os.close, os.O_RDONLY, POOL_THREAD_NAME

    def pool_threads() -> int:
        try:
            tids = listdir("/proc/self/task")
        except OSError:
            return 0
        count = 0
        for tid in tids:
            try:
                fd = os_open("/proc/self/task/" + tid + "/comm", flags)
            except OSError:
                continue  # the thread has ended
            try:
                count += os_read(fd, 64).strip() == name
            except OSError:
                pass
            finally:
                os_close(fd)
        return count
    return pool_threads


def install(report_fd: int, solution_files, scratch_dirs, trusted_dirs):
    """Install the hook and return set_phase(name), name in PHASES (it starts in "load").

    Everything the hook uses is bound here, before the solution exists: the solution may later rewrite
    any module (os._exit included), and the hook must not be reachable from a module global, so it is
    a closure of this call, and so is everything it calls (no global or builtin is looked up by name:
    tests/test_guard.py checks the bytecode).
    """
    import _imp
    import _thread
    import builtins
    import gc
    import importlib
    import importlib._bootstrap as bootstrap
    import importlib._bootstrap_external as bootstrap_external
    import os
    import pathlib
    import sysconfig
    import threading

    os_write, os_exit, getpid, readlink, getcwd, os_open, os_read, os_close, fspath, lstat = (
        os.write, os._exit, os.getpid, os.readlink, os.getcwd, os.open, os.read, os.close, os.fspath, os.lstat)
    getframe, get_ident, is_frozen, addaudithook = sys._getframe, _thread.get_ident, _imp.is_frozen, sys.addaudithook
    gc_isenabled, gc_disable, gc_enable = gc.isenabled, gc.disable, gc.enable
    fs_encoding, exit_code = sys.getfilesystemencoding(), GUARD_EXIT
    O_RDONLY, O_CLOEXEC = os.O_RDONLY, getattr(os, "O_CLOEXEC", 0)
    WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    _str, _bytes, _int, _type, _len, _range, id_ = str, bytes, int, type, len, range, id
    _BaseException, _OSError, _ValueError = BaseException, OSError, ValueError
    CodeType, FunctionType, MethodType = types.CodeType, types.FunctionType, types.MethodType
    globals_of = types.FrameType.__dict__["f_globals"].__get__  # a frame's globals, read past any lookup
    mro_of = type.__dict__["__mro__"].__get__      # the real MRO and class dict, whatever a metaclass says
    dict_of = type.__dict__["__dict__"].__get__
    path_types = frozenset({pathlib.PosixPath, pathlib.PurePosixPath})
    # importlib's own code, by identity: the only code that may run trusted-named code or unmarshal a .pyc
    call_removed = bootstrap._call_with_frames_removed.__code__
    loader_exec = bootstrap_external._LoaderBasics.exec_module.__code__
    frozen_exec = bootstrap.FrozenImporter.exec_module.__code__
    file_loaders = frozenset({bootstrap_external.SourceFileLoader, bootstrap_external.SourcelessFileLoader})
    unmarshal = bootstrap_external._compile_bytecode.__code__
    census_code = _CENSUS_CODE  # the child's thread census: it reads every frame and hands back idents alone
    pyc_readers = frozenset({bootstrap_external.SourceLoader.get_code.__code__, bootstrap_external.SourcelessFileLoader.get_code.__code__})
    thread_bootstrap, Thread, thread_run = threading.Thread._bootstrap, threading.Thread, threading.Thread.run

    solution_set = _solution_paths(solution_files)
    scratch, trusted = _roots(scratch_dirs), _roots(trusted_dirs)
    shared_memory = _roots(["/dev/shm"])
    harness_dir = (_real(os.path.dirname(__file__)),)
    stdlib_dir = (_real(sysconfig.get_paths()["stdlib"]),)
    frame_events = dict(_FRAME_EVENTS)
    frame_attrs, code_attrs, rewrite_attrs, maker_events = _FRAME_ATTRS, _CODE_ATTRS, _REWRITE_ATTRS, _MAKER_EVENTS
    process_events, socket_events, write_events, list_events = _PROCESS_EVENTS, _SOCKET_EVENTS, dict(_WRITE_EVENTS), _LIST_EVENTS
    thread_events, devices, raw_memory, consumers, frame_consumers = _THREAD_EVENTS, _DEVICES, _RAW_MEMORY, _CONSUMERS, _FRAME_CONSUMERS
    near, reach, phases, everything = NEAR, REACH, PHASES, 1 << 30
    interesting = frozenset(set(frame_events) | maker_events | process_events | socket_events | set(write_events)
                            | list_events | thread_events | {"object.__getattr__", "object.__setattr__", "open", "mmap.__new__",
                                                             "compile", "exec", "os.kill", "os.killpg", "os.chdir"})
    install_thread = get_ident()
    state = {"phase": "load"}
    # The dicts of the modules (and of their classes) whose code the consumers run with a frame in hand: a
    # consumer is trusted only while they are as they were, checked at the event (a solution could swap
    # logging._is_internal_frame or inspect.getframeinfo for the length of one call and be handed the frame).
    # Module dicts: their functions, classes and modules (plain values such as torch.cuda._initialized change under
    # honest use), and no builtin's name added; class dicts: everything.
    watched_items, watched_maps, builtin_names = [], [], frozenset(vars(builtins))
    for module_name in _CONSUMER_MODULES:
        # the standard library's imported now, before the solution (the child imported torch's already, and
        # torch's import patches inspect): a consumer runs only with its module's globals as they are now
        if not module_name.startswith("torch") and module_name not in sys.modules:
            try:
                importlib.import_module(module_name)
            except ImportError:
                pass
    for module_name in _CONSUMER_MODULES:
        module = sys.modules.get(module_name)
        mapping = getattr(module, "__dict__", None)
        if type(mapping) is not dict:
            continue
        watched_maps.append((mapping, frozenset(mapping)))
        for key, value in list(mapping.items()):
            if callable(value) or isinstance(value, types.ModuleType):
                watched_items.append((mapping, key, value))
            if type(value) is type and value.__module__ == module_name:
                for class_key, class_value in list(dict_of(value).items()):
                    watched_items.append((dict_of(value), class_key, class_value))
    # Threads inside the hook's own frame reads (sys._getframe, frame.f_code): their nested events are the
    # hook's own. The window holds C calls only, with the cyclic GC off so that no finalizer (__del__) of the
    # solution runs inside it; signal handlers run in the main thread only (the child serves from another).
    quiet = set()
    kinds = {}      # co_filename -> kind

    # ----- paths, file names, frames ----------------------------------------------------------------------
    def hush(tid):
        was = gc_isenabled()
        gc_disable()
        quiet.add(tid)
        return was

    def unhush(tid, was):
        quiet.discard(tid)
        if was:
            gc_enable()

    def under(path, dirs):
        for d in dirs:
            if path == d or path.startswith(d + "/"):
                return True
        return False

    def plain(value):
        """A path argument as an exact str; None for a descriptor; False for an object whose own methods
        would have to run to tell (a str subclass or a custom PathLike may answer differently each time)."""
        t = _type(value)
        if t is _str:
            return value
        if t is _bytes:
            return value.decode(fs_encoding, "surrogateescape")
        if t is _int or value is None:
            return None
        if t in path_types:
            return plain(fspath(value))
        return False

    def absolute(path, dir_fd=None):
        if path.startswith("/"):
            return path
        base = getcwd()
        if _type(dir_fd) is _int and dir_fd >= 0:
            try:
                base = readlink("/proc/self/fd/" + _str(dir_fd))
            except (_OSError, _ValueError):
                pass
        return base + "/" + path

    def descriptor_path(fd):
        """The path an open descriptor holds, as /proc tells it; False (refused) when that cannot be read."""
        try:
            return readlink("/proc/self/fd/" + _str(fd))
        except (_OSError, _ValueError):
            return False

    def resolve(path, dir_fd=None):
        """The real path, symlinks followed with os.readlink alone (os.path may have been rewritten)."""
        todo = absolute(path, dir_fd).split("/")
        todo.reverse()
        done, hops = [], 0
        while todo:
            part = todo.pop()
            if part == "" or part == ".":
                continue
            if part == "..":
                if done:
                    done.pop()
                continue
            candidate = "/" + "/".join(done) + ("/" if done else "") + part
            try:
                target = readlink(candidate)
            except (_OSError, _ValueError):
                done.append(part)
                continue
            hops += 1
            if hops > 40:
                done.append(part)
                continue
            if target.startswith("/"):
                done = []
            more = target.split("/")
            more.reverse()
            todo.extend(more)
        return "/" + "/".join(done)

    def kind_of(filename):
        """'solution', 'harness', 'stdlib', 'importlib' or 'lib' (another trusted file) for a co_filename."""
        if _type(filename) is not _str:
            return "solution"
        known = kinds.get(filename)
        if known is not None:
            return known
        if filename in solution_set:
            kind = "solution"
        elif filename.startswith("<"):
            name = filename[8:-1] if filename.startswith("<frozen ") and filename.endswith(">") else None
            if name is not None and name.startswith("importlib._bootstrap"):
                kind = "importlib"
            elif name is not None and is_frozen(name):
                kind = "stdlib"  # 3.11+ freezes os, posixpath, codecs, abc, site...: "<frozen os>"
            else:
                kind = "solution"  # "<string>", "<stdin>", generated or exec'd code
        else:
            path = resolve(filename)
            if path in solution_set or under(path, scratch) or not under(path, trusted):
                kind = "solution"
            elif under(path, harness_dir):
                kind = "harness"
            elif under(path, stdlib_dir) and "/site-packages/" not in path and "/dist-packages/" not in path:
                kind = "stdlib"
            else:
                kind = "lib"
        kinds[filename] = kind
        return kind

    def stack(first, depth):
        """[(kind, filename, function, line, frame, code)] from `first` up, at most `depth` of them."""
        found, frame, tid = [], first, get_ident()
        was = hush(tid)
        try:
            while frame is not None and _len(found) < depth:
                code = frame.f_code
                found.append((code, frame, frame.f_lineno))
                frame = frame.f_back
        finally:
            unhush(tid, was)
        chain = []
        for code, frame, line in found:
            filename, name = code.co_filename, code.co_qualname
            filename = filename if _type(filename) is _str else "<?>"
            name = name if _type(name) is _str else "<?>"
            chain.append((kind_of(code.co_filename), filename, name, line, frame, code))
        return chain

    def where(entry):
        return entry[1].rsplit("/", 1)[-1] + ":" + _str(entry[3])

    def at(chain, text):
        return text + (" (" + where(chain[0]) + ")" if chain else "")

    def consumer(entry, caller=None):
        """(the consumer's file suffix, its `via`) when `entry` is a consumer, else None."""
        kind, filename, name = entry[0], entry[1], entry[2]
        if kind != "stdlib" and kind != "lib":
            return None
        if name == "<module>":
            # a trusted module's top level that importlib is running now (a lazy import during a call; its
            # code passed the exec check): not the main script at the bottom of the stack
            return (filename, None) if caller is not None and caller[5] is call_removed else None
        for suffix, function, via in consumers:
            if filename.endswith(suffix) and function == name:
                # its own module's globals, as they were at install: its code object run with other globals (a new
                # function, or a solution function given it as __code__) would call what the solution put there
                return (suffix, via) if id_(globals_of(entry[4])) in genuine_globals else None
        return None

    genuine_globals = frozenset(id_(mapping) for mapping, _ in watched_maps)

    def consumers_intact():
        for mapping, key, value in watched_items:
            if mapping.get(key, mapping) is not value:
                return False
        for mapping, keys in watched_maps:
            if _len(mapping) != _len(keys):
                for key in mapping:
                    if key not in keys and key in builtin_names:
                        return False
        return True

    def consumer_before(chain, stop):
        """A consumer stands between the event (chain[0]) and `stop`, with only its own file's frames (or its
        `via` file's) below it."""
        end = _len(chain) if stop is None else stop
        for i in _range(end):
            if chain[i][2] == "<module>":
                if consumer(chain[i], chain[i + 1] if i + 1 < _len(chain) else None):
                    return True
                continue
            found = consumer(chain[i])
            if found is None or (found[1] is not None and i == 0):
                continue  # a `via` consumer raising the event itself calls what it was handed (_lazy_call once CUDA runs)
            below = found[1] if found[1] is not None else found[0]
            for j in _range(i):
                if not chain[j][1].endswith(below):
                    break
            else:
                return consumers_intact()
        return False

    def nearest_solution(chain):
        for i in _range(_len(chain) if _len(chain) < near else near):
            if chain[i][0] == "solution":
                return i
        return None

    def hands_out_frames(entry):
        filename, name = entry[1], entry[2]
        return filename.endswith("/inspect.py") or (filename.endswith("/traceback.py") and name in ("walk_stack", "walk_tb"))

    def consumes_frames(entry):
        """Library code known to use the frames it asks inspect for itself (_FRAME_CONSUMERS)."""
        filename = entry[1]
        for part, needs in frame_consumers:
            if part in filename:
                if needs is None:
                    return True
                for above in stack(entry[4], everything)[1:]:  # its caller and up, to the solution
                    if above[0] == "solution":
                        return False
                    if needs in above[1]:
                        return True
                return False
        return False

    def first_solution(chain):
        for entry in chain:
            if entry[0] == "solution":
                return entry
        return None

    def harness_asked(chain):
        """The first caller above the standard library is the harness (its own error reports)."""
        for entry in chain:
            if entry[0] == "harness":
                return True
            if entry[0] != "stdlib" and entry[0] != "importlib":
                return False
        return False

    def names_any(code, wanted):
        for pool in (code.co_names, code.co_consts):
            for item in pool:
                if _type(item) is _str:
                    for w in wanted:
                        if item == w:
                            return True
        return False

    # ----- the rules ----------------------------------------------------------------------------------------
    def judge_frames(event, chain, wanted):
        """Frames, every object, tracing: the solution's when it is near (and no consumer stands between);
        an indirection (a C callback, functools.partial) when the nearest code does not even name the call;
        and while the solution runs, anything but the harness's own error reports."""
        s = nearest_solution(chain)
        if chain and hands_out_frames(chain[0]) and not (_len(chain) > 1 and consumes_frames(chain[1])):
            # inspect.stack() and its kin return frames to whoever called them, however deep the solution
            # hides behind library helpers (tree_map of a partial of inspect.stack, say), unless a formatter
            # that turns them into text (traceback.format_exc) stands between
            full = stack(chain[0][4], everything)
            for i in _range(_len(full)):
                if full[i][0] == "solution":
                    if consumer_before(full, i):
                        return None
                    return "introspection", event + " through " + where(chain[0]) + ", handing frames to the solution (" + where(full[i]) + ")"
        if consumer_before(chain, s):
            return None
        if s is not None:
            return "introspection", event + " called by the solution (" + where(chain[s]) + ")"
        if chain and wanted and not names_any(chain[0][5], wanted):
            return "introspection", at(chain, event + " called through an indirection; nearest Python code")
        if state["phase"] == "run" and not harness_asked(chain):
            return "introspection", at(chain, event + " while the solution runs")
        if chain:
            # While the solution's import runs, a frame read anywhere under it is its own unless a consumer (or
            # a library known to keep the frames it reads) stands between: library helpers that hand frames
            # back (asyncio's task stacks, traceback's extractors, under any depth of tree_map) lead by f_back
            # to the child's serving frame.
            full = stack(chain[0][4], everything)
            for i in _range(_len(full)):
                if full[i][0] == "solution":
                    if hands_out_frames(full[0]) and i > 1 and consumes_frames(full[1]):
                        return None
                    if consumer_before(full, i):
                        return None
                    return "introspection", event + " (" + where(chain[0]) + ") under the solution's import (" + where(full[i]) + ")"
        return None

    def judge_maker(event, chain):
        if event == "sys.addaudithook":
            return "introspection", at(chain, "adds an audit hook")
        s = nearest_solution(chain)
        if consumer_before(chain, s):
            return None  # namedtuple setting its own __new__.__defaults__, torch.library building a wrapper
        if s is not None:
            return "introspection", event + " called by the solution (" + where(chain[s]) + ")"
        if event.startswith("marshal."):
            # importlib reading a .pyc for an import (the open rule keeps .pyc reads to the installed packages);
            # zipimport, or importlib's own function reached through a trampoline, is bytecode no scan read
            if _len(chain) > 1 and chain[0][5] is unmarshal and chain[1][5] in pyc_readers:
                return None
            return "introspection", at(chain, event + ": bytecode that is not an installed module's cache")
        if state["phase"] == "run" and not harness_asked(chain):
            return "introspection", at(chain, event + " while the solution runs")
        return None

    def trusted_name(filename):
        if _type(filename) is not _str:
            return False
        if filename.startswith("<frozen"):
            return True
        return not filename.startswith("<") and kind_of(filename) != "solution"

    def same_as_file(filename, source):
        """compile() under a trusted file name must compile that very file (else code passes for torch's)."""
        if _type(source) is not _bytes and _type(source) is not _str:
            return False
        parts = []
        try:
            fd = os_open(filename, O_RDONLY | O_CLOEXEC)  # its own 'open' event is judged like any other
            try:
                while True:
                    block = os_read(fd, 1 << 20)
                    if not block:
                        break
                    parts.append(block)
            finally:
                os_close(fd)
        except (_OSError, _ValueError):
            return False
        data = b"".join(parts)
        if _type(source) is _bytes:
            return data == source
        return data.decode("utf-8", "surrogateescape") == source

    def judge_code(event, args, chain):
        if chain and chain[0][0] == "solution":
            return "introspection", at(chain, ("compiles" if event == "compile" else "executes") + " code at run time")
        if event == "compile":
            source = args[0] if _len(args) > 0 else None
            filename = args[1] if _len(args) > 1 else None
            if trusted_name(filename) and (filename.startswith("<") or not same_as_file(filename, source)):
                return "introspection", "compiles code under the trusted file name " + filename
            return None
        code = args[0] if args else None
        if _type(code) is CodeType and trusted_name(code.co_filename):
            # importlib running a module it read itself: exec_module -> _call_with_frames_removed(exec, ...),
            # or (FrozenImporter, 3.12) exec_module -> exec
            ok = chain and chain[0][5] is frozen_exec
            if not ok and _len(chain) > 1 and chain[0][5] is call_removed:
                if chain[1][5] is frozen_exec:
                    ok = True
                elif chain[1][5] is loader_exec:
                    ok = _type(chain[1][4].f_locals.get("self")) in file_loaders
            if not ok:
                return "introspection", "runs code that passes for " + code.co_filename
        return None

    private_proc = {"maps", "smaps", "smaps_rollup", "map_files", "pagemap", "numa_maps", "mem"}
    # filelock (torch's build lock) looks for its own frames on release; setuptools for its caller's name.

    def judge_proc(path):
        """Reads of another process's /proc entries, or of any process's memory."""
        if path in raw_memory:
            return "introspection", "opens " + path
        if path.startswith("/proc/"):
            parts = path.split("/")
            if _len(parts) > 2 and parts[2].isdigit():
                pid = _str(getpid())
                if parts[2] != pid:
                    try:
                        readlink("/proc/" + pid + "/task/" + parts[2] + "/exe")  # one of our own threads?
                    except (_OSError, _ValueError):
                        return "introspection", "opens " + path + " (another process)"
                if parts[-1] == "mem":
                    return "introspection", "opens " + path
            if _len(parts) > 3 and parts[3] in private_proc:
                # what the process maps and holds open: the names of the parent's shared buffers among them
                return "introspection", "opens " + path
        return None

    def judge_open(args):
        raw = args[0] if args else None
        flags = args[2] if _len(args) > 2 and _type(args[2]) is _int else 0
        path = plain(raw)
        if path is None:
            return None
        if path is False:
            return "sandbox-violation", "opens a file named by an object that is not a plain path"
        if not path.startswith("/") and not private_proc.isdisjoint(path.split("/")):
            # the event names no dir_fd, so a relative name may be under /proc/<pid> (os.open('mem', dir_fd=...))
            return "introspection", "opens " + path + " by a relative name (/proc's memory entries are named so)"
        if not flags & WRITE_FLAGS:
            # Reads: only /proc, /dev and bytecode matter. A symlink into them has to be made first
            # (os.symlink is judged), and none that reaches another process exists outside /proc.
            lexical = absolute(path)
            if not (lexical.startswith("/proc") or lexical.startswith("/dev") or lexical.endswith(".pyc") or "/." in lexical):
                return None
            full = resolve(path)
            verdict = judge_proc(full)
            if verdict is None and full.endswith(".pyc") and not under(full, trusted) and exists(full):
                # the child writes no bytecode (sys.dont_write_bytecode): any other .pyc is code no scan read.
                # importlib probing a missing cache is fine
                verdict = "introspection", "loads bytecode from " + full
            return verdict
        full = resolve(path)
        verdict = judge_proc(full)
        if verdict is not None:
            return verdict
        if under(full, shared_memory):
            # the parent's shared files live there; torch maps them natively, so Python never needs to open one
            return "sandbox-violation", "opens " + full + " for writing (the parent's shared memory)"
        if ".pyc" in full.rsplit("/", 1)[-1]:
            return "introspection", "writes bytecode to " + full  # the child writes none (sys.dont_write_bytecode)
        if under(full, scratch) or full in devices:
            return None
        return "sandbox-violation", "opens " + full + " for writing"

    def exists(path):
        try:
            lstat(path)
            return True
        except (_OSError, _ValueError):
            return False

    def judge_write(event, args):
        dir_fd = None
        for i, fd_index in write_events[event]:
            if i >= _len(args):
                continue
            dir_fd = args[fd_index] if fd_index is not None and fd_index < _len(args) else None
            path = plain(args[i])
            if path is None and _type(args[i]) is _int:
                path = descriptor_path(args[i])  # ftruncate, fchmod...: judged by the file the descriptor holds
            if path is None:
                continue
            if path is False:
                return "sandbox-violation", event + " on an object that is not a plain path"
            full = resolve(path, dir_fd)
            if under(full, shared_memory):
                # the parent's shared files live there (a file cut short under the parent's mapping kills it
                # with SIGBUS); nothing in Python needs to change one
                return "sandbox-violation", event + " " + full + " (the parent's shared memory)"
            if ".pyc" in full.rsplit("/", 1)[-1] and event != "os.remove":
                return "introspection", event + " makes bytecode at " + full  # the child writes none
            if under(full, scratch):
                continue
            return "sandbox-violation", event + " " + full
        if event == "os.symlink" and _len(args) > 1:  # where the new link points
            target, link = plain(args[0]), plain(args[1])
            if target and link:
                if not target.startswith("/"):
                    target = absolute(link, dir_fd).rsplit("/", 1)[0] + "/" + target
                full = resolve(target)
                if full.startswith("/proc") or full.startswith("/dev") or full.startswith("/sys"):
                    return "introspection", "makes a symlink to " + full
                if not under(full, scratch):  # the parent cleans and reads these folders: a link out would lead it
                    return "sandbox-violation", "makes a symlink to " + full + " (outside its own folders)"
        return None

    def origin(function):
        """The kind of code a new thread would run: 'opaque' when that cannot be told safely."""
        target = function
        if _type(target) is MethodType and target.__func__ is thread_bootstrap:
            thread, run = target.__self__, None
            for cls in mro_of(_type(thread)):
                run = dict_of(cls).get("run")
                if run is not None:
                    break
            if run is not thread_run:
                target = run
            elif _type(thread) is Thread:
                target = thread.__dict__.get("_target")
                if target is None:
                    return "lib"
            else:
                return "opaque"
        if _type(target) is MethodType:
            target = target.__func__
        if _type(target) is FunctionType:
            return kind_of(target.__code__.co_filename)
        return "opaque"

    def judge_thread(args, chain):
        s = nearest_solution(chain)
        if s is not None:
            return "background-thread", "starts a thread (" + where(chain[s]) + ")"
        who = origin(args[0]) if args else "opaque"
        if who == "solution":
            return "background-thread", "starts a thread that runs solution code"
        if who == "opaque":
            return "background-thread", at(chain, "starts a thread that runs a callable of unknown origin")
        if state["phase"] == "run" and not harness_asked(chain):
            return "background-thread", at(chain, "starts a thread while the solution runs")
        return None

    def trusted_code_name(event, args, attr):
        """The installed file a made or moved code object is named as, else None."""
        if event == "code.__new__":
            name = args[1] if _len(args) > 1 else None
        elif event == "function.__new__" or (event == "object.__setattr__" and attr == "__code__"):
            code = args[0] if event == "function.__new__" else (args[2] if _len(args) > 2 else None)
            name = code.co_filename if _type(code) is CodeType else None
        else:
            return None
        return name if trusted_name(name) else None

    def judge(event, args, tid):
        # Cheap filters first: most audited events need no frame walk.
        attr = None
        if event == "object.__getattr__" or event == "object.__setattr__":
            attr = args[1] if _len(args) > 1 else None
            if _type(attr) is not _str:
                return None
            if event == "object.__getattr__" and attr not in frame_attrs and attr not in code_attrs:
                return None
            if event == "object.__setattr__" and attr not in rewrite_attrs:
                return None
        elif event == "os.kill":
            pid = args[0] if args else None
            if _type(pid) is _int and pid == getpid():
                return None
        was = hush(tid)
        try:
            first = getframe(2)  # 0: judge, 1: hook, 2: the code that raised the event
        except _BaseException:
            first = None
        finally:
            unhush(tid, was)
        if tid != install_thread:
            if first is None:
                return "background-thread", event + " from a thread that runs no Python code (a native or C-level target)"
            for entry in stack(first, everything):
                if entry[0] == "solution":
                    return "background-thread", event + " from a thread running solution code (" + where(entry) + ")"
        if first is None:
            return None
        if attr is not None and event == "object.__getattr__" and attr not in frame_attrs:
            # a code object read: only reads by the solution's own code count, so one frame is enough
            chain = stack(first, 1)
            return ("introspection", at(chain, "reads ." + attr)) if chain[0][0] == "solution" else None
        if event == "open":
            return judge_open(args)
        if event in write_events:
            return judge_write(event, args)
        if event == "mmap.__new__":
            fileno = args[0] if args else -1
            access = args[2] if _len(args) > 2 and _type(args[2]) is _int else 0
            if _type(fileno) is _int and fileno >= 0 and access != 1 and access != 3:  # not ACCESS_READ or _COPY
                full = descriptor_path(fileno)
                if full is False or under(full, shared_memory):
                    # mmap.resize() shrinks the file with no event: the parent, which maps it, dies of SIGBUS
                    return "sandbox-violation", "maps " + _str(full) + " writable (the parent's shared memory)"
            return None
        if event in list_events or event == "os.chdir":
            path = plain(args[0]) if args else None
            if path is None and args and _type(args[0]) is _int:
                path = descriptor_path(args[0])  # listdir(fd), fchdir: the folder the descriptor holds
            if not path:
                return None
            full = resolve(path)
            if event == "os.chdir" and (full.startswith("/proc") or full.startswith("/dev")):
                return "introspection", "changes directory to " + full
            if full.startswith("/dev/shm"):
                return "sandbox-violation", "lists " + full + " (the parent's shared memory)"
            return judge_proc(full)
        chain = stack(first, reach)
        if event == "sys._current_frames" and chain and chain[0][5] is census_code:
            return None
        if event in frame_events:
            return judge_frames(event, chain, frame_events[event])
        if attr is not None:
            if event == "object.__setattr__":
                return judge_maker("setting ." + attr, chain)
            return judge_frames("reading ." + attr, chain, (attr,))
        named = trusted_code_name(event, args, attr)
        if named is not None:
            # a code object named as an installed module's file (CodeType(), code.replace), or one put into a new
            # function or a function's __code__, would run with that file's trust (through importlib's own loader
            # if need be), and with globals of the solution's: never while solution code is on the stack
            entry = first_solution(stack(first, everything))
            if entry is not None:
                return "introspection", event + " with code of " + named + " (" + where(entry) + ")"
        if event in maker_events:
            return judge_maker(event, chain)
        if event == "compile" or event == "exec":
            return judge_code(event, args, chain)
        if event in process_events:
            if state["phase"] == "run":
                return "sandbox-violation", at(chain, event + " while the solution runs")
            return None
        if event in socket_events:
            for entry in stack(first, everything):
                if entry[0] == "solution":
                    return "sandbox-violation", event + " (network) by the solution (" + where(entry) + ")"
            if state["phase"] == "run":
                return "sandbox-violation", at(chain, event + " (network) while the solution runs")
            return None
        if event == "os.kill":
            return "sandbox-violation", at(chain, "signals another process")
        if event == "os.killpg":
            return "sandbox-violation", at(chain, "signals a process group")
        if event in thread_events:
            return judge_thread(args, chain)
        return None

    def hook(event, args):
        if event not in interesting:
            return
        tid = get_ident()
        if tid in quiet:
            return
        try:
            verdict = judge(event, args, tid)
        except _BaseException:
            verdict = ("introspection", "the runtime guard could not check the event " + event)
        if verdict is not None:
            line = verdict[0] + "\t" + verdict[1].replace("\n", " ").replace("\t", " ")[:500] + "\n"
            try:
                os_write(report_fd, line.encode("utf-8", "replace"))
            finally:
                os_exit(exit_code)

    def set_phase(name):
        if name not in phases:
            raise _ValueError("unknown guard phase " + _str(name))
        state["phase"] = name

    addaudithook(hook)
    return set_phase


# ----- torch's frame-evaluation hook ---------------------------------------------------------------------------
# torch._C._dynamo.eval_frame.set_eval_frame installs a PEP 523 callback that receives every frame before it
# runs, closure cells included: the audit hook's own state (and the child's) would be the solution's to
# rewrite, and no audit event is raised. The others install callbacks of the same machinery or read a
# frame's value stack.
_FRAME_HOOK_SETTERS = ("set_eval_frame", "set_bytecode_debugger_callback", "set_guard_error_hook", "set_guard_complete_hook",
                       "set_code_exec_strategy", "_get_frame_value_stack_with_depth", "raise_sigtrap")


def _swap_everywhere(swaps: dict) -> None:
    """Put each replacement where its original was, wherever a dict (as a value or as a key), a list or a set
    holds it: {id(original): (original, replacement)}. A container missed would hand the solution the original
    (torch._dynamo's rule map holds torch._C functions as keys)."""
    import gc

    def swapped(item):
        entry = swaps.get(id(item))
        return entry[1] if entry is not None and item is entry[0] else None

    for holder in gc.get_referrers(*[original for original, _ in swaps.values()]):
        kind = type(holder)
        if kind is dict:
            for key, value in list(holder.items()):
                if swapped(value) is not None:
                    holder[key] = swapped(value)
                if swapped(key) is not None:
                    holder[swapped(key)] = holder.pop(key)
        elif kind is list:
            for i, value in enumerate(holder):
                if swapped(value) is not None:
                    holder[i] = swapped(value)
        elif kind is set:
            for value in list(holder):
                if swapped(value) is not None:
                    holder.discard(value)
                    holder.add(swapped(value))


def _opaque(fn, name: str, wrap=functools._lru_cache_wrapper):
    """fn behind a callable that does not hand it back: functools' C cache wrapper, uncached (maxsize 0), has
    neither __wrapped__ nor __closure__, so the originals a seal keeps in fn's closure are reachable only
    through the garbage collector's referents (an audited call). A plain function put where the solution can
    reach it would give them up to a read of its __closure__ under a name built at run time. Called at run time
    too (a seal of an op made later), so it looks nothing up: the wrapper is bound as a default."""
    wrapper = wrap(fn, 0, False, None)
    wrapper.__name__ = wrapper.__qualname__ = name
    return wrapper


def _refusal(calls: list, name: str, allowed=None, why: str = ""):
    """A stand-in for torch's `name` that records an `introspection` Failure in `calls` and raises it, unless
    `allowed(args, kwargs)` says the call is harmless (turning a switch off): the seals' one way of refusing."""
    from .rules import Failure

    def refuse(*args, **kwargs):
        if allowed is not None and allowed(args, kwargs):
            return None
        calls.append(Failure("introspection", f"called torch's {name}{why}, which is sealed in a solution's process"))
        raise calls[-1]
    refuse.__name__ = refuse.__qualname__ = name
    return refuse


def seal_frame_hooks() -> list:
    """Replace torch's frame-evaluation setters wherever they are held (torch._C._dynamo.eval_frame,
    torch._dynamo.eval_frame, torch._dynamo.decorators...) with a refusal, so that the solution cannot
    reach the originals: an installed hook is handed every frame that runs next, the guard's included, with
    no audit event. Setting no hook stays a no-op (torch's own helpers call set_eval_frame(None) to keep
    dynamo out, and no hook is ever installed here). Call it in the solution's child before ModuleSnapshot()
    and before install(); torch.compile cannot run afterwards. Returns the refusals (each the Failure raised),
    which the child's checkpoint reads (a solution that catches the refusal is still judged)."""
    calls: list = []
    torch_c = getattr(sys.modules.get("torch"), "_C", None)
    eval_frame = getattr(getattr(torch_c, "_dynamo", None), "eval_frame", None)
    if eval_frame is None:
        return calls
    getter = getattr(eval_frame, "get_eval_frame_callback", None)
    if getter is not None and getter() not in (None, False):
        raise RuntimeError("a frame-evaluation callback is already installed")
    originals = {id(fn): (name, fn) for name in _FRAME_HOOK_SETTERS if (fn := getattr(eval_frame, name, None)) is not None}
    # The profiler's switches for collecting ops: the op trace of a correctness trial must see every op.
    for name in ("_toggle_collection_dynamic", "_enable_record_function"):
        switch = getattr(getattr(torch_c, "_autograd", None), name, None)
        if switch is not None:
            originals[id(switch)] = (name, switch)

    all_, refusal = all, _refusal  # bound: nothing below looks up a global or builtin

    def no_hook(args, kwargs) -> bool:
        return not kwargs and all_(a is None for a in args)

    _swap_everywhere({key: (fn, refusal(calls, name, no_hook)) for key, (name, fn) in originals.items()})
    return calls


def seal_torch_library() -> list:
    """Replace torch._C._dispatch_library, wherever it is held, with a version that refuses torch's own
    namespaces: no library for aten (nor "_", whose IMPL registers backend fallbacks), and no IMPL library for
    any namespace torch already has. A kernel of the solution's for one of torch's ops would run inside the
    harness's own calls of it (the copy into the slot, the mapping of the inputs), and one removed again by a
    finalizer before the checkpoint leaves no trace there. A solution's own namespace (torch.library.custom_op
    "mylib::op") is its to use, and torch's own lazy FRAGMENTs (prims) pass. Call it in the solution's child
    before ModuleSnapshot() and install(). Returns the refusals (each the Failure raised), which the checkpoint reads."""
    import torch

    from .problem import torch_namespaces as namespaces_of_torch
    from .rules import Failure

    calls: list = []
    original = getattr(torch._C, "_dispatch_library", None)
    if original is None:
        return calls
    torch_namespaces = namespaces_of_torch() | {"_"}
    str_, type_ = str, type

    def library(kind, ns, *args, **kwargs):
        if type_(kind) is not str_ or type_(ns) is not str_ or ns in ("aten", "_") or (kind == "IMPL" and ns in torch_namespaces):
            calls.append(Failure("tampering", f"registers kernels in torch's own namespace {ns!s:.40} (torch.library "
                                              f"{kind!s:.10}), which is sealed in a solution's process"))
            raise calls[-1]
        return original(kind, ns, *args, **kwargs)

    _swap_everywhere({id(original): (original, _opaque(library, "_dispatch_library"))})
    return calls


# Keys at which torch's own ops may still be entered directly. A composite kernel calls other ops through the full
# dispatcher, which both op records see; the Python key hands the call to the active dispatch mode (torch's own
# Python-key handler enters it so). Every other key runs a kernel, or passes the call down by redispatch, which
# fires no RecordFunction and skips a Python key the caller has excluded for the call.
_ENTRY_KEY_PREFIX = "Composite"
_ENTRY_KEYS = frozenset({"Python"})


def seal_direct_calls() -> list:
    """Replace the ways into one of torch's ops below both op records with versions that refuse them: an
    OpOverload's _op_dk at any key but the composite ones and Python (every OpOverload made so far, and those
    torch._C._get_operation_overload makes from now), the operator handle's redispatch_boxed, and
    torch.library.get_kernel's lookup (its kernel's call_boxed runs with no dispatch at all). The names are
    also flagged by the scan, but a name built at run time is not. A solution's own namespace (a custom op)
    keeps all three: torch's custom-op machinery redispatches through them. Call it in the solution's child
    before ModuleSnapshot() and install(). Returns the refusals, each the Failure raised."""
    import torch

    from .problem import torch_namespaces as namespaces_of_torch
    from .rules import Failure

    calls: list = []
    torch_namespaces = namespaces_of_torch()
    # Bound: the seals run at every call, and a solution can rewrite a module's dict (builtins included) for one use
    str_, type_, getattr_, tuple_, len_, opaque = str, type, getattr, tuple, len, _opaque
    entry_prefix, entry_keys = _ENTRY_KEY_PREFIX, _ENTRY_KEYS

    def torchs(qualified) -> bool:
        return type_(qualified) is not str_ or qualified.split("::", 1)[0] in torch_namespaces

    def may_enter(key) -> bool:
        name = getattr_(key, "name", None)
        return type_(name) is str_ and (name.startswith(entry_prefix) or name in entry_keys)

    def refuse(how: str, qualified, key):
        calls.append(Failure("introspection", f"calls torch's {qualified!s:.60} below the op records ({how} at "
                                              f"{getattr_(key, 'name', key)!s:.30}), which is sealed in a solution's process"))
        raise calls[-1]

    def sealed_op_dk(qualified, original):
        def op_dk(key, *args, **kwargs):
            if torchs(qualified) and not may_enter(key):
                refuse("_op_dk", qualified, key)
            return original(key, *args, **kwargs)
        return opaque(op_dk, "_op_dk")

    # Every OpOverload made so far hangs off its packet, and every packet off its namespace in torch.ops; nothing
    # else holds an overload's _op_dk (torch reads it as an attribute).
    for namespace in list(vars(torch.ops).values()):
        for packet in list(vars(namespace).values()) if isinstance(namespace, torch._ops._OpNamespace) else ():
            for item in list(vars(packet).values()) if isinstance(packet, torch._ops.OpOverloadPacket) else ():
                original = vars(item).get("_op_dk") if isinstance(item, torch._ops.OpOverload) else None
                if original is not None:
                    vars(item)["_op_dk"] = sealed_op_dk(item._schema.name, original)

    overload = torch._C._get_operation_overload

    def get_operation_overload(qualified, *args, **kwargs):
        found = overload(qualified, *args, **kwargs)
        if type_(found) is tuple_ and len_(found) >= 2:
            found = (found[0], sealed_op_dk(qualified, found[1])) + found[2:]
        return found

    lookup = torch._C._dispatch_get_computed_kernel_for_dispatch_key

    def computed_kernel(qualified, key, *args, **kwargs):
        if torchs(qualified):
            refuse("torch.library.get_kernel", qualified, key)
        return lookup(qualified, key, *args, **kwargs)

    handle_type = torch._C._DispatchOperatorHandle
    redispatch = handle_type.__dict__["redispatch_boxed"]
    schema_of = handle_type.__dict__["schema"]

    def redispatch_boxed(handle, keyset, *args, **kwargs):
        qualified = schema_of(handle).name
        if torchs(qualified):
            refuse("redispatch_boxed", qualified, keyset)
        return redispatch(handle, keyset, *args, **kwargs)

    _swap_everywhere({id(overload): (overload, opaque(get_operation_overload, "_get_operation_overload")),
                      id(lookup): (lookup, opaque(computed_kernel, lookup.__name__))})
    handle_type.redispatch_boxed = opaque(redispatch_boxed, "redispatch_boxed")  # bound to the handle as a method
    return calls


# TorchScript's fusers compile ops into code of their own (NNC, the TensorExpr compiler; oneDNN graph): a fused op
# never reaches the dispatcher, so neither op record sees it, and on a GPU its generated kernel would pass for the
# solution's own. Their switches may turn them off, never on.
_FUSERS_ON = ("_jit_set_texpr_fuser_enabled", "_jit_override_can_fuse_on_cpu", "_jit_override_can_fuse_on_gpu",
              "_jit_set_llga_enabled", "_jit_set_texpr_reductions_enabled")  # each turned off, through the original
_FUSER_SWITCHES = _FUSERS_ON + ("_jit_override_can_fuse_on_cpu_legacy", "_jit_set_te_must_use_llvm_cpu",
                                "_jit_set_nvfuser_enabled")


def seal_fusers() -> list:
    """Turn TorchScript's fusers off and replace their switches, wherever they are held, with versions that refuse
    to turn one on; replace every callable of torch._C._te (NNC's own API: TensorExprKernel compiles a parsed
    graph's aten::softmax into loops of its own) with a refusal. An honest torch.jit.script still runs, unfused.
    Call it in the solution's child before ModuleSnapshot() and install(). Returns the refusals, each the Failure
    raised."""
    import torch

    calls: list = []
    torch_c = torch._C
    for name in _FUSERS_ON:
        switch = getattr(torch_c, name, None)
        if switch is not None:
            switch(False)
    why = " (a compiler whose ops no op record sees)"
    any_, getattr_, id_, opaque, refusal = any, getattr, id, _opaque, _refusal  # bound: nothing below looks one up

    def off(args, kwargs) -> bool:
        return not kwargs and not any_(args)

    _swap_everywhere({id_(fn): (fn, opaque(refusal(calls, name, off, why), name))
                      for name in _FUSER_SWITCHES if (fn := getattr_(torch_c, name, None)) is not None})
    tensor_expr = getattr(torch_c, "_te", None)
    for name in [n for n in dir(tensor_expr) if not n.startswith("__")] if tensor_expr is not None else ():
        if callable(getattr(tensor_expr, name)):
            setattr(tensor_expr, name, opaque(refusal(calls, "_te." + name, why=why), "_te." + name))
    return calls


def seal_profiler() -> list:
    """Replace torch's C++ profiler switches (_prepare_profiler, _enable_profiler, _disable_profiler, the legacy
    pair, _clear_callbacks, which drops the trace's callbacks) wherever they are held with versions that refuse
    every call. A solution that stopped a trace of the harness's in forward would hold its results (and the secret
    name that marks them) and could begin a trace of its own in its place; the harness drives its traces through
    the originals, bound before this runs (profiling._make_trace), and torch.profiler's Python is never used in a
    solution's process. Call it in the solution's child before ModuleSnapshot() and install(). Returns the
    refusals, each the Failure raised."""
    import torch

    calls = []
    autograd = torch._C._autograd
    originals = {}
    for name in ("_prepare_profiler", "_enable_profiler", "_disable_profiler", "_clear_callbacks",
                 "_enable_profiler_legacy", "_disable_profiler_legacy", "_set_empty_test_observer"):
        fn = getattr(autograd, name, None)
        if fn is not None:
            originals[id(fn)] = (name, fn)

    refusal = _refusal  # bound: nothing below looks up a global
    _swap_everywhere({key: (fn, refusal(calls, name)) for key, (name, fn) in originals.items()})
    return calls


# ----- module snapshot ---------------------------------------------------------------------------------------
_SNAPSHOT_NAMES = frozenset({"builtins", "time", "os", "sys", "gc", "threading", "json", "hmac", "hashlib", "struct",
                             # what the guard and the channel lean on as well
                             "posix", "_thread", "posixpath", "pathlib", "io", "_io", "operator", "functools", "types",
                             "traceback", "warnings", "importlib", "importlib._bootstrap", "importlib._bootstrap_external",
                             # what the replies and records are built with
                             "dataclasses", "copy"})
_SNAPSHOT_PREFIXES = ("torch", "harness")
# Keys that change under honest code: the warnings machinery files its "already shown" records here.
_LAZY_KEYS = frozenset({"__warningregistry__"})
# Modules whose dicts torch fills lazily (keys added, never replaced): torch.ops gains a namespace object the
# first time one is used (torch.ops.my_extension). With torch._dynamo imported before the snapshot, as the
# child does, nothing else changed under honest load_inline builds, forwards, CUDA events and the profiler
# (torch 2.14 CPU, torch 2.11 H200); importing torch._dynamo later replaces torch._functorch.config and
# torch._weights_only_unpickler entries.
_LAZY_ADDS = frozenset({"torch.ops"})
# Mutable containers whose contents steer every later call: nn.Module's global hooks, import hooks, gc callbacks.
_CONTAINERS = (
    ("torch.nn.modules.module", ("_global_buffer_registration_hooks", "_global_module_registration_hooks",
                                 "_global_parameter_registration_hooks", "_global_backward_pre_hooks", "_global_backward_hooks",
                                 "_global_forward_pre_hooks", "_global_forward_hooks", "_global_forward_hooks_always_called",
                                 "_global_forward_hooks_with_kwargs")),
    ("sys", ("meta_path", "path_hooks")),
    ("gc", ("callbacks",)),
)


def _torch_classes() -> list:
    """The torch and standard classes whose methods the harness calls (and their bases)."""
    import importlib._bootstrap_external as bootstrap_external
    import pathlib
    import threading

    found = [pathlib.PurePath, pathlib.Path, pathlib.PosixPath, pathlib.PurePosixPath, threading.Thread,
             bootstrap_external.SourceFileLoader, bootstrap_external.SourcelessFileLoader]
    torch = sys.modules.get("torch")
    if torch is not None:
        for dotted in ("Tensor", "_C.TensorBase", "_C._TensorBase", "nn.Module", "cuda.Event", "cuda.Stream",
                       "cuda.graphs.CUDAGraph", "autograd.grad_mode.no_grad", "autograd.grad_mode.inference_mode",
                       "utils._python_dispatch.TorchDispatchMode", "overrides.TorchFunctionMode", "UntypedStorage",
                       "TypedStorage", "Generator", "Size", "device", "dtype",
                       # what the op trace and the kernel profile read their findings through
                       "profiler.profile", "profiler.profiler._KinetoProfile", "autograd.profiler.profile",
                       "autograd.profiler_util.EventList", "autograd.profiler_util.FunctionEvent",
                       "autograd.profiler_util.FunctionEventAvg"):
            value = torch
            for part in dotted.split("."):
                value = getattr(value, part, None)
            if isinstance(value, type):
                found.append(value)
        # The profiler's C++ classes (pybind types, whose dicts can be written): its raw results are parsed into
        # events only when first read, through their methods, after the checkpoint.
        for namespace in ("_autograd", "_profiler"):
            module = getattr(torch._C, namespace, None)
            found += [value for value in vars(module).values() if isinstance(value, type)] if module is not None else []
    classes, seen = [], set()
    for cls in found:
        for base in type.__dict__["__mro__"].__get__(cls):
            if base is not object and id(base) not in seen:
                seen.add(id(base))
                classes.append(base)
    return classes


# The aten ops the child runs itself around solution code (mapping the parent's buffers, the output's copy into
# its slot, private copies, freed-memory poison): a kernel of the solution registered for one of them would run
# outside the op recorders and the timer, and could compute the answer there (when the inputs are mapped, before
# the first mark; after the call).
_HARNESS_OPS = ("aten::copy_", "aten::_copy_from", "aten::_copy_from_and_resize", "aten::empty.memory_format",
                "aten::empty_like", "aten::empty_strided", "aten::fill_.Scalar", "aten::zero_", "aten::clone",
                "aten::_to_copy", "aten::detach", "aten::alias", "aten::set_.source_Storage_storage_offset",
                "aten::set_.source_Storage", "aten::set_.source_Tensor", "aten::set_", "aten::from_file")


class DispatchTables:
    """The dispatcher's computed kernel tables of the harness's own ops (and the problem's core ops), taken
    before the solution is imported: changes() names those whose kernel for some dispatch key changed since
    (torch.library.Library("aten", "IMPL").impl("copy_", ...), the same through torch._C directly, or a backend
    fallback for a key the solution then switches on in the serving thread)."""

    def __init__(self, extra_ops=()):
        import torch

        dump, names, error = torch._C._dispatch_dump_table, (*_HARNESS_OPS, *extra_ops), Exception  # bound now, as the hook's are

        def tables():
            found = {}
            for name in names:
                try:
                    found[name] = dump(name)
                except error:  # a name this torch does not know
                    pass
            return found

        before = tables()

        def changes() -> list:
            return ["a kernel was registered for torch's own op " + name for name, text in tables().items() if text != before.get(name)]

        self.changes = changes


class ThreadDispatchKeys:
    """The dispatch keys switched on or off in this thread (torch's thread-local include and exclude sets), as
    they were before the solution was imported: a key forward leaves switched on would route the harness's own
    ops after the call (a backend fallback of the solution's), one left off would step around a layer. Make it
    in the serving thread, where the solution's code and the checkpoint run."""

    def __init__(self):
        import torch

        C = torch._C
        included, excluded, raw = C._dispatch_tls_local_include_set, C._dispatch_tls_local_exclude_set, torch.DispatchKeySet.raw_repr

        def now() -> tuple:
            return raw(included()), raw(excluded())

        before = now()

        def changes(expected=None) -> list:
            if now() == (before if expected is None else expected):
                return []
            return [f"dispatch keys left switched on or off in the serving thread (on: {included()}; off: {excluded()})"]

        self.now, self.changes = now, changes


class AtenKernels:
    """Which of torch's own (aten) ops have a kernel for each dispatch key, taken before the solution is
    imported: changes() names the kernels added or removed since, for any op, not only the harness's. A
    solution registering a kernel for an aten op (torch.library.Library("aten", "IMPL")) is never honest, and
    an op missing from _HARNESS_OPS would otherwise be a way in. A kernel that replaces one already there
    keeps the tables the same: DispatchTables sees that, for the ops that matter. About 20 ms a call."""

    def __init__(self):
        import torch

        registered, keys, frozen, error, sorted_ = (torch._C._dispatch_get_registrations_for_dispatch_key,
                                                    tuple(torch._C.DispatchKey.__members__), frozenset, Exception, sorted)

        def tables():
            found = {}
            for key in keys:
                try:
                    found[key] = frozen(name for name in registered(key) if name.startswith("aten::"))
                except error:  # a key with no table of its own (an alias)
                    pass
            return found

        before = tables()

        def changes() -> list:
            now, found = tables(), []
            for key, names in now.items():
                old = before.get(key, frozen())
                found += [f"a kernel was registered for torch's own op {name} ({key})" for name in sorted_(names - old)]
                found += [f"torch's kernel of {name} ({key}) was removed" for name in sorted_(old - names)]
            return found

        self.changes = changes


class ModuleSnapshot:
    """Identity snapshot of module and class dicts, taken before the solution is imported.

    Watched: the modules named in _SNAPSHOT_NAMES, every torch.* and harness.* module, the classes
    defined in harness modules, the torch and standard classes of _torch_classes(), and the contents of
    _CONTAINERS. changes() lists what differs: replaced, removed or added keys, modules replaced in
    sys.modules. Modules imported later are ignored, but keys added to a watched dict count (that is the
    `super` shadowing attack); a key added by importing a submodule (torch.x gains `y` when torch.x.y is
    imported) does not. changes() compares identities only (it never calls __eq__ of what it finds) and
    looks up nothing by name at call time: it is a closure over what __init__ bound.
    """

    def __init__(self):
        import operator

        entries = []
        for name, module in list(sys.modules.items()):
            if not (name in _SNAPSHOT_NAMES or name.split(".", 1)[0] in _SNAPSHOT_PREFIXES):
                continue
            mapping = getattr(module, "__dict__", None)
            if type(mapping) is not dict:
                continue
            entries.append((name, name, module, mapping, tuple(mapping), tuple(mapping.values())))
            if name.split(".", 1)[0] == "harness":
                for value in list(mapping.values()):
                    if isinstance(value, type) and type.__dict__["__dict__"].__get__(value).get("__module__") == name:
                        entries.append(_class_entry(value))
        entries.extend(_class_entry(cls) for cls in _torch_classes())
        containers = []
        for module_name, attributes in _CONTAINERS:
            module = sys.modules.get(module_name)
            for attribute in attributes:
                container = getattr(module, attribute, None)
                if isinstance(container, (list, dict)):
                    containers.append((f"{module_name}.{attribute}", container, tuple(container)))
        self.changes = _checker(entries, containers, sys.modules, operator.is_)


def _class_entry(cls) -> tuple:
    mapping = type.__dict__["__dict__"].__get__(cls)
    label = f"{cls.__module__}.{cls.__qualname__}"
    return (label, None, cls, mapping, tuple(mapping), tuple(mapping.values()))


def _checker(entries, containers, sys_modules, is_):
    _len, _all, _map, _zip, _type, _str, _dict, _list = len, all, map, zip, type, str, dict, list
    module_type = types.ModuleType
    lazy_keys, lazy_adds = _LAZY_KEYS, _LAZY_ADDS
    missing = object()

    def strange_key(mapping) -> bool:
        """A key that is not a plain string, found by iterating alone: looking up any key in a dict that holds
        one would call its __eq__ (a key with a string's hash sits in that string's probe sequence)."""
        for key in _list(mapping):
            if _type(key) is not _str:
                return True
        return False

    def diff(label, name, mapping, keys, values):
        if strange_key(mapping):
            return [f"a key that is not a string was added to {label}"]
        found, old = [], _dict(_zip(keys, values))
        for key, value in _zip(keys, values):
            now = mapping.get(key, missing)
            if now is value or key in lazy_keys:
                continue
            found.append(f"{label}.{key} was " + ("removed" if now is missing else "replaced"))
        for key in _list(mapping):
            if key in old or key in lazy_keys:
                continue
            value = mapping.get(key, missing)
            if name is not None and _type(value) is module_type and sys_modules.get(name + "." + key) is value:
                continue  # a submodule import binds the submodule in its parent
            if name in lazy_adds:
                continue
            found.append(f"{label}.{key} was added")
        return found

    def changes():
        if strange_key(sys_modules):
            return ["a key that is not a string was added to sys.modules"]
        found = []
        for label, name, owner, mapping, keys, values in entries:
            if name is not None and sys_modules.get(name, missing) is not owner:
                found.append(f"module {name} was replaced in sys.modules")
                continue
            if _len(mapping) == _len(keys) and _all(_map(is_, mapping, keys)) and _all(_map(is_, mapping.values(), values)):
                continue
            found.extend(diff(label, name, mapping, keys, values))
        for label, container, contents in containers:
            if _len(container) != _len(contents) or not _all(_map(is_, container, contents)):
                found.append(f"{label} was changed")
        return found

    return changes


def active_modes() -> list:
    """Torch function and dispatch modes on the stacks right now, and torch function or Python dispatch
    left switched off: a solution must leave none of them behind after a call."""
    import torch

    C = torch._C
    found = []
    for i in range(C._len_torch_function_stack()):
        found.append("function mode " + _class_name(C._get_function_stack_at(i)))
    for i in range(C._len_torch_dispatch_stack()):
        found.append("dispatch mode " + _class_name(C._get_dispatch_stack_at(i)))
    keys = getattr(C, "_TorchDispatchModeKey", None)
    for key in (getattr(keys, "__members__", {}) or {}).values():
        mode = C._get_dispatch_mode(key)
        if mode is not None:
            found.append("dispatch mode " + _class_name(mode))
    if not C._is_torch_function_enabled():
        found.append("torch function switched off (DisableTorchFunction)")
    if C._dispatch_tls_is_dispatch_key_excluded(C.DispatchKey.Python):
        found.append("Python dispatch switched off (_DisableTorchDispatch)")
    return found


def _class_name(obj) -> str:
    """module.qualname of obj's class, read without running any code of that class."""
    cls = type(obj)
    qualname = type.__dict__["__qualname__"].__get__(cls)
    module = type.__dict__["__dict__"].__get__(cls).get("__module__", "?")
    return f"{module if type(module) is str else '?'}.{qualname}"
