"""Types of the stateful-rollout calls: durable snapshots, forks and the vm
backend's live-view grant (see docs/rollouts.md). The calls themselves are
methods of :class:`AsyncClient` and :class:`AsyncSandbox`."""

import datetime as _dt
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .errors import CorralError, InternalError
from .types import SandboxInfo, parse_timestamp

__all__ = ["Snapshot", "ForkOutcome", "ForkResult", "LiveView"]


@dataclass(frozen=True)
class Snapshot:
    """A saved state of a sandbox (memory, devices and writable disk) on its
    node, restorable into new sandboxes until deleted; it survives a daemon
    kill and restart."""

    id: str
    sandbox_id: str
    backend: str
    project: str
    bytes: int  # on the node's disk
    created: Optional[_dt.datetime]

    @classmethod
    def _from_json(cls, d: Optional[Dict[str, Any]]) -> "Snapshot":
        d = d or {}
        return cls(id=d.get("id", ""), sandbox_id=d.get("sandboxId", ""), backend=d.get("backend", ""),
                   project=d.get("project", ""), bytes=int(d.get("bytes", 0)),
                   created=parse_timestamp(d.get("created")))


@dataclass
class ForkOutcome:
    """One fork: its sandbox handle and description, or why it was not made
    (``error``, an :class:`InternalError` carrying the server's reason, as
    the Go SDK reports it)."""

    sandbox: Any = None  # AsyncSandbox, or Sandbox from the blocking client
    info: Optional[SandboxInfo] = None
    error: Optional[CorralError] = None

    @property
    def ok(self) -> bool:
        """Whether the fork was made."""
        return self.error is None


@dataclass
class ForkResult:
    """What ``fork`` made: one :class:`ForkOutcome` per fork asked for, in
    order. ``processes_carried`` says whether the forks continue the
    parent's processes (microVMs) or only its files (containers, whose
    forks start from ``image``, the packed composition); ``snapshot`` is the
    snapshot microVM forks were restored from (removed once they were made)."""

    image: str = ""
    snapshot: str = ""
    processes_carried: bool = False
    forks: List[ForkOutcome] = field(default_factory=list)

    @property
    def failures(self) -> List[CorralError]:
        """The errors of the forks that were not made."""
        return [f.error for f in self.forks if f.error is not None]


def fork_outcomes(d: Dict[str, Any], handle: Any) -> ForkResult:
    """A ForkResponse as a ForkResult; handle(id, info) makes a fork's handle."""
    out = ForkResult(image=d.get("image", ""), snapshot=d.get("snapshotId", ""),
                     processes_carried=bool(d.get("processesCarried", False)))
    for f in d.get("forks", []):
        if not f.get("sandbox"):
            out.forks.append(ForkOutcome(error=InternalError(f.get("error", "") or "fork not made")))
            continue
        info = SandboxInfo._from_json(f["sandbox"])
        out.forks.append(ForkOutcome(sandbox=handle(info.id, info), info=info))
    return out


@dataclass(frozen=True)
class LiveView:
    """A one-time grant to watch and drive a vm sandbox's screen as VNC
    (RFB) over a websocket on the server's API listener: ``path`` on that
    listener with ``token`` as its query (:attr:`url_path`), usable for one
    connection until ``expires``."""

    path: str
    token: str
    expires: Optional[_dt.datetime]

    @property
    def url_path(self) -> str:
        """The path with the token as its query: append it to the server's
        address with scheme ``ws://`` (``wss://`` with TLS)."""
        return self.path + "?token=" + urllib.parse.quote(self.token, safe="")

    def url(self, base: str) -> str:
        """The websocket URL on a server at ``base`` (``http://host:port``,
        ``https://host:port`` or ``host:port``)."""
        if base.startswith("unix:") or base.startswith("/"):
            raise ValueError("live view: a unix socket address has no websocket URL; use the TCP listener")
        if base.startswith("https://"):
            return "wss://" + base[len("https://"):].rstrip("/") + self.url_path
        return "ws://" + base.removeprefix("http://").rstrip("/") + self.url_path

    @classmethod
    def _from_json(cls, d: Dict[str, Any]) -> "LiveView":
        exp = int(d.get("expiresUnix", 0))
        return cls(path=d.get("path", ""), token=d.get("token", ""),
                   expires=_dt.datetime.fromtimestamp(exp, _dt.timezone.utc) if exp else None)
