"""The probe's command line, declared once.

envlock writes the probe's arguments (``envlock.probing.process.probe_args`` through ``command_line``)
and the probe reads them (``collect.parser``, plain argparse built from ``FLAGS``); both read
the one table below, so an option cannot be spelt one way on one side and another way on the
other. Stdlib only, Python >= 3.8 like the rest of the probe.

envlock imports this module before it starts the probe, so it imports nothing itself: the
table is data, and the parser is built where it is used, in the probe.
"""

from __future__ import annotations

# What an option takes: a switch is present or absent; a value is one string; an int is one
# number; a repeated option may appear any number of times and collects its values in a list.
SWITCH = "switch"
VALUE = "value"
INT = "int"
REPEATED = "repeated"


class Flag:
    """One option of the probe: its spelling, what it takes and its help line."""

    __slots__ = ("help", "kind", "name")

    def __init__(self, name: str, kind: str, help: str) -> None:
        self.name = name
        self.kind = kind
        self.help = help

    @property
    def dest(self) -> str:
        """The option's key in the parsed options, as argparse names it (``--no-torch``: no_torch)."""
        return self.name[2:].replace("-", "_")

    def default(self) -> object:
        return False if self.kind == SWITCH else [] if self.kind == REPEATED else None

    def __repr__(self) -> str:
        return "Flag(%r, %r)" % (self.name, self.kind)


# The probe's output, framed: this line, then the JSON document. Whatever the interpreter prints
# before it on stdout (a sitecustomize.py or .pth that greets, a wrapper script's banner) is
# not the document and is skipped. json.dumps escapes every control character, so the record
# separator that starts the line can never occur inside the document itself.
DOCUMENT_MARKER = "\x1eenvlock-probe-document"

# In the order envlock writes them on a command line.
FLAGS = (
    Flag("--git-exclude", REPEATED, "a file to leave out of the git state (the lock being written)"),
    Flag("--no-torch", SWITCH, "never import torch"),
    Flag("--deep", SWITCH, "hash every installed file"),
    Flag("--progress", SWITCH, "with --deep: its progress on stderr"),
    Flag("--no-cache", SWITCH, "trust no cache: import torch, read and hash every file anew"),
    Flag("--canary", SWITCH, "run the numeric canary kernels (imports torch)"),
    Flag("--image", VALUE, "the image reference this environment was started from"),
    Flag("--cwd", VALUE, "the directory whose git state is recorded (default: the current one)"),
    Flag("--indent", INT, "indent the JSON document by this many spaces"),
)


def command_line(options: dict[str, object]) -> list[str]:
    """The arguments that make the probe read ``options`` (keyed by ``Flag.dest``).

    An option at its default (off, None, an empty string or list) is left out. A value that
    starts with "-" is joined to its option with "=", so it cannot be taken for an option.
    """
    known = {flag.dest for flag in FLAGS}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError("not options of the probe: %s" % ", ".join(unknown))
    argv: list[str] = []
    for flag in FLAGS:
        value = options.get(flag.dest)
        if flag.kind == SWITCH:
            if value:
                argv.append(flag.name)
            continue
        if flag.kind == REPEATED:
            if not isinstance(value, (list, tuple)) and value is not None:
                raise TypeError("%s takes a list, not %r" % (flag.dest, value))
            values = list(value or ())
        else:
            values = [value]
        for item in values:
            if item is None or item == "":
                continue
            text = str(item)
            argv += ["%s=%s" % (flag.name, text)] if text.startswith("-") else [flag.name, text]
    return argv
