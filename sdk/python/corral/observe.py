"""Sandbox statistics and the lifecycle event stream (corral.v1.ObserveService).

:meth:`AsyncClient.stats` reads sandboxes' CPU, memory, disk, PIDs and
network figures; :meth:`AsyncClient.events` iterates lifecycle events
(created, started, paused, resumed, checkpointed, oom_killed,
exec_timed_out, idle_stopped, lifetime_reached, stopped, degraded,
network_refused, deleted), resumable from a sequence number.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

__all__ = ["Event", "StatsSample", "SandboxStats", "EVENT_TYPES"]

_SVC = "/corral.v1.ObserveService/"

EVENT_TYPES = ("created", "started", "paused", "resumed", "checkpointed", "oom_killed", "exec_timed_out",
               "idle_stopped", "lifetime_reached", "stopped", "degraded", "network_refused", "deleted")

# A watch has no natural end: its deadline is far away (the Connect header
# allows up to ten digits of milliseconds).
WATCH_TIMEOUT = 9_000_000.0


@dataclass
class Event:
    """One lifecycle event. ``seq`` grows by one per event on a node and
    survives daemon restarts: pass the last one seen as ``since``."""

    seq: int
    time: str
    type: str
    sandbox_id: str
    node_id: str = ""
    project: str = ""
    backend: str = ""
    labels: Dict[str, str] = field(default_factory=dict)
    reason: str = ""
    figures: Dict[str, float] = field(default_factory=dict)


def event_from_json(d: Dict[str, Any]) -> Event:
    return Event(seq=int(d.get("seq", 0)), time=str(d.get("time", "")), type=str(d.get("type", "")),
                 sandbox_id=str(d.get("sandboxId", "")), node_id=str(d.get("nodeId", "")),
                 project=str(d.get("project", "")), backend=str(d.get("backend", "")),
                 labels=dict(d.get("labels") or {}), reason=str(d.get("reason", "")),
                 figures={k: float(v) for k, v in (d.get("figures") or {}).items()})


@dataclass
class StatsSample:
    """One reading; ``cpu_percent`` is since the previous one (100 = one core)."""

    time: str = ""
    cpu_percent: float = 0.0
    memory_bytes: int = 0
    disk_bytes: int = 0
    pids: int = 0
    net_rx_bytes: int = 0
    net_tx_bytes: int = 0


def _sample(d: Optional[Dict[str, Any]]) -> StatsSample:
    d = d or {}
    return StatsSample(time=str(d.get("time", "")), cpu_percent=float(d.get("cpuPercent", 0)),
                       memory_bytes=int(d.get("memoryBytes", 0)), disk_bytes=int(d.get("diskBytes", 0)),
                       pids=int(d.get("pids", 0)), net_rx_bytes=int(d.get("netRxBytes", 0)),
                       net_tx_bytes=int(d.get("netTxBytes", 0)))


@dataclass
class SandboxStats:
    """A sandbox's figures: ``current`` is read when the call is served;
    ``history`` (oldest first) comes with ``history=True``."""

    id: str
    backend: str
    state: str
    project: str = ""
    current: StatsSample = field(default_factory=StatsSample)
    cpu_limit_millis: int = 0
    memory_limit_bytes: int = 0
    disk_limit_bytes: int = 0
    pids_limit: int = 0
    labels: Dict[str, str] = field(default_factory=dict)
    history: List[StatsSample] = field(default_factory=list)


def stats_from_json(d: Dict[str, Any]) -> List[SandboxStats]:
    return [SandboxStats(id=str(s.get("id", "")), backend=str(s.get("backend", "")), state=str(s.get("state", "")),
                         project=str(s.get("project", "")), current=_sample(s.get("current")),
                         cpu_limit_millis=int(s.get("cpuLimitMillis", 0)),
                         memory_limit_bytes=int(s.get("memoryLimitBytes", 0)),
                         disk_limit_bytes=int(s.get("diskLimitBytes", 0)), pids_limit=int(s.get("pidsLimit", 0)),
                         labels=dict(s.get("labels") or {}), history=[_sample(h) for h in s.get("history") or []])
            for s in d.get("sandboxes") or []]


def watch_request(since: Optional[int], project: str, labels: Optional[Dict[str, str]],
                  sandbox_ids: Optional[List[str]], types: Optional[List[str]]) -> Dict[str, Any]:
    """The WatchEvents request; unknown types fail here, naming the field."""
    req: Dict[str, Any] = {}
    if since is not None:
        if int(since) < 0:
            raise ValueError(f"since must be a sequence number (>= 0), got {since!r}")
        req["sinceSeq"] = str(int(since))
    if project:
        req["project"] = project
    if labels:
        req["labels"] = dict(labels)
    if sandbox_ids:
        req["sandboxIds"] = list(sandbox_ids)
    for i, t in enumerate(types or []):
        if t not in EVENT_TYPES:
            raise ValueError(f"types[{i}]: unknown event type {t!r} (known: {', '.join(EVENT_TYPES)})")
    if types:
        req["types"] = list(types)
    return req
