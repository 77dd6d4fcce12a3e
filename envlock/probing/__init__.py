"""envlock's side of the probe: which interpreter, the probe's process, the lock built from its
document.

``target`` (which environment a command means: ``--python``, the project's venv, the active one),
``process`` (starting the probe in that interpreter in its own session with a deadline, reading
its one document, and killing what it leaves behind), ``capture`` (running the probe and
validating the lock while it runs; chooses nothing), ``progress`` (the ``--deep`` progress bar).
The probe itself is ``envlock/probe/`` (stdlib only, run by path in other interpreters); this
package is never imported there. Named ``probing`` rather than ``capture``: ``envlock.capture``
is the public function, which a subpackage of that name would replace.
"""
