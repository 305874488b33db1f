"""Chaos testing of a three-node runstate cluster: faults (kill -9, SIGSTOP, partitions, restarts,
leadership transfers) injected from a seeded schedule while a workload runs, then a check of the
recorded history.

    python -m chaos run --seed 7 --duration 60s --faults kill,pause,partition,restart --report DIR

Modules: `cluster` (three `runstate node` processes on 127.0.0.1, every Raft pair through a
`proxy` so a partition needs no root), `faults` (the registry, the schedule, the injector),
`workload` and `history` (clients and the recorded operations), `checker` and
`linearizability` (the checks). It runs from the installed package plus this folder; nothing
from tests/ is imported.
"""
