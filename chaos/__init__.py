"""Chaos testing of a three-node runstate cluster: faults (kill -9, SIGSTOP, partitions, restarts,
leadership transfers, membership changes) injected from a seeded schedule while a workload runs,
then a check of the recorded history.

    python -m chaos run --seed 7 --duration 60s --faults kill,pause,partition,restart --report DIR

Modules: `cluster` (`runstate node` processes on 127.0.0.1, three to start with, every Raft
connection through the dialed node's `proxy`, which knows who dialed, so a partition needs no
root), `faults` (the registry, the schedule, the injector),
`workload` and `history` (clients and the recorded operations), `checker` and
`linearizability` (the checks). It runs from the installed package plus this folder; nothing
from tests/ is imported.
"""
