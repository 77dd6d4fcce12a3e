"""What the commands print at length: text, markdown and JSON of show, diff, verify, canary and
the requirements check.

``render`` (show, the capture summary, diff, verify and canary), ``verify`` (the parts of a verify
report beyond the differences: the summary that leads, the image hint, recorded process state,
the ``--deep`` and torch-facts lines), ``requirements`` (``verify --requirements``). Built from a
``drift`` result and the lock; nothing here decides what counts as drift or runs anything. The
reports that belong to one job stay with it: a fleet's in ``check/fleetreport``, a replay's
verdict in ``replay/report``.
"""
