"""The replay record end to end: its format, making it, comparing two, the verdict's text, and the
compile cache a recorded run carries.

``record`` (the record's models, seal, reader and writer), ``make`` (a record made from a run's
journal, outputs and inputs, after the command exits), ``compare`` (two records: the first
divergence, changed inputs, the process facts beside them; pure), ``report`` (a replay's verdict
as text), ``compilecache`` (a torch.compile cache checked against a lock and carried between
runs). The journal written inside the training process is ``runtime/recorder`` (stdlib only);
the options of ``record``, ``replay`` and ``run --record`` are ``commands/_recording``'s. Named
``replay`` rather than ``record``: ``envlock.record`` is the public function.
"""
