"""Replication: the pysyncobj-backed log that every state change goes through."""

from runstate.cluster.config import LogConfig
from runstate.cluster.errors import LogUnavailable, NotLeader
from runstate.cluster.log import ReplicatedLog, StateMachine

__all__ = ["LogConfig", "LogUnavailable", "NotLeader", "ReplicatedLog", "StateMachine"]
