"""The OpenAPI document against the node that serves it: schemathesis generates requests from it
(valid and invalid ones, and sequences of calls) and checks that no answer is a server error and
every answer has a documented status, content type, headers and body schema.

Short form by default (RUNSTATE_FUZZ_EXAMPLES=10 examples per operation); the long form raises it,
e.g. `RUNSTATE_FUZZ_EXAMPLES=200 .venv/bin/python -m pytest tests/test_openapi_fuzz.py`."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests._nodes import read_bootstrap_key

EXAMPLES = int(os.environ.get("RUNSTATE_FUZZ_EXAMPLES", "10"))
FUZZ_TIMEOUT_S = 900
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
)
# Revoking would revoke the very key the run uses (covered by its own tests).
EXCLUDED_PATHS = r"/revoke$"
# A long poll would hold each generated request for its wait: the document the run uses allows
# only 0 (the routes are fuzzed all the same; parking is covered by test_node_long_polls.py).
WAIT_FIELDS = ("waitMs", "waitSeconds")

pytestmark = pytest.mark.slow


def in_one_space(document: dict[str, Any], space: str) -> dict[str, Any]:
    """The document with every `{spaceId}` fixed to `space` (the key's): requests in another space
    are only ever 403, which would hide everything else."""
    for operations in document["paths"].values():
        for operation in operations.values():
            for parameter in operation["parameters"]:
                if parameter["name"] == "spaceId":
                    parameter["schema"] = {"type": "string", "enum": [space]}
    return document


def without_waits(document: dict[str, Any]) -> dict[str, Any]:
    """The document with every wait (a query parameter or a body field) at most 0."""

    def clamp(schema: Any) -> None:
        if isinstance(schema, dict):
            for name in WAIT_FIELDS:
                if isinstance(schema.get("properties"), dict) and name in schema["properties"]:
                    schema["properties"][name] = {**schema["properties"][name], "maximum": 0}
            for value in schema.values():
                clamp(value)
        elif isinstance(schema, list):
            for value in schema:
                clamp(value)

    for operations in document["paths"].values():
        for operation in operations.values():
            for parameter in operation["parameters"]:
                if parameter["name"] in WAIT_FIELDS:
                    parameter["schema"] = {**parameter["schema"], "maximum": 0}
            clamp(operation.get("requestBody"))
    return document


def test_the_fuzzed_document_waits_nowhere(dev_node: Any) -> None:
    with urllib.request.urlopen(f"{dev_node.url}/v1/openapi.json", timeout=30) as answer:
        served = json.loads(answer.read())
    original = wait_schemas(copy.deepcopy(served["paths"]))
    waits = wait_schemas(without_waits(served)["paths"])
    assert len(waits) == len(original) >= 5  # the long polls are in the run, every wait held to 0
    assert all(wait["maximum"] == 0 for wait in waits), waits
    assert any(wait.get("maximum", 1) > 0 for wait in original)


def wait_schemas(node: Any) -> list[dict[str, Any]]:
    """The schemas of every wait field (query parameter or body property) under `node`."""
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        if node.get("in") == "query" and node.get("name") in WAIT_FIELDS:
            found.append(node["schema"])
        for name, value in node.items():
            if name == "properties" and isinstance(value, dict):
                found.extend(value[field] for field in WAIT_FIELDS if field in value)
            found.extend(wait_schemas(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(wait_schemas(value))
    return found


def test_schemathesis_finds_no_server_error_and_no_undocumented_answer(node_factory: Any, tmp_path: Path) -> None:
    node = node_factory("--auth").start()
    key = read_bootstrap_key(node)
    with urllib.request.urlopen(f"{node.url}/v1/openapi.json", timeout=30) as answer:
        document = json.loads(answer.read())
    schema_file = tmp_path / "openapi.json"
    schema_file.write_text(json.dumps(without_waits(in_one_space(document, "default"))))
    command = [
        sys.executable, "-m", "schemathesis.cli", "run", str(schema_file), "--url", node.url,
        "-H", f"Authorization: Bearer {key}", "--checks", ",".join(CHECKS),
        "--phases", "examples,coverage,fuzzing,stateful", "--max-examples", str(EXAMPLES), "--workers", "1",
        "--request-timeout", "20", "--generation-database", "none", "--generation-with-security-parameters", "false",
        "--exclude-path-regex", EXCLUDED_PATHS, "--no-color",
    ]
    finished = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=FUZZ_TIMEOUT_S)
    assert finished.returncode == 0, finished.stdout[-20_000:] + finished.stderr[-5_000:]
    assert "Tested:" in finished.stdout  # it ran the operations, not nothing


# Operations whose refusals hang on a rule no request schema can state (issue 39, item 6): the
# node's state, a value it made, its clock, or a relation between fields. Their schemas declare
# everything else; docs/http-api.md names these rules on each operation's page. Left out of the
# positive-data check below, each with its rule.
_CURSOR = "cursor: only one an answer named (nextCursor)"
_EVENT_CURSOR = "cursor: only one an answer named, of this space's log"
_UNITS = "units: at most what the resource holds now"
_DEADLINE = "deadline: in the future, at most deadline_ms_max ahead of the node's clock"
_JOB = _DEADLINE + "; requirements: each within its resource now, pools' units summed at most needs_slots_max"
_AT = "at: at most timer_ms_max after the node's now"
NOT_IN_THE_SCHEMA: dict[tuple[str, str], str] = {
    ("get", "/v1/spaces/{spaceId}/barriers"): _CURSOR,
    ("get", "/v1/spaces/{spaceId}/scopes"): _CURSOR,
    ("get", "/v1/spaces/{spaceId}/task-groups"): _CURSOR,
    ("get", "/v1/spaces/{spaceId}/tasks"): _CURSOR,
    ("get", "/v1/spaces/{spaceId}/timers"): _CURSOR,
    ("get", "/v1/spaces/{spaceId}/events"): _EVENT_CURSOR,
    ("get", "/v1/spaces/{spaceId}/watch"): _EVENT_CURSOR,
    ("post", "/v1/spaces/{spaceId}/allowances/{allowanceId}/consume"): _UNITS,
    ("post", "/v1/spaces/{spaceId}/allowances/{allowanceId}/wait"): _UNITS,
    ("post", "/v1/spaces/{spaceId}/permits/{permitId}/acquire"): _UNITS,
    ("post", "/v1/spaces/{spaceId}/permits/{permitId}/wait"): _UNITS,
    ("post", "/v1/spaces/{spaceId}/scopes"): _DEADLINE,
    ("put", "/v1/spaces/{spaceId}/runs/{name}"): _DEADLINE,
    ("post", "/v1/spaces/{spaceId}/task-groups"): _DEADLINE + "; threshold: only for N_ACCEPTED, at most expectedMembers",
    ("post", "/v1/spaces/{spaceId}/task-groups/{groupId}/tasks"): _JOB,
    ("post", "/v1/spaces/{spaceId}/tasks"): _JOB,
    ("post", "/v1/spaces/{spaceId}/tasks/batch"): _JOB,
    ("put", "/v1/spaces/{spaceId}/mailboxes/by-name/{name}"): "requirements: pools' units summed at most needs_slots_max",
    ("post", "/v1/spaces/{spaceId}/timers"): _AT,
    ("put", "/v1/spaces/{spaceId}/timers/by-name/{name}"): _AT,
}
# Every answer but 400 VALIDATION_FAILED (and a server error) is one a schema-valid request may get:
# an unknown id, a conflict with the state, a permission the key lacks.
ACCEPTED_STATUSES = ("2xx", "401", "403", "404", "405", "408", "409", "410", "413", "415", "429", "503")


def declared_only(document: dict[str, Any]) -> dict[str, Any]:
    """The document without the operations of NOT_IN_THE_SCHEMA."""
    for path, operations in document["paths"].items():
        for method in [method for method in operations if (method, path) in NOT_IN_THE_SCHEMA]:
            del operations[method]
    document["paths"] = {path: operations for path, operations in document["paths"].items() if operations}
    return document


def test_a_request_its_schema_calls_valid_is_not_refused_as_invalid(node_factory: Any, tmp_path: Path) -> None:
    """schemathesis's positive_data_acceptance: requests generated valid by the document's request
    schemas (required fields, types, lengths, bounds) are never 400. Before issue 39 the schemas
    declared no required field and no bound, and 68 operations refused requests they called valid."""
    node = node_factory("--auth").start()
    key = read_bootstrap_key(node)
    with urllib.request.urlopen(f"{node.url}/v1/openapi.json", timeout=30) as answer:
        document = json.loads(answer.read())
    served = {(method, path) for path, operations in document["paths"].items() for method in operations}
    assert set(NOT_IN_THE_SCHEMA) <= served  # no entry outlives its operation
    covered = declared_only(without_waits(in_one_space(document, "default")))
    assert len([op for operations in covered["paths"].values() for op in operations]) >= 87
    schema_file = tmp_path / "openapi.json"
    schema_file.write_text(json.dumps(covered))
    config_file = tmp_path / "schemathesis.toml"
    config_file.write_text(
        "[checks.positive_data_acceptance]\nexpected-statuses = [" + ", ".join(f'"{status}"' for status in ACCEPTED_STATUSES) + "]\n"
    )
    command = [
        sys.executable, "-m", "schemathesis.cli", "--config-file", str(config_file), "run", str(schema_file),
        "--url", node.url, "-H", f"Authorization: Bearer {key}", "--checks", "positive_data_acceptance",
        "--mode", "positive", "--phases", "examples,coverage,fuzzing", "--max-examples", str(EXAMPLES),
        "--workers", "1", "--request-timeout", "20", "--generation-database", "none",
        "--generation-with-security-parameters", "false", "--exclude-path-regex", EXCLUDED_PATHS, "--no-color",
    ]
    finished = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=FUZZ_TIMEOUT_S)
    assert finished.returncode == 0, finished.stdout[-20_000:] + finished.stderr[-5_000:]
    assert "Tested:" in finished.stdout


def test_every_route_with_a_path_parameter_documents_404_and_a_newline_key_is_a_key(dev_node: Any) -> None:
    """Found by the long form: a newline in a claim's key matched no route (an undocumented 404).
    Every route with a parameter in its path now documents 404, and a claim's key may hold a
    newline like any other character (the route asks for the token, not "no route")."""
    from runstate_server.node.api.app import ROUTES
    from runstate_server.node.api.openapi import document
    from tests._http import call

    for path, operations in document(ROUTES)["paths"].items():
        for method, operation in operations.items():
            if "{" in path:
                assert "404" in operation["responses"], (method, path)
    status, answer = call(dev_node.url, "POST", "/v1/spaces/default/claims/a%0Ab/release", {})
    assert (status, answer["error"]["code"]) == (400, "VALIDATION_FAILED"), answer
    assert "token" in answer["error"]["message"]
