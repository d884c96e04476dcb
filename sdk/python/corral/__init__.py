"""corral's Python SDK: sandboxes for RL agents, from asyncio or blocking code.

Standard library only. It speaks ConnectRPC's JSON protocol to a corral
server over its unix socket or TCP::

    import asyncio, corral

    async def main():
        async with corral.AsyncClient("http://127.0.0.1:7070", token=TOKEN) as c:
            async with c.sandbox(image="busybox", memory_mb=64) as sb:
                r = await sb.run("echo hello")
                print(r.exit_code, r.text)

    asyncio.run(main())

The blocking :class:`Client` has the same methods without ``await``.
"""

from .client import AsyncClient
from .errors import (
    AlreadyExistsError,
    CanceledError,
    CorralError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
)
from .fncall import CallResult
from .iam import AuditEntry, Identity, Project, Quota, Token, Usage
from .images import BuiltImage, Composition, Images, Imported, ImportProgress, LazyBlob, Layer, Packed, Removed
from .network import Network, NetworkRefusal, NetworkStats
from .observe import EVENT_TYPES, Event, SandboxStats, StatsSample
from .rollout import ForkOutcome, ForkResult, LiveView, Snapshot
from .sandbox import AsyncFiles, AsyncSandbox, Command, ExecStream, exec_key
from ._websocket import LiveViewConnection
from .sync import Client, Files, Sandbox, SyncExecStream, SyncLiveView
from .types import BulkResult, ExecChunk, ExecLogEntry, ExecResult, FileInfo, Resources, SandboxInfo, State

__version__ = "0.1.0"

DEFAULT_ADDRESS = "unix:///var/lib/corral/corral.sock"

__all__ = [
    "AsyncClient", "AsyncSandbox", "AsyncFiles", "ExecStream", "Command", "exec_key", "ExecLogEntry", "BulkResult",
    "Snapshot", "ForkResult", "ForkOutcome", "LiveView", "LiveViewConnection", "SyncLiveView",
    "Client", "Sandbox", "Files", "SyncExecStream",
    "AuditEntry", "Identity", "Project", "Quota", "Token", "Usage",
    "CallResult", "Composition", "Images", "Layer", "Packed", "Removed",
    "BuiltImage", "Imported", "ImportProgress", "LazyBlob", "Network", "NetworkRefusal", "NetworkStats", "ExecChunk", "ExecResult", "FileInfo", "Resources", "SandboxInfo", "State",
    "CorralError", "InvalidArgumentError", "NotFoundError", "AlreadyExistsError",
    "FailedPreconditionError", "ResourceExhaustedError", "UnavailableError",
    "PermissionDeniedError", "UnauthenticatedError", "UnimplementedError",
    "DeadlineExceededError", "CanceledError", "InternalError",
    "Event", "SandboxStats", "StatsSample", "EVENT_TYPES",
    "DEFAULT_ADDRESS", "__version__",
]
