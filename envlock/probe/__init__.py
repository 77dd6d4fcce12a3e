"""The envlock probe: everything envlock knows about an environment comes from here.

Stdlib only, Python >= 3.8, and runnable as a directory (``python path/to/probe``, see
``__main__``), so the very same code runs in-process inside a training script, in another
interpreter (``--python``), and inside a restored container that has nothing of envlock
installed. It prints one JSON document; all validation, TOML and diffing happen in envlock's
own process on that document.

One module per concern, all importing each other relatively so the package works under any
name: ``rules`` (allow-lists, the secret rule, names, the determinism knob table), ``scrub``,
``files``, ``procs``, ``git``, ``system`` (platform and Python), ``packages``, ``torchstack``,
``gpu``, ``image``, ``env``, ``cache`` (torch facts), ``statcache`` (files parsed once, by
stat), ``source`` (the probe's own files), the canary ``kernels``, ``ospkgs``, ``deep``, the
command line ``flags`` (which envlock writes from too) and the orchestration in ``collect``.
This file stays empty: the model and the runtime import ``rules`` and ``flags`` without
pulling in collectors.
"""
