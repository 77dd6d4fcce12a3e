"""Comparing two locks, and what the differences mean: pure functions of data, no probe run.

``result`` (``Difference``, ``Comparison``: what every comparison returns), ``compare`` (the one
comparator, severities read from the lock's policies), ``packages`` and ``native`` (its sections
for installed packages, and for native libraries, runtimes, torch.compile and CUDA as built and
loaded), ``deep`` (``verify --deep``'s findings as differences), ``expected`` (what a restore
changed on purpose, allowed for by every verify in its image), ``requirements`` (a host judged
against the lock's ``[requires]`` alone). The words of a report are ``report``'s; running the
probe is ``probing``'s. Named for the job rather than ``compare``, the public function
``envlock.compare`` that a subpackage of that name would replace.
"""
