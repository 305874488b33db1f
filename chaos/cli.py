"""`python -m chaos run ...` and `python -m chaos check DIR`.

A run: a fresh three-node cluster in REPORT/cluster, the workload recording every operation in
REPORT/history.jsonl while the injector applies the seeded fault schedule (a replace or a grow
changes the nodes; the workload's clients follow), then everything healed (partitions lifted,
paused nodes resumed, stopped nodes started), the workload's final reads, the replicas' digests
compared, the members' lists of voters compared, the checker over the history, and
REPORT/summary.json. Exit code 0 when the checker found no violation (and the harness itself had
no error), 1 otherwise, 2 for a usage error.

`run --tls`: the nodes serve their APIs over HTTPS with certificates of a private CA made for the
run (REPORT/cluster/certs, `runstate certs init`), and every client of the harness trusts it (the
SDK's `once` callers through RUNSTATE_CA_FILE and SSL_CERT_FILE, set in this process).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

from chaos.checker import check_history, format_report
from chaos.cluster import CA_FILE_ENV, OPENSSL_CA_FILE_ENV, ChaosCluster, ClusterError
from chaos.faults import REGISTRY, Injector, Schedule, parse_kinds
from chaos.history import History, read_history
from chaos.workload import Workload

EXIT_OK, EXIT_VIOLATIONS, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM: the run was cut short, its nodes killed
HISTORY_FILE = "history.jsonl"
SUMMARY_FILE = "summary.json"
SEED_MAX = 2**31 - 1
DURATION_S_MIN, DURATION_S_MAX = 5, 24 * 3600
HEAL_TIMEOUT_S = 90.0  # after the last fault: every node back, one leader
CONVERGE_TIMEOUT_S = 60.0
MEMBERS_TIMEOUT_S = 30.0  # at the end: every node lists the nodes as voters
_DURATION = re.compile(r"^(\d+)(s|m|h)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600}

log = logging.getLogger("chaos")


def duration_s(text: str) -> int:
    match = _DURATION.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 60s, 30m or 1h")
    value = int(match.group(1)) * _UNIT_S[match.group(2)]
    if not DURATION_S_MIN <= value <= DURATION_S_MAX:
        raise argparse.ArgumentTypeError(f"the duration must be {DURATION_S_MIN} s to {DURATION_S_MAX // 3600} h")
    return value


def kinds(text: str) -> list[str]:
    try:
        return parse_kinds(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m chaos", description="Fault injection against a three-node runstate cluster")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="start a cluster, run the workload under faults, check the history")
    run.add_argument("--seed", type=int, help="the fault schedule's and the workload's seed (default: a random one, printed)")
    run.add_argument("--duration", type=duration_s, default=duration_s("60s"), help="how long faults are injected (default 60s)")
    run.add_argument(
        "--faults", type=kinds, default=list(REGISTRY),
        help=f"comma-separated fault kinds from {', '.join(REGISTRY)} (default all)",
    )
    run.add_argument("--report", type=Path, help="the report folder (default ./chaos-reports/<time>-seed<S>)")
    run.add_argument("--log-level", default="WARNING", help="the nodes' and the harness's log level")
    run.add_argument(
        "--tls", action="store_true",
        help="the nodes serve HTTPS with certificates of a private CA made for the run; every client trusts it",
    )
    check = commands.add_parser("check", help="check a saved report's history again")
    check.add_argument("report", type=Path, help="a report folder (holding history.jsonl)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=getattr(args, "log_level", "WARNING").upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "check":
        return check(args.report)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(SEED_MAX)
    report = args.report or Path("chaos-reports") / f"{time.strftime('%Y%m%d-%H%M%S')}-seed{seed}"
    if report.exists() and any(report.iterdir()):
        print(f"chaos: the report folder {report} is not empty", file=sys.stderr)
        return EXIT_USAGE
    print(f"chaos: seed {seed}, {args.duration} s of {','.join(args.faults)}{' over TLS' if args.tls else ''}; "
          f"report in {report}", flush=True)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        summary = run(seed, args.duration, args.faults, report, args.log_level, tls=args.tls)
    except KeyboardInterrupt:
        print(f"chaos: interrupted; the cluster's nodes are stopped; seed {seed}, report in {report}", flush=True)
        return EXIT_INTERRUPTED
    print(format_report(check_history(read_history(report / HISTORY_FILE))), flush=True)
    faults = summary["faults"]
    print(json.dumps({
        "seed": seed, "injected": faults["injected"], "survived": faults["survived"], "skipped": faults["skipped"],
        "transfers": faults["transfers"], "replaces": faults["replaces"], "grows": faults["grows"],
        "members": summary["members"]["ids"], "membersAgree": summary["members"]["agree"],
        "longestUnavailableS": faults["longestUnavailableS"], "longestWriteGapS": summary["longestWriteGapS"],
        "operations": summary["operations"].get("operations"),
        "violations": summary["violations"], "harnessErrors": summary["harness_errors"],
    }), flush=True)
    print(f"chaos: seed {seed}; report in {report}", flush=True)
    return EXIT_OK if summary["violations"] == 0 and not summary["harness_errors"] else EXIT_VIOLATIONS


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM ends a run as Ctrl-C does, through the cluster's close, which kills its nodes
    (Python's own SIGTERM ends the process at once and left them running)."""
    raise KeyboardInterrupt


def run(seed: int, duration: int, fault_kinds: list[str], report: Path, log_level: str, tls: bool = False) -> dict[str, Any]:
    """One chaos run into `report` (with `tls`, over HTTPS); returns (and writes) its summary."""
    report.mkdir(parents=True, exist_ok=True)
    schedule = Schedule(seed, duration, fault_kinds)
    history = History(report / HISTORY_FILE)
    harness_errors: list[str] = []
    summary: dict[str, Any] = {
        "seed": seed, "durationS": duration, "kinds": fault_kinds, "tls": tls, "schedule": schedule.as_json(),
    }
    with ChaosCluster(report / "cluster", log_level=log_level, tls=tls) as cluster:
        if cluster.ca_file is not None:  # the SDK's `once` callers (the workload's urllib client takes the context)
            os.environ[CA_FILE_ENV] = os.environ[OPENSSL_CA_FILE_ENV] = str(cluster.ca_file)
        cluster.up()
        history.event("start", {"seed": seed, "durationS": duration, "schedule": schedule.as_json(), "layout": cluster.layout()})
        workload = Workload(cluster.urls, cluster.admin_key, history, seed, context=cluster.context)
        cluster.watch(workload.use_urls)  # a replace or a grow changes the nodes the clients call
        injector = Injector(cluster, schedule, lambda line: history.event(line["event"], line["detail"]))
        workload.start()
        injector.start()
        injector.join()
        workload.stop()
        if injector.error is not None:
            harness_errors.append(f"injector: {injector.error!r}")
        healed_at = time.monotonic()
        try:
            _heal_everything(cluster)
            summary["healS"] = round(time.monotonic() - healed_at, 2)
            summary["finalize"] = workload.finalize()
            summary["digest"] = cluster.wait_converged(CONVERGE_TIMEOUT_S)
        except ClusterError as error:
            harness_errors.append(f"the cluster did not recover after the faults: {error}")
        summary["members"] = _members(cluster)
        history.event("stop", {"harnessErrors": harness_errors})
        history.close()
        summary["faults"] = injector.summary()
        summary["proxies"] = cluster.proxy_stats()
    harness_errors.extend(workload.errors)
    result = check_history(read_history(report / HISTORY_FILE))
    summary["operations"] = result.counts
    summary["longestWriteGapS"] = longest_write_gap_s(report / HISTORY_FILE)
    summary["violations"] = len(result.violations)
    summary["violationsByCheck"] = _by_check(result.violations)
    summary["notes"] = result.notes
    summary["harness_errors"] = harness_errors
    (report / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, default=str))
    return summary


def _heal_everything(cluster: ChaosCluster) -> None:
    """Lift partitions, resume paused nodes, start stopped ones, wait for one leader."""
    cluster.heal()
    for index in range(len(cluster.urls)):
        if index in cluster.paused:
            cluster.resume(index)
    stopped = [index for index in range(len(cluster.urls)) if not cluster.running(index)]
    if stopped:
        cluster.start(*stopped)
    cluster.wait_healthy(HEAL_TIMEOUT_S)


def _members(cluster: ChaosCluster) -> dict[str, Any]:
    """The nodes at the end, whether every one lists them all as voters (a failed replace or
    grow may leave them disagreeing: visible here, not a violation), and the departed ones."""
    try:
        cluster.wait_members(MEMBERS_TIMEOUT_S)
    except ClusterError:
        pass
    agree, views = cluster.members_agree()
    return {"ids": cluster.ids, "agree": agree, "views": views, "departed": [slot.id for slot in cluster.departed],
            "layout": cluster.layout()}


WRITE_OPS = frozenset({
    "submit", "receive", "renew", "complete", "arrive", "run_create", "group_submit", "verdict", "timer_create",
    "barrier_create", "group_create", "cancel_run",
})


def longest_write_gap_s(history_path: Path) -> float:
    """The longest time no write was acknowledged, as the clients saw it (the harness's own
    unavailability figure instead runs from each fault until every node is healthy again)."""
    returns = sorted(
        operation["ret"] for operation in read_history(history_path).operations
        if operation["op"] in WRITE_OPS and operation["status"] == "ok" and operation["ret"] is not None
    )
    gaps = (later - earlier for earlier, later in zip(returns, returns[1:], strict=False))
    return round(max(gaps, default=0.0), 2)


def _by_check(violations: list[Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for violation in violations:
        counts[violation.check] = counts.get(violation.check, 0) + 1
    return counts


def check(report: Path) -> int:
    path = report / HISTORY_FILE
    if not path.exists():
        print(f"chaos: no {HISTORY_FILE} in {report}", file=sys.stderr)
        return EXIT_USAGE
    result = check_history(read_history(path))
    print(format_report(result), flush=True)
    return EXIT_OK if result.ok else EXIT_VIOLATIONS
