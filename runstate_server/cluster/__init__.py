"""Replication: the pysyncobj-backed log that every state change goes through."""

from runstate_server.cluster.config import LogConfig
from runstate_server.cluster.errors import LogUnavailable, NotLeader
from runstate_server.cluster.log import ReplicatedLog, StateMachine

__all__ = ["LogConfig", "LogUnavailable", "NotLeader", "ReplicatedLog", "StateMachine"]
