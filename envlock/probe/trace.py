"""A trace of what a recorded process read: files, environment variables, and the process-wide
numeric state no table of the lock holds.

A replay that diverges used to guess its causes from lists (the lock's variables, the
workspace's files the process had loaded); a config file outside git, an ordinary variable the
script reads (``LR``), a checkpoint under ``$TORCH_HOME`` or a module on ``PYTHONPATH`` outside
the workspace were invisible. This module observes them in the recorded process itself:

* files: a PEP 578 audit hook sees the ``open`` event of ``open()``, ``os.open`` and every
  module source the import system reads (``io.open_code``), with its flags, and the
  ``sqlite3.connect`` event (sqlite opens its file in C); a path opened for writing is kept apart (the run's own files are no cause), an fd is skipped. Extension modules
  (loaded by ``dlopen``, which raises no event) are taken from ``sys.modules`` at exit;
* variables: ``os.environ`` becomes an instance of a subclass of its own class whose
  ``__getitem__``/``__contains__``/``get`` note the name (and the value it had when first
  read), so ``os.getenv``, ``os.environ.get``, ``os.environ[...]`` and ``in`` are seen, and
  ``os.environb`` alike; going over the whole environment (``copy()``, ``items()``,
  ``dict(os.environ)``) reads no variable by name and is not noted, but a lookup by name in
  what ``copy()`` gave is;
* what ran before the trace started: the files of the modules already in ``sys.modules``
  (imported by a ``.pth`` file as ``site`` started, or before a late start at the first
  ``envlock.record`` call) and the ``.pth`` files of the site directories (``site`` executes
  them before any ``sitecustomize``), taken when the trace starts, so that a distribution whose
  code ran is never taken for one the run did not read;
* children: the ``subprocess.Popen``, ``os.exec`` and ``os.posix_spawn`` events give the program
  each child runs; a Python child traces itself through the start-up hook
  (``probe/startup/sitecustomize.py``), any other is listed as not traced;
* state: CPU affinity, the cgroup's CPU quota, torch's default dtype and what
  ``torch.set_flush_denormal`` was last called with (torch has no getter, and the MXCSR bits
  cannot be read from Python without machine code: the call is observed by wrapping the
  function at the first file opened after torch's import ended; a process that never called it
  reports torch's default, off, and one whose wrapper was not in place by its first
  ``envlock.record`` call reports nothing rather than a guess).

At exit the trace is written as JSON to ``$ENVLOCK_TRACE/<pid>.json`` (a private directory
envlock made for the run); ``envlock`` reads every process's file when the command has ended
(``replay.reads``). A forked child (a DataLoader worker) starts a trace of its own.

Stdlib only and Python 3.8 syntax: the start-up hook loads this file by its path in a child
whose interpreter may not import envlock. The hook itself must stay cheap (it runs on every
audit event): a string comparison, a set insertion, and it never raises.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Set

# The directory envlock gives the traced processes (one file per process, named by pid), and
# the start-up hook's own directory, which envlock prepends to PYTHONPATH: it is removed from
# every PYTHONPATH envlock records (``probe.rules.without_trace_hook``).
TRACE_ENV = "ENVLOCK_TRACE"
HOOK_ENV = "ENVLOCK_TRACE_HOOK"
# The name the one tracer of a process is found under, whoever started it (the start-up hook
# loads this file by path; ``envlock.record`` imports it as ``envlock.probe.trace``).
MODULE = "_envlock_trace"



# Where a container's run finds the start-up hook: a copy of ``hook_files`` mounted read-only
# (``commands._recording.container_hook``), at one path in every container, so that the
# ``PYTHONPATH`` entry it adds is one that ``rules.without_trace_hook`` removes by name.
CONTAINER_DIR = "/envlock-probe"
_STARTUP = "startup"


def hook_dir() -> str:
    """The directory of the start-up hook (``startup/sitecustomize.py``) envlock prepends to
    ``PYTHONPATH`` of a traced run."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), _STARTUP)


def hook_files() -> Dict[str, str]:
    """What a traced process needs where envlock is not installed (a container's run), by its
    path under the copy's root: the start-up hook, and this module, which the hook loads by its
    path beside its own directory (``../trace.py``)."""
    here = os.path.abspath(__file__)
    return {os.path.basename(here): here,
            _STARTUP + "/sitecustomize.py": os.path.join(hook_dir(), "sitecustomize.py")}


def container_hook_dir() -> str:
    """The start-up hook's directory inside a container (``CONTAINER_DIR``)."""
    return CONTAINER_DIR + "/" + _STARTUP


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_SPAWN_EVENTS = ("subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn")


class _Tracer:
    """One process's trace. ``paused``: envlock's own work in the process (its capture reads
    every variable and many files) is not the run's."""

    def __init__(self, directory: str, late: bool = False) -> None:
        self.directory = directory
        # Started by ``envlock.record`` rather than at the interpreter's start (no start-up hook:
        # a container's run, ``python -S``): what the process read before is not in this trace.
        self.late = late
        self.read: Set[str] = set()
        self.written: Set[str] = set()
        self.env: Dict[str, Optional[str]] = {}
        self.spawned: List[str] = []
        self.databases: Dict[str, Optional[tuple]] = {}  # type: ignore[type-arg]
        self.state: Optional[Dict[str, Any]] = None
        self.paused = 0
        self.cwd = os.getcwd()
        self.pid = os.getpid()
        self.flush_denormal: Optional[bool] = None
        self.torch_wrapped = False
        # Whether ``envlock.record`` (rank 0) ran here: its process facts are the record's.
        self.recorded = False
        # The keys ``os.environ.keys()`` last gave, while they are looked up in order.
        self.bulk: Optional[List[str]] = None
        self.bulk_at = 0

    # -- the audit hook: cheap, never raises ----------------------------------------------------

    def make_hook(self) -> Callable[[str, Any], None]:
        """The audit hook, a closure over locals: it runs on every audit event of the process,
        so each attribute lookup saved counts."""
        read_add, written_add, spawned = self.read.add, self.written.add, self.spawned
        modules, join, fsdecode = sys.modules, os.path.join, os.fsdecode
        tracer = self

        def hook(event: str, args: Any) -> None:
            if event == "open":
                if tracer.paused:
                    return
                try:
                    path = args[0]
                    if path.__class__ is not str:
                        if not isinstance(path, bytes):
                            return  # an fd
                        path = fsdecode(path)
                    if path[:1] != "/":
                        path = join(tracer.cwd, path)
                    mode = args[1]
                    if args[2] & _WRITE_FLAGS or (mode.__class__ is str and mode.strip("rbtU")):
                        written_add(path)
                    else:
                        read_add(path)
                    if not tracer.torch_wrapped and "torch" in modules:
                        tracer._wrap_torch()
                except Exception:
                    pass
            elif event == "os.chdir":
                try:
                    tracer.cwd = os.path.abspath(fsdecode(args[0]))
                except Exception:
                    pass
            elif event in _SPAWN_EVENTS:
                if tracer.paused:
                    return
                try:
                    program = args[0]
                    if event == "subprocess.Popen" and program is None:
                        program = args[1]
                        if isinstance(program, (str, bytes)):  # a shell command line (or one word)
                            program = program.split()[0] if program.split() else None
                        else:
                            program = next(iter(program), None)
                    if isinstance(program, (str, bytes)) or hasattr(program, "__fspath__"):
                        spawned.append(fsdecode(program))
                except Exception:
                    pass
            elif event == "os.system" and not tracer.paused:
                spawned.append("/bin/sh")
            elif event == "sqlite3.connect" and not tracer.paused:
                tracer._database(args[0] if args else None)

        return hook

    def _database(self, database: Any) -> None:
        """A SQLite database the run connected to (sqlite opens it in C: no ``open`` event), with
        its stat then: at exit, one whose stat changed is the run's own (a tracking store such as
        MLflow's or Optuna's, written at every run), one unchanged was read. Never raises."""
        try:
            name = os.fsdecode(database)
            if name.startswith("file:"):  # a URI: file:path?mode=ro
                name = name[5:].split("?", 1)[0]
            if not name or name == ":memory:" or name.startswith(":"):
                return
            path = name if name[:1] == "/" else os.path.join(self.cwd, name)
            if path not in self.databases:
                self.databases[path] = _stat_key(path)
        except Exception:
            pass

    def _wrap_torch(self) -> None:
        """Wrap ``torch.set_flush_denormal`` once torch has it (its import is under way while
        the first of its files are opened)."""
        torch = sys.modules.get("torch")
        spec = getattr(torch, "__spec__", None)
        if getattr(spec, "_initializing", False):
            return  # torch adds its docstrings to its functions at the end of its import
        original = getattr(torch, "set_flush_denormal", None)
        if original is None:
            return
        self.torch_wrapped = True
        tracer = self

        def set_flush_denormal(mode: bool) -> bool:
            done = bool(original(mode))
            if done:
                tracer.flush_denormal = bool(mode)
            return done

        set_flush_denormal.__doc__ = original.__doc__
        set_flush_denormal.__name__ = "set_flush_denormal"
        setattr(torch, "set_flush_denormal", set_flush_denormal)  # noqa: B010 - torch: Any

    # -- what the process holds --------------------------------------------------------------------

    def note_env(self, name: Any, value: Any) -> None:
        if self.paused:
            return
        if isinstance(name, bytes):  # os.environb, os.getenvb
            name = os.fsdecode(name)
            value = os.fsdecode(value) if isinstance(value, bytes) else value
        if isinstance(name, str) and name not in self.env:
            self.env[name] = value if value is None or isinstance(value, str) else None

    def take_state(self) -> None:
        """The process-wide facts, once: at the first ``envlock.record`` call, else at exit."""
        if self.state is not None:
            return
        self.paused += 1
        try:
            self.state = _state(self)
        finally:
            self.paused -= 1

    def document(self) -> Dict[str, Any]:
        import sysconfig

        self.take_state()
        self.paused += 1
        read = set(self.read)
        for path, then in self.databases.items():
            (read.add if then is not None and _stat_key(path) == then else self.written.add)(path)
        for module in list(sys.modules.values()):
            found = getattr(module, "__file__", None)
            if isinstance(found, str) and found.endswith((".so", ".pyd")):
                read.add(found)
        paths = sysconfig.get_paths()
        return {
            "pid": self.pid, "ppid": os.getppid(), "python": True, "executable": sys.executable,
            "argv": list(sys.argv), "recorded": self.recorded, "late": self.late,
            "read": sorted(read - self.written), "written": sorted(self.written),
            "env": self.env, "spawned": self.spawned, "state": self.state,
            "stdlib": sorted({paths["stdlib"], paths["platstdlib"]}),
        }

    def write(self) -> None:
        """The trace to ``<directory>/<pid>.json``; a process whose directory is gone (envlock
        was interrupted) writes nothing."""
        if os.getpid() != self.pid:
            return
        try:
            doc = self.document()
            path = os.path.join(self.directory, "%d.json" % self.pid)
            with open(path + ".tmp", "w", encoding="utf-8", errors="surrogateescape") as fh:
                json.dump(doc, fh)
            os.replace(path + ".tmp", path)
        except Exception:
            pass

    def forked(self) -> None:
        """In a forked child: a trace of its own, starting from what the parent had read (the
        child's memory holds it: what it computes from may come from there)."""
        self.pid = os.getpid()
        self.state = None
        self.recorded = False
        mp = sys.modules.get("multiprocessing.util")
        if mp is not None:
            # A multiprocessing child leaves through os._exit, past atexit; its bootstrap
            # clears the finalizers it inherited, then runs the after-fork hooks, which
            # register the one that writes this trace.
            try:
                mp.register_after_fork(self, _finalize_at_exit)
            except Exception:
                pass


def _already_read(cwd: str) -> Set[str]:
    """What the process read before its trace started: the file of each module in
    ``sys.modules`` and the ``.pth`` files of the site directories ``site`` processed (none
    under ``-S``). Never raises."""
    out: Set[str] = set()
    try:
        for module in list(sys.modules.values()):
            found = getattr(module, "__file__", None)
            if isinstance(found, str) and found:
                out.add(found if found[:1] == "/" else os.path.join(cwd, found))
        site = sys.modules.get("site")
        if site is None or sys.flags.no_site:
            return out
        dirs = list(site.getsitepackages())
        if site.ENABLE_USER_SITE:
            dirs.append(site.getusersitepackages())
        for directory in dirs:
            try:
                names = os.listdir(directory)
            except OSError:
                continue
            out.update(os.path.join(directory, n) for n in names if n.endswith(".pth"))
    except Exception:
        pass
    return out


def _stat_key(path: str) -> Optional[tuple]:  # type: ignore[type-arg]
    """What tells a changed file: size, mtime and inode; None when it is not there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def _finalize_at_exit(tracer: _Tracer) -> None:
    import multiprocessing.util

    multiprocessing.util.Finalize(None, tracer.write, exitpriority=0)


def _state(tracer: _Tracer) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    try:
        out["cpu_affinity"] = _ranges(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="ascii") as fh:
            out["cpu_quota"] = fh.read().strip()[:64]
    except (OSError, ValueError):
        pass
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_default_dtype"):
        try:
            out["default_dtype"] = str(torch.get_default_dtype()).replace("torch.", "")
        except Exception:
            pass
        if tracer.torch_wrapped:  # else a call before the wrapper could have been missed
            out["flush_denormal"] = bool(tracer.flush_denormal)
    return out


def _ranges(cpus: List[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``."""
    parts: List[str] = []
    for cpu in cpus:
        if parts and "-" in parts[-1] and int(parts[-1].split("-")[1]) == cpu - 1:
            parts[-1] = "%s-%d" % (parts[-1].split("-")[0], cpu)
        elif parts and "-" not in parts[-1] and int(parts[-1]) == cpu - 1:
            parts[-1] = "%s-%d" % (parts[-1], cpu)
        else:
            parts.append(str(cpu))
    return ",".join(parts)


def _copy_class(tracer: _Tracer) -> type:
    """What ``os.environ.copy()`` gives: a ``dict`` whose lookups by name note the variable, as
    ``os.environ``'s do (``env = os.environ.copy()``, then ``env.get("LR")``), unless the run
    set or removed that key in its copy itself. Handing it whole to a child (``subprocess``
    goes over ``items()``) or ``dict(copy)`` reads no variable by name."""

    class TracedCopy(dict):  # type: ignore[type-arg]
        _own: Optional[Set[Any]] = None
        # Going over the copy reads no variable by name: the key iteration just gave
        # (``for key in saved: environ[key] = saved[key]``, which is how ``os.environ.update(saved)``
        # and ``mock.patch.dict`` put a saved environment back), and the keys ``keys()`` gave,
        # looked up in order (``dict(saved)``, ``{**saved}``), are passed over.
        _passing: Any = None
        _bulk: Optional[List[Any]] = None
        _at = 0

        def _mine(self, key: Any) -> None:
            if self._own is None:
                self._own = set()
            self._own.add(key)

        def _note(self, key: Any, value: Optional[str]) -> None:
            if self._own is None or key not in self._own:
                tracer.note_env(key, value)

        def _going_over(self, key: Any) -> bool:
            if self._passing is not None and self._passing == key:
                self._passing = None
                return True
            bulk = self._bulk
            if bulk is not None:
                if self._at < len(bulk) and bulk[self._at] == key:
                    self._at += 1
                    return True
                self._bulk = None
            return False

        def __iter__(self) -> Any:
            for key in dict.__iter__(self):
                self._passing = key
                yield key
            self._passing = None

        def keys(self) -> Any:
            self._bulk, self._at = list(dict.keys(self)), 0
            return dict.keys(self)

        def __getitem__(self, key: Any) -> Any:
            try:
                value = dict.__getitem__(self, key)
            except KeyError:
                self._note(key, None)
                raise
            if not self._going_over(key):
                self._note(key, value)
            return value

        def get(self, key: Any, default: Any = None) -> Any:
            try:
                return self[key]
            except KeyError:
                return default

        def __contains__(self, key: Any) -> bool:
            found = dict.__contains__(self, key)
            self._note(key, dict.__getitem__(self, key) if found else None)
            return found

        def __setitem__(self, key: Any, value: Any) -> None:
            self._mine(key)
            dict.__setitem__(self, key, value)

        def __delitem__(self, key: Any) -> None:
            self._mine(key)
            dict.__delitem__(self, key)

        def pop(self, key: Any, *default: Any) -> Any:
            self._mine(key)
            return dict.pop(self, key, *default)

        def setdefault(self, key: Any, default: Any = None) -> Any:
            self._mine(key)
            return dict.setdefault(self, key, default)

        def update(self, *args: Any, **kwargs: Any) -> None:
            for key in dict(*args, **kwargs):
                self._mine(key)
            dict.update(self, *args, **kwargs)

        def __reduce__(self) -> Any:
            # A plain dict to pickle (a spawned process's arguments) and deepcopy: this class
            # is local to the tracer, which the other side may not have.
            return (dict, (dict(self),))

        def copy(self) -> Any:
            twin = TracedCopy(self)
            twin._own = set(self._own) if self._own is not None else None
            return twin

    return TracedCopy


def _environ_class(base: type, tracer: _Tracer) -> type:
    """A subclass of ``os.environ``'s class that notes each name read."""
    traced_copy = _copy_class(tracer)

    class TracedEnviron(base):  # type: ignore[misc]
        def __getitem__(self, key: Any) -> Any:
            bulk = tracer.bulk
            if bulk is not None:  # the lookups that follow keys(): dict(os.environ), {**os.environ}
                at = tracer.bulk_at
                if at < len(bulk) and bulk[at] == key:
                    tracer.bulk_at = at + 1
                    if at + 1 == len(bulk):
                        tracer.bulk = None
                    return super().__getitem__(key)
                tracer.bulk = None
            try:
                value = super().__getitem__(key)
            except KeyError:
                tracer.note_env(key, None)
                raise
            tracer.note_env(key, value)
            return value

        def __contains__(self, key: Any) -> bool:
            found = bool(super().__contains__(key))
            if not found:
                tracer.note_env(key, None)
            elif isinstance(key, str) and key not in tracer.env:
                tracer.note_env(key, super().__getitem__(key))
            return found

        def get(self, key: Any, default: Any = None) -> Any:
            try:
                return self[key]
            except KeyError:
                return default

        # Going over the whole environment (``os.environ.copy()`` or ``{**os.environ, ...}``
        # to start a child with one more variable, ``dict(os.environ)``, ``.items()``) is no
        # read of each variable: every variable of the shell would be a cause. Only a lookup
        # by name is, on ``os.environ`` or on its ``copy()`` (``_copy_class``). ``dict()`` and
        # ``**`` call ``keys()``, then look each key up in order: those lookups are passed over
        # (``bulk``).
        def _snapshot(self) -> Dict[str, str]:
            decodekey, decodevalue = self.decodekey, self.decodevalue
            return {decodekey(k): decodevalue(v) for k, v in self._data.items()}

        def keys(self) -> Any:
            tracer.bulk = [self.decodekey(k) for k in self._data]
            tracer.bulk_at = 0
            return super().keys()

        def copy(self) -> Any:
            return traced_copy(self._snapshot())

        # ``MutableMapping.clear`` pops item by item, and ``popitem`` looks each key up: emptying
        # the environment (to put a saved one back, as ``mock.patch.dict`` does) read every
        # variable of the shell, each then a cause.
        def popitem(self) -> Any:
            for key in self._data:
                name = self.decodekey(key)
                value = self.decodevalue(self._data[key])
                super().__delitem__(name)
                return name, value
            raise KeyError("popitem(): the environment is empty")

        def clear(self) -> None:
            for key in [self.decodekey(k) for k in self._data]:
                super().__delitem__(key)

        def items(self) -> Any:
            return self._snapshot().items()

        def values(self) -> Any:
            return self._snapshot().values()

    return TracedEnviron


def active() -> Optional[_Tracer]:
    """The process's tracer, whoever started it; None when the process is not traced."""
    module = sys.modules.get(MODULE)
    return getattr(module, "tracer", None) if module is not None else None


tracer: Optional[_Tracer] = None


def start(directory: Optional[str] = None, late: bool = False) -> Optional[_Tracer]:
    """Trace this process into ``directory`` (default ``$ENVLOCK_TRACE``), once; None when
    no directory is given. Registers this module as ``MODULE`` so that a second start (the
    start-up hook, then ``envlock.record``) finds the first. ``late``: started after the
    process began (by ``envlock.record``), which the trace says."""
    global tracer
    found = active()
    if found is not None:
        return found
    directory = directory or os.environ.get(TRACE_ENV)
    if not directory or not os.path.isdir(directory):
        return None
    tracer = _Tracer(directory, late)
    tracer.read.update(_already_read(tracer.cwd))
    sys.modules[MODULE] = sys.modules[__name__]
    for environ in (os.environ, getattr(os, "environb", None)):  # environb: os.getenvb
        if environ is None:
            continue
        try:
            environ.__class__ = _environ_class(type(environ), tracer)
        except TypeError:
            pass  # an environ replaced by something else: its reads are not seen
    sys.addaudithook(tracer.make_hook())
    atexit.register(tracer.write)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=tracer.forked)
    return tracer


class paused:
    """``with paused():`` envlock's own reads in the traced process are left out."""

    def __enter__(self) -> None:
        found = active()
        if found is not None:
            found.paused += 1

    def __exit__(self, *exc: Any) -> None:
        found = active()
        if found is not None:
            found.paused -= 1
