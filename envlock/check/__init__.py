"""Judging an environment now, where it will run: this interpreter or another on this host
(``local``: the one verify path, behind ``envlock.verify()``, ``envlock verify`` and the check
inside a restored image), or every node of an allocation (``verify --fleet``).

``distributed.check()`` needs a started process group, so a node that hangs or runs another
NCCL hangs the job before anything is reported. This check needs none: the scheduler's own
launcher (``srun --ntasks-per-node=1``) starts ``envlock verify --fleet-node`` once on every node,
each node judges itself against the same lock with the one comparator and prints its verdict as
one JSON line, and the host gathers the lines, names each node's difference and groups the
nodes that differ in the same way. The nodes run in parallel; the gathering reads one short line
per node, so the cost grows with the node count only through that line.

The fleet's modules, one per job: ``srun`` (starting the nodes' checks through Slurm's launcher, bounded),
``protocol`` (the line a node prints, and every node's verdict read back from srun's output),
``verdicts`` (what the preflight found, grouped), ``hostlist`` (Slurm's compressed form of node
names), ``fleetreport`` (the text). This file imports none of them, so a node, which only prints its line, loads only
``protocol`` and what that needs.
"""
