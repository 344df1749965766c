"""The generated `approvals.v1` modules, for code that talks to the other services (an approver
UI in Python, an admin script): `from approval_broker.proto import approver_pb2, approver_pb2_grpc`."""

from ._pb.approvals.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    agent_pb2,
    agent_pb2_grpc,
    approver_pb2,
    approver_pb2_grpc,
    types_pb2,
)

__all__ = [
    "admin_pb2",
    "admin_pb2_grpc",
    "agent_pb2",
    "agent_pb2_grpc",
    "approver_pb2",
    "approver_pb2_grpc",
    "types_pb2",
]
