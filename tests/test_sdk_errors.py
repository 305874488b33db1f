"""Error mapping: every code of the HTTP API to one SDK class; unknown codes fall back by status."""

from __future__ import annotations

import importlib.metadata
import pickle

import pytest
import runstate
from runstate.sdk.errors import error_from_response

CASES = [
    (400, "VALIDATION_FAILED", runstate.ValidationError),
    (401, "UNAUTHENTICATED", runstate.UnauthenticatedError),
    (403, "FORBIDDEN", runstate.ForbiddenError),
    (404, "NOT_FOUND", runstate.NotFoundError),
    (409, "CONFLICT", runstate.ConflictError),
    (409, "SCOPE_CANCELLED", runstate.ScopeCancelledError),
    (409, "DEADLINE_EXCEEDED", runstate.DeadlineExceededError),
    (409, "STALE_CLAIM", runstate.LeaseLostError),
    (409, "CLAIM_HELD", runstate.ClaimHeldError),
    (409, "KEY_CONFLICT", runstate.KeyConflictError),
    (409, "LIMIT_EXCEEDED", runstate.LimitExceededError),
    (409, "BARRIER_CANCELLED", runstate.ConflictError),
    (409, "BARRIER_RELEASED", runstate.ConflictError),
    (400, "VALIDATION_FAILED", runstate.ValidationError),
    (503, "UNAVAILABLE", runstate.UnavailableError),
]


@pytest.mark.parametrize(("status", "code", "cls"), CASES)
def test_every_code_maps_to_its_class(status: int, code: str, cls: type[runstate.RunstateError]) -> None:
    error = error_from_response(status, code, "it went wrong")
    assert type(error) is cls
    assert isinstance(error, runstate.RunstateError)
    assert (error.status, error.code, error.message) == (status, code, "it went wrong")
    assert code in str(error) and "it went wrong" in str(error) and str(status) in str(error)
    assert cls.__name__ in repr(error)


@pytest.mark.parametrize(
    "cls",
    [
        runstate.ScopeCancelledError,
        runstate.DeadlineExceededError,
        runstate.LeaseLostError,
        runstate.KeyConflictError,
        runstate.LimitExceededError,
    ],
)
def test_specific_conflicts_are_conflicts(cls: type[runstate.RunstateError]) -> None:
    assert issubclass(cls, runstate.ConflictError)
    assert cls("x").status == 409


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, runstate.ValidationError),
        (401, runstate.UnauthenticatedError),
        (403, runstate.ForbiddenError),
        (404, runstate.NotFoundError),
        (409, runstate.ConflictError),
        (413, runstate.RunstateError),
        (503, runstate.UnavailableError),
        (500, runstate.RunstateError),
        (418, runstate.RunstateError),
    ],
)
def test_unknown_code_falls_back_by_status(status: int, cls: type[runstate.RunstateError]) -> None:
    error = error_from_response(status, "SOMETHING_NEW", "m")
    assert type(error) is cls
    assert error.code == "SOMETHING_NEW"
    assert error.status == status


def test_missing_code_and_message() -> None:
    error = error_from_response(404, None, None)
    assert type(error) is runstate.NotFoundError
    assert error.code == "NOT_FOUND"
    assert error.message == "HTTP 404"
    assert error_from_response(500, None, "boom").code == "INTERNAL"


def test_config_error_is_local_validation() -> None:
    error = runstate.ConfigError("bad argument")
    assert isinstance(error, runstate.ValidationError)
    assert error.code == "VALIDATION_FAILED"
    assert error.status is None
    assert str(error) == "VALIDATION_FAILED: bad argument"


def test_sdk_own_errors() -> None:
    timeout = runstate.ResultTimeoutError("tsk_1", 250, "QUEUED")
    assert "tsk_1" in str(timeout) and "250 ms" in str(timeout)
    assert (timeout.task_id, timeout.timeout_ms, timeout.state, timeout.status) == (
        "tsk_1",
        250,
        "QUEUED",
        None,
    )
    assert runstate.UnavailableError("down", status=None).status is None
    assert runstate.TaskFailedError("failed", attempts=3).attempts == 3
    assert runstate.OnceFailedError("failed", attempts=2, key="k").attempts == 2


def test_errors_pickle_with_their_fields() -> None:
    for error in (
        error_from_response(409, "STALE_CLAIM", "gone"),
        runstate.ResultTimeoutError("tsk_1", 10),
        runstate.TaskFailedError("failed", attempts=3, task_id="tsk_2"),
    ):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error)
        assert copy.__dict__ == error.__dict__
        assert str(copy) == str(error)


def test_every_error_class_is_exported() -> None:
    for name in (
        "RunstateError NotFoundError ValidationError ConfigError UnauthenticatedError ForbiddenError "
        "ConflictError ScopeCancelledError DeadlineExceededError LeaseLostError KeyConflictError "
        "LimitExceededError ResultTooLargeError UnavailableError ResultTimeoutError TaskFailedError "
        "OnceFailedError"
    ).split():
        assert name in runstate.__all__
        assert issubclass(getattr(runstate, name), runstate.RunstateError)
    assert runstate.__version__ == importlib.metadata.version("runstate-sdk")
