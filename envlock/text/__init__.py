"""How a value is written: for a terminal (``terminal``) and for each output language envlock
writes (``escape``: shell, Apptainer, YAML, GitHub outputs, LaTeX, markdown).

A leaf: every layer prints or writes values it read from a lock, which is data from elsewhere,
so the one rule for each place lives below them all. Nothing here reads a file or imports
another envlock module but ``errors``.
"""
