"""The TypeScript SDK (sdk/typescript): its build, type-check and unit tests, every TypeScript sample
of the docs run as written against a real dev node, and TypeScript and Python sharing work.

Once per session: `npm ci` in sdk/typescript (the lockfile's dev dependencies), `npm pack` (which
builds the package), and a fresh project that installs the tarball, as a user would. The samples
(sdk/typescript/samples/) are copied into that project and run there with tsx, so `import ... from
'runstate-sdk'` resolves to the packed build. Every sample gets a space of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from runstate import Runstate

from runstate_server.node._asyncio_tls import PYTHON_WITH_THIS_PROTOCOL
from tests._http import new_space
from tests._nodes import DevNode
from tests._tls_nodes import https_node, make_ca, sign_server_certificate, unverified_context
from tests._typescript import PACKAGE, npm, run_npm

SAMPLES = PACKAGE / "samples"
PY_QUICKSTART = Path(__file__).resolve().parent / "quickstart"
PROCESS_TIMEOUT_S = 60.0

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def project(tmp_path_factory: pytest.TempPathFactory, typescript_package: Path) -> Path:
    """A fresh project with the packed SDK installed and the samples copied in."""
    packed = tmp_path_factory.mktemp("ts-pack")
    # Built already (the typescript_package fixture): pack what was built.
    run_npm("pack", "--ignore-scripts", "--pack-destination", str(packed), cwd=typescript_package)
    (tarball,) = packed.glob("runstate-sdk-*.tgz")
    app = tmp_path_factory.mktemp("ts-app")
    (app / "package.json").write_text(json.dumps({"name": "app", "private": True, "type": "module"}))
    run_npm("install", "--offline", "--no-package-lock", str(tarball), cwd=app)
    shutil.copytree(SAMPLES, app / "samples")
    shutil.copytree(PACKAGE / "test" / "node", app / "samples" / "node")  # the tests' own scripts
    return app


def ts_env(node: DevNode, space: str | None = None, **extra: str) -> dict[str, str]:
    env = {**os.environ, "RUNSTATE_BASE_URL": node.url, "RUNSTATE_SDK_QUIET": "1", "PYTHONUNBUFFERED": "1", **extra}
    for name in ("RUNSTATE_API_KEY", "RUNSTATE_SCOPE_ID", "RUNSTATE_RUN"):
        if name not in extra:
            env.pop(name, None)
    env["RUNSTATE_SPACE_ID"] = space or new_space(node.url, "ts")
    return env


class Processes:
    """TypeScript (tsx) and Python children with piped output; all killed and reaped at the end."""

    def __init__(self, project: Path) -> None:
        self.project = project
        self.started: list[subprocess.Popen[str]] = []

    def tsx(self, sample: str, env: dict[str, str]) -> subprocess.Popen[str]:
        command = [str(PACKAGE / "node_modules" / ".bin" / "tsx"), str(self.project / "samples" / sample)]
        return self.start(command, env)

    def python(self, script: str | Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
        return self.start([sys.executable, str(script), *args], env)

    def start(self, command: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
        # A process group of its own: tsx runs the script in a child node process, which a kill of
        # tsx alone would leave running.
        process = subprocess.Popen(
            command, cwd=self.project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )
        self.started.append(process)
        return process

    def close(self) -> None:
        for process in self.started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # the group this test started, children included
        for process in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(PROCESS_TIMEOUT_S)
            if process.stdout is not None:
                process.stdout.close()


@pytest.fixture
def procs(project: Path) -> Iterator[Processes]:
    made = Processes(project)
    try:
        yield made
    finally:
        made.close()


def output(process: subprocess.Popen[str]) -> str:
    """The child's whole output once it exited with 0."""
    text, _ = process.communicate(timeout=PROCESS_TIMEOUT_S)
    assert process.returncode == 0, f"exited with {process.returncode}:\n{text}"
    return text


def read_line(process: subprocess.Popen[str], prefix: str) -> str:
    """The first line of the child's output starting with prefix (bounded by the test timeout)."""
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith(prefix):
            return line.strip()
    raise AssertionError(f"the child exited ({process.wait()}) without printing {prefix!r}")


def last_json(text: str) -> dict[str, object]:
    return json.loads(text.strip().splitlines()[-1])


# -- the package ------------------------------------------------------------------------------------


def test_type_check_and_unit_tests(project: Path) -> None:
    # tsc --noEmit (strict, over src, tests and samples) and node --test (key vectors, durations,
    # errors), side by side.
    checks = {
        name: subprocess.Popen([npm(), *args], cwd=PACKAGE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for name, args in (("typecheck", ["run", "typecheck"]), ("test", ["test"]))
    }
    outputs = {name: output(process) for name, process in checks.items()}
    assert "# fail 0" in outputs["test"], outputs["test"][-4000:]


def test_a_fresh_project_imports_the_packed_build(project: Path) -> None:
    script = (
        "import runstate, { Runstate, OnceFailedError, TaskFailedError, LeaseLostError, ResultTooLargeError, "
        "ScopeCancelledError, UnavailableError, ConfigError } from 'runstate-sdk';"
        "const names = ['once', 'queue', 'serve', 'context', 'configure'].filter((n) => typeof runstate[n] === 'function');"
        "console.log(JSON.stringify({ names, ctor: typeof Runstate, base: new OnceFailedError('x') instanceof Error,"
        " same: runstate.OnceFailedError === OnceFailedError }));"
    )
    done = subprocess.run(
        ["node", "--input-type=module", "-e", script], cwd=project, capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "names": ["once", "queue", "serve", "context", "configure"], "ctor": "function", "base": True, "same": True,
    }
    installed = project / "node_modules" / "runstate-sdk"
    assert (installed / "dist" / "index.d.ts").exists() and not (installed / "src").exists()


# -- the quickstart ---------------------------------------------------------------------------------


def test_quickstart_typescript_producer_and_worker(dev_node: DevNode, procs: Processes) -> None:
    env = ts_env(dev_node)
    producer = procs.tsx("quickstart/producer.ts", env)
    run_id = read_line(producer, "RUNSTATE_SCOPE_ID=").split("=", 1)[1]
    worker = procs.tsx("quickstart/worker.ts", {**env, "RUNSTATE_SCOPE_ID": run_id})
    assert read_line(producer, "SUCCEEDED") == "SUCCEEDED { doubled: 42 }"
    assert producer.wait(PROCESS_TIMEOUT_S) == 0
    assert read_line(worker, "completed").endswith("(attempt 1)")


@pytest.mark.parametrize("producer_language", ["typescript", "python"])
def test_quickstart_across_languages(dev_node: DevNode, procs: Processes, producer_language: str) -> None:
    """A TypeScript producer with the Python worker, and the Python producer with the TypeScript worker."""
    env = ts_env(dev_node)
    if producer_language == "typescript":
        producer = procs.tsx("quickstart/producer.ts", env)
    else:
        producer = procs.python(PY_QUICKSTART / "producer.py", env)
    run_id = read_line(producer, "RUNSTATE_SCOPE_ID=").split("=", 1)[1]
    worker_env = {**env, "RUNSTATE_SCOPE_ID": run_id}
    if producer_language == "typescript":
        worker = procs.python(PY_QUICKSTART / "worker.py", worker_env)
        expected = "SUCCEEDED { doubled: 42 }"
    else:
        worker = procs.tsx("quickstart/worker.ts", worker_env)
        expected = "SUCCEEDED {'doubled': 42}"
    assert read_line(producer, "SUCCEEDED") == expected
    assert producer.wait(PROCESS_TIMEOUT_S) == 0
    assert read_line(worker, "completed").endswith("(attempt 1)")


# -- once and queues --------------------------------------------------------------------------------


def test_once_samples(dev_node: DevNode, procs: Processes) -> None:
    started = {name: procs.tsx(f"once-and-queues/{name}.ts", ts_env(dev_node)) for name in ("once", "once_key", "once_failed", "once_signal")}
    once = last_json(output(started["once"]))
    # One run of the function for the three calls, with the key every SDK computes.
    assert once == {
        "report": {"name": "acme", "calls": 1}, "again": [{"name": "acme", "calls": 1}] * 2, "calls": 1,
        "key": "researchCompany:07fad54f7446269afc481e306a48f046",
    }
    keyed = last_json(output(started["once_key"]))
    assert keyed["first"] == keyed["second"] == "Acme: fetched https://acme.com/" and keyed["gets"] == 1
    failed = output(started["once_failed"]).splitlines()
    assert failed[:5] == [f"attempt {n}: no sources for acme" for n in range(1, 6)]
    assert failed[5].startswith("gave up after 5 attempts: ") and "no sources for acme" in failed[5]
    assert json.loads(output(started["once_signal"]).strip()) == ["acme/intro", "acme/market", "acme/risks"]


def test_queue_samples_producer_worker_and_sigterm(dev_node: DevNode, procs: Processes) -> None:
    env = ts_env(dev_node)
    worker = procs.tsx("once-and-queues/worker.ts", env)
    produced = output(procs.tsx("once-and-queues/producer.ts", env))
    assert produced.startswith("submitted tsk_")
    assert last_json(produced) == {
        "report": {"company": "acme", "attempt": 1}, "later": {"company": "globex", "attempt": 1}, "sameJob": True,
    }
    shared = last_json(output(procs.tsx("once-and-queues/shared_producer.ts", env)))
    assert shared["sameJob"] is True and shared["created"] == [True, False]
    worker.send_signal(signal.SIGTERM)  # serve() drains and returns
    assert output(worker).strip().endswith("serve() returned")


def test_python_worker_serves_a_typescript_queue(dev_node: DevNode, procs: Processes) -> None:
    """The same queue name and input give the same job in both SDKs: a TypeScript producer's job is
    served by a Python worker, and a Python producer asking for the same input gets that job."""
    env = ts_env(dev_node)
    worker_code = (
        "import runstate\n"
        "@runstate.queue('research', attempts=5, lease='60s', concurrency=4)\n"
        "def research(input):\n"
        "    return {'company': input['company'], 'attempt': runstate.context().attempt, 'by': 'python'}\n"
        "runstate.serve()\n"
    )
    worker = procs.start([sys.executable, "-c", worker_code], env)
    produced = last_json(output(procs.tsx("once-and-queues/producer.ts", env)))
    assert produced["report"] == {"company": "acme", "attempt": 1, "by": "python"}
    again = (
        "import json, runstate\n"
        "@runstate.queue('research', attempts=5, lease='60s', concurrency=4)\n"
        "def research(input): raise AssertionError('served already')\n"
        "job = research.send({'company': 'globex'})\n"
        "print(json.dumps({'created': job.created, 'result': job.result()}))\n"
    )
    answer = last_json(output(procs.start([sys.executable, "-c", again], env)))
    assert answer == {"created": False, "result": {"company": "globex", "attempt": 1, "by": "python"}}
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(PROCESS_TIMEOUT_S) == 0


def test_queue_with_slots_limit_and_budget(dev_node: DevNode, procs: Processes) -> None:
    """The "Queues that need resources" sample, served: each job takes a slot, a unit and a budget
    reservation, settled whole (0.40) or with what the handler reported with spend() (0.10)."""
    ran = last_json(output(procs.tsx("once-and-queues/resources_run.ts", ts_env(dev_node))))
    assert ran == {
        "page": "<html>https://example.com/</html>", "settledMinor": "500000", "reservedMinor": "0", "scale": 6, "inUse": 0,
    }


@pytest.mark.parametrize("first", ["python", "typescript"])
def test_once_is_shared_between_languages(dev_node: DevNode, procs: Processes, first: str) -> None:
    """A once result recorded by one SDK is returned to the other without running its function."""
    env = ts_env(dev_node)
    python_code = (
        "import json, runstate\n"
        "ran = []\n"
        "@runstate.once\n"
        "def researchCompany(name):\n"
        "    ran.append(name)\n"
        "    return {'name': name, 'by': 'python'}\n"
        "print(json.dumps({'report': researchCompany('acme'), 'ran': ran, 'key': researchCompany.once_key('acme')}))\n"
    )
    if first == "python":
        from_python = last_json(output(procs.start([sys.executable, "-c", python_code], env)))
        from_typescript = last_json(output(procs.tsx("once-and-queues/once.ts", env)))
        assert from_python["ran"] == ["acme"]
        assert from_typescript["report"] == {"name": "acme", "by": "python"} and from_typescript["calls"] == 0
    else:
        from_typescript = last_json(output(procs.tsx("once-and-queues/once.ts", env)))
        from_python = last_json(output(procs.start([sys.executable, "-c", python_code], env)))
        assert from_typescript["calls"] == 1
        assert from_python["report"] == {"name": "acme", "calls": 1} and from_python["ran"] == []
    assert from_python["key"] == from_typescript["key"] == "researchCompany:07fad54f7446269afc481e306a48f046"


def test_a_dead_workers_task_is_taken_over_and_a_cancel_aborts_the_handler(dev_node: DevNode, procs: Processes) -> None:
    env = ts_env(dev_node)
    with Runstate(base_url=dev_node.url, space_id=env["RUNSTATE_SPACE_ID"]) as rs:
        rs.mailboxes.ensure("work", mode="WORK")
        run = rs.scopes.create()
        ticket = run.mailbox("work").submit({"n": 1}, key="stuck")
    stuck = procs.tsx("node/stuck_worker.ts", {**env, "RUNSTATE_SCOPE_ID": run.id, "LEASE_MS": "1000"})
    assert read_line(stuck, "holding") == f"holding {ticket.id} attempt 1"
    os.killpg(stuck.pid, signal.SIGKILL)  # kill -9: no renewals, no release
    stuck.wait(PROCESS_TIMEOUT_S)
    report = last_json(output(procs.tsx("node/leases.ts", {**env, "RUNSTATE_SCOPE_ID": run.id, "TASK_ID": ticket.id})))
    assert report == {
        "takeover": {"attempt": 2, "data": {"n": 1}}, "result": {"done": True},
        "cancelled": {"seen": ["ScopeCancelledError"], "task": True},
    }


def test_a_stalled_once_holder_is_taken_over_and_its_late_result_refused(dev_node: DevNode, procs: Processes) -> None:
    """The docs' "When a process dies": the second caller takes the work over once the first one's
    lease lapsed; the first one, continued, sees its signal abort and gets LeaseLostError."""
    env = ts_env(dev_node)
    holder = procs.tsx("node/once_holder.ts", {**env, "HOLD": "1"})
    assert read_line(holder, "running") == "running attempt 1"
    os.killpg(holder.pid, signal.SIGSTOP)
    try:
        second = output(procs.tsx("node/once_holder.ts", env)).splitlines()
    finally:
        os.killpg(holder.pid, signal.SIGCONT)
    assert second[0] == "running attempt 2"
    taken = last_json(second[-1])["result"]
    assert isinstance(taken, dict) and (taken["attempt"], taken["aborted"]) == (2, False)
    assert last_json(output(holder)) == {"error": "LeaseLostError"}


def test_the_clients_other_calls(dev_node: DevNode, procs: Processes) -> None:
    """Submit replays and key conflicts, release/reject/stale complete, task cancel, result
    timeout, joinTask, verdicts, a group wait that times out, named barriers and timers, child runs
    and cancellation (test/node/calls.ts)."""
    report = last_json(output(procs.tsx("node/calls.ts", ts_env(dev_node))))
    assert report == {
        "ensureAgain": False, "otherMode": "ConflictError:CONFLICT", "submit": {"created": [True, False], "same": True},
        "keyConflict": True, "unknownQueue": True, "released": {"sameTask": True, "attempt": 1},
        "rejected": ["FAILED", "rejected: not for me"], "staleComplete": "LeaseLostError:STALE_CLAIM",
        "cancelTask": "CANCELLED", "resultTimeout": "ResultTimeoutError:RESULT_TIMEOUT", "joined": True,
        "waitTimeout": True, "group": ["FAILURE", "all_terminal", ["ACCEPTED", "REJECTED"]], "groupClosed": "CONFLICT",
        "barrier": "RELEASED", "barrierOtherTarget": "ConflictError:CONFLICT", "timer": True, "child": True,
        "afterCancel": True, "completeCancelled": "ConflictError:CONFLICT",
    }


def test_consume_settles_every_task_once_with_batch_completes(dev_node: DevNode, procs: Processes) -> None:
    """consume() sends the completes that pile up while one is in flight together
    (test/node/consume_many.ts)."""
    report = last_json(output(procs.tsx("node/consume_many.ts", ts_env(dev_node))))
    assert report == {"outcomes": True, "handledOnce": True, "singleCompletes": 0, "fewerBatches": True}


def test_consume_frees_a_slot_when_its_handler_returns(dev_node: DevNode, procs: Processes) -> None:
    """With one slot, the next handlers run while the first delivery's complete is still on its
    way, up to the bound on deliveries held (1 + 3), the next one only after that complete is
    answered (a proxy holds each complete's answer back; test/node/consume_settle.ts)."""
    report = last_json(output(procs.tsx("node/consume_settle.ts", ts_env(dev_node))))
    assert report == {"outcomes": True, "handlers": 5, "withinBoundBeforeFirstCompleteAnswered": True, "nextAfterIt": True}


def test_client_bound_queue_gather_and_once(dev_node: DevNode, procs: Processes) -> None:
    """The surface the published 0.3.0 cross-language test drives (test/node/client_api.ts):
    `new Runstate({ run, worker, timeout })`, a producer-only `rs.queue(name)` served by another
    client's queue (whose declared attempts apply), gather with need and accept, `rs.once`."""
    report = last_json(output(procs.tsx("node/client_api.ts", ts_env(dev_node))))
    failure = report.pop("failure")
    # The message is the handler's last error, as the published clients give it.
    assert failure == {"tsClass": True, "attempts": 2, "message": "Error: cannot review doc 99"}
    assert report == {
        "called": {"doc": 1, "by": "worker"}, "sameJob": True, "sent": {"doc": 2, "by": "worker"}, "gathered": [4, 6],
        "first": {"by": "ts", "args": ["acme", {"depth": 2}]}, "again": {"by": "ts", "args": ["acme", {"depth": 2}]},
        "calls": 1,
    }


def test_slots_units_and_reservations_taken_by_a_run(dev_node: DevNode, procs: Processes) -> None:
    """run.slot / run.pools.acquire (a FIFO line when full, a refused renewal after a cancel),
    run.limits.take (a line until the window has room) and run.budget / run.budgets.reserve
    (settled with what was spent, released whole) (test/node/slots.ts)."""
    report = last_json(output(procs.tsx("node/slots.ts", ts_env(dev_node))))
    assert report == {
        "inside": True, "handedOver": True, "cancelled": True, "exhausted": True, "taken": True,
        "spentBlock": 0.1, "notEnough": True, "overTotal": True, "released": True, "budget": ["100000", "0"],
    }


# -- task groups and cancellation -------------------------------------------------------------------


def test_task_group_cancel_barrier_and_timer_samples(dev_node: DevNode, procs: Processes) -> None:
    started = {
        "groups": procs.tsx("task-groups/groups.ts", ts_env(dev_node)),
        "cancel": procs.tsx("task-groups/cancel.ts", ts_env(dev_node)),
        "barriers": procs.tsx("task-groups/barriers.ts", ts_env(dev_node)),
        "timers": procs.tsx("task-groups/timers.ts", ts_env(dev_node, TIMER_AFTER_SECONDS="1")),
    }
    groups = output(started["groups"]).splitlines()
    assert groups[0].startswith("start workers with RUNSTATE_SCOPE_ID=run_")
    assert groups[1:] == ["SUCCESS threshold_reached", "members 12, accepted 5", "re-attached: threshold_reached"]
    assert output(started["cancel"]).splitlines() == ["ACTIVE INACTIVE", "refused: SCOPE_CANCELLED"]
    assert output(started["barriers"]).splitlines() == ["RELEASED 3/3"]
    timers = output(started["timers"]).splitlines()
    assert timers[0].startswith("fires at ") and timers[1].startswith("follow-up check at ")
    assert timers[2] == "cancelled: CANCELLED"


def test_a_python_group_judged_from_typescript(dev_node: DevNode, procs: Processes) -> None:
    space = new_space(dev_node.url, "ts")
    with Runstate(base_url=dev_node.url, space_id=space, holder="python-owner") as rs:
        rs.mailboxes.ensure("reviews", mode="WORK")
        run = rs.scopes.create()
        group = run.groups.create(mailbox="reviews", condition="FIRST_ACCEPTED", parent_scope_id=run.id)
        ticket = group.submit({"draft": 1}, key="draft-1")
        group_run = rs.scope(group.status()["scopeId"])
        (delivery,) = group_run.mailbox("reviews").receive(max=1, wait_ms=5_000)
        delivery.complete(result={"payload": {"good": True}})
        judge = (
            "import { Runstate } from 'runstate-sdk';\n"
            "const rs = new Runstate({ holder: 'typescript-reviewer' });\n"
            "const group = rs.scope(process.env.RUN_ID!).groups.byId(process.env.GROUP_ID!);\n"
            "const result = await rs.scope(process.env.RUN_ID!).task(process.env.TASK_ID!).result({ timeoutMs: 30_000 });\n"
            "const verdict = await group.accept(process.env.TASK_ID!);\n"
            "console.log(JSON.stringify({ outcome: result.outcome, groupState: verdict.groupState, by: verdict.verdictBy }));\n"
        )
        (procs.project / "samples" / "judge.ts").write_text(judge)
        env = ts_env(dev_node, space, RUN_ID=run.id, GROUP_ID=group.id, TASK_ID=ticket.id)
        judged = last_json(output(procs.tsx("judge.ts", env)))
        assert judged == {"outcome": {"good": True}, "groupState": "FINALIZED", "by": "typescript-reviewer"}
        decision = group.wait(timeout_ms=30_000)
        assert (decision["outcome"], decision["outcomeReason"]) == ("SUCCESS", "first_accepted")
        assert decision["members"][0]["verdictBy"] == "typescript-reviewer"


# -- TLS --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    made = make_ca(tmp_path_factory.mktemp("ts-ca") / "tls")
    sign_server_certificate(made, "expired", ["localhost", "127.0.0.1"], expired=True)
    return made


def tls_env(node: DevNode, ca: Path | None, *, client: Path | None = None, **extra: str) -> dict[str, str]:
    env = ts_env(node, "default", **extra)
    for name in ("RUNSTATE_CA_FILE", "RUNSTATE_CLIENT_CERT", "RUNSTATE_CLIENT_KEY"):
        env.pop(name, None)
    if ca is not None:
        env["RUNSTATE_CA_FILE"] = str(ca / "ca.pem")
    if client is not None:
        env["RUNSTATE_CLIENT_CERT"], env["RUNSTATE_CLIENT_KEY"] = str(client / "client.pem"), str(client / "client.key")
    return env


def test_quickstart_typescript_over_https_with_the_ca_from_the_environment(
    tmp_path: Path, tls_ca: Path, procs: Processes,
) -> None:
    with https_node(tmp_path / "data", tls_ca) as node:
        env = tls_env(node, tls_ca)
        producer = procs.tsx("quickstart/producer.ts", env)
        run_id = read_line(producer, "RUNSTATE_SCOPE_ID=").split("=", 1)[1]
        worker = procs.tsx("quickstart/worker.ts", {**env, "RUNSTATE_SCOPE_ID": run_id})
        assert read_line(producer, "SUCCEEDED") == "SUCCEEDED { doubled: 42 }"
        assert producer.wait(PROCESS_TIMEOUT_S) == 0
        assert read_line(worker, "completed").endswith("(attempt 1)")


@pytest.mark.skipif(sys.version_info < PYTHON_WITH_THIS_PROTOCOL, reason="a node on Python 3.10 sends no TLS alert")
def test_typescript_tls_options_mutual_tls_and_each_refusal(tmp_path: Path, tls_ca: Path, procs: Processes) -> None:
    other = make_ca(tmp_path / "other")
    with https_node(tmp_path / "mutual", tls_ca, client_ca=tls_ca) as mutual, \
            https_node(tmp_path / "expired", tls_ca, cert="expired", health=unverified_context()) as expired:
        def calls(node: DevNode, ca: Path | None, **extra: str) -> list[dict[str, object]]:
            report = last_json(output(procs.tsx("node/tls_calls.ts", tls_env(node, ca, **extra))))
            return report["calls"]  # type: ignore[return-value]

        assert calls(mutual, tls_ca, client=tls_ca) == [{"run": True}] * 2  # from the environment
        options = {"caFile": str(tls_ca / "ca.pem"), "clientCert": str(tls_ca / "client.pem"), "clientKey": str(tls_ca / "client.key")}
        # Options win over the variables (which name a file that is not there).
        assert calls(mutual, tmp_path / "missing", TLS_OPTIONS=json.dumps(options)) == [{"run": True}] * 2
        refusals = {
            "node's CAs": (calls(mutual, None), "certificate does not verify"),
            "another CA": (calls(mutual, other, client=tls_ca), "certificate does not verify"),
            "expired": (calls(expired, tls_ca), "CERT_HAS_EXPIRED"),
            "no client certificate": (calls(mutual, tls_ca), "refused the TLS handshake (TLSV13_ALERT_CERTIFICATE_REQUIRED)"),
            "another CA's client certificate": (calls(mutual, tls_ca, client=other), "refused the TLS handshake"),
        }
        for case, (seen, says) in refusals.items():
            url = expired.url if case == "expired" else mutual.url
            for call in seen:  # each call: at once, not retried into UnavailableError
                assert call["error"] == "TlsError" and call["code"] == "TLS_FAILED" and call["url"] == url, (case, call)
                assert says in str(call["reason"]), (case, call)
        made = last_json(output(procs.tsx("node/tls_calls.ts", tls_env(mutual, tmp_path / "missing"))))
        assert made["config"] is True and f"cannot read caFile {tmp_path / 'missing' / 'ca.pem'}" in str(made["made"]), made
