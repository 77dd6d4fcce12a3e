"""``python path/to/probe [args]``: run the probe as a program, in any Python >= 3.8.

Run as a directory, this file is the top-level script and the package is not imported yet, so
it is loaded here from this directory under a private name: its modules import each other
relatively and need no envlock installed. The directory itself leaves sys.path first, so no
module of the probe can shadow what the probed environment imports (``import platform``).
It leaves without the interpreter's teardown, once its one output is flushed (see the end).
"""

import gc
import importlib
import importlib.util
import os
import sys


def _main() -> int:
    # A short-lived program of envlock's own: Python's cyclic collector would walk torch's
    # objects again and again while torch imports (~0.3 s of a 1.3 s import here,
    # benchmarks/training.py); whatever cycles the probe makes die with it. The collector's
    # state is no fact the probe reports.
    gc.disable()
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        del sys.path[0]
    if __package__:  # python -m envlock.probe
        collect = importlib.import_module(__package__ + ".collect")
    else:
        spec = importlib.util.spec_from_file_location(
            "_envlock_probe", os.path.join(here, "__init__.py"), submodule_search_locations=[here])
        if spec is None or spec.loader is None:
            raise SystemExit("envlock probe: cannot load the package from %s" % here)
        package = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = package
        spec.loader.exec_module(package)
        collect = importlib.import_module(spec.name + ".collect")
    code: int = collect.main()
    return code


if __name__ == "__main__":
    code = _main()
    # The probe is a program with one output, written and flushed here. Once torch is imported,
    # the interpreter's teardown (torch's exit handlers, unloading thousands of modules) takes
    # about as long as a cached probe run itself, while envlock waits on this process's exit;
    # nothing the probe holds needs it: its cache files are written atomically and closed
    # before collect returns, and its subprocesses have been waited for. A deliberate exit
    # without teardown, in this one place: a program run by path, never imported.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
