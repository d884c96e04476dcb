"""Plain Python types of the corral API (no transport types leak out).

Durations are float seconds, timestamps timezone-aware ``datetime`` objects,
byte fields ``bytes``. The ``_from_json`` constructors read the protobuf JSON
mapping the server speaks (lowerCamelCase names, int64 as strings, omitted
fields meaning zero values).
"""

import base64
import datetime as _dt
import enum
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from .network import Network

__all__ = ["State", "Resources", "SandboxInfo", "ExecResult", "ExecChunk", "FileInfo"]

_MIB = 1 << 20


class State(str, enum.Enum):
    """A sandbox's lifecycle state."""

    UNSPECIFIED = "unspecified"  # being created
    RUNNING = "running"
    PAUSED = "paused"
    STOPPED = "stopped"

    @property
    def proto(self) -> str:
        """The protobuf enum name, e.g. ``SANDBOX_STATE_RUNNING``."""
        return "SANDBOX_STATE_" + self.name

    @classmethod
    def _from_json(cls, v: Any) -> "State":
        if isinstance(v, int):
            return list(cls)[v] if 0 <= v < len(cls) else cls.UNSPECIFIED
        name = str(v or "").replace("SANDBOX_STATE_", "")
        return cls.__members__.get(name, cls.UNSPECIFIED)


@dataclass(frozen=True)
class Resources:
    """A sandbox's limits, as the server applied them."""

    cpu: int = 0  # millicores; 1000 = one core
    memory_bytes: int = 0
    disk_bytes: int = 0
    pids: int = 0

    @property
    def memory_mb(self) -> float:
        """Memory limit in MiB."""
        return self.memory_bytes / _MIB

    @property
    def disk_mb(self) -> float:
        """Writable layer size in MiB."""
        return self.disk_bytes / _MIB

    @classmethod
    def _from_json(cls, d: Optional[Dict[str, Any]]) -> "Resources":
        d = d or {}
        return cls(
            cpu=int(d.get("cpuMillis", 0)),
            memory_bytes=int(d.get("memoryBytes", 0)),
            disk_bytes=int(d.get("diskBytes", 0)),
            pids=int(d.get("pids", 0)),
        )


@dataclass(frozen=True)
class SandboxInfo:
    """A description of one sandbox (from ``create``, ``get`` or ``list``)."""

    id: str
    node_id: str
    backend: str
    image: str
    state: State
    resources: Resources
    env: Dict[str, str]
    workdir: str
    user: str
    labels: Dict[str, str]
    idle_timeout: float  # seconds; 0 = never
    max_lifetime: float  # seconds
    created_at: Optional[_dt.datetime]
    last_active_at: Optional[_dt.datetime]
    stop_reason: str  # why it stopped, when state is STOPPED
    project: str = ""  # its project ("": the node administrator's)
    network: Network = Network()  # its network policy (default none: loopback only)
    # Why a layer cannot be read (its blob store is unreachable; reads of
    # unfetched files fail with EIO); empty when healthy.
    degraded: str = ""
    # The node a migration moves it to, while its own node has it fenced
    # (paused; other calls fail ``unavailable``: retry); empty otherwise.
    migrating_to: str = ""

    @classmethod
    def _from_json(cls, d: Dict[str, Any]) -> "SandboxInfo":
        env = {}
        for kv in d.get("env", []):
            k, _, v = kv.partition("=")
            env[k] = v
        return cls(
            id=d.get("id", ""),
            node_id=d.get("nodeId", ""),
            backend=d.get("backend", ""),
            image=d.get("image", ""),
            state=State._from_json(d.get("state")),
            resources=Resources._from_json(d.get("resources")),
            env=env,
            workdir=d.get("workdir", ""),
            user=d.get("user", ""),
            labels=dict(d.get("labels", {})),
            idle_timeout=parse_duration(d.get("idleTimeout")),
            max_lifetime=parse_duration(d.get("maxLifetime")),
            created_at=parse_timestamp(d.get("createdAt")),
            last_active_at=parse_timestamp(d.get("lastActiveAt")),
            stop_reason=d.get("stopReason", ""),
            project=d.get("project", ""),
            network=Network._from_json(d.get("network")),
            degraded=d.get("degraded", ""),
            migrating_to=d.get("migratingTo", ""),
        )


@dataclass
class ExecResult:
    """How a command ended, with its output (``run``) or without (streams).

    ``exit_code`` is -1 when a signal killed the process (see ``signal``).
    ``truncated`` means the output passed the limit and the rest was dropped.
    """

    exit_code: int = 0
    signal: int = 0
    timed_out: bool = False
    oom_killed: bool = False
    truncated: bool = False
    duration: float = 0.0  # seconds
    stdout: bytes = b""
    stderr: bytes = b""
    # The command's number in the sandbox's exec log (0: no idempotency key);
    # replayed: it did not run for this call (a recorded result, or one this
    # call attached to); replay_output_truncated: the log kept only its first MiB.
    exec_seq: int = 0
    replayed: bool = False
    replay_output_truncated: bool = False

    @property
    def ok(self) -> bool:
        """True when the command exited 0 (not killed, not timed out)."""
        return self.exit_code == 0 and self.signal == 0 and not self.timed_out

    @property
    def text(self) -> str:
        """stdout decoded as UTF-8 (invalid bytes replaced)."""
        return self.stdout.decode("utf-8", "replace")

    @property
    def stdout_text(self) -> str:
        """stdout decoded as UTF-8 (invalid bytes replaced)."""
        return self.text

    @property
    def stderr_text(self) -> str:
        """stderr decoded as UTF-8 (invalid bytes replaced)."""
        return self.stderr.decode("utf-8", "replace")

    @classmethod
    def _from_json(cls, d: Optional[Dict[str, Any]], stdout: bytes = b"", stderr: bytes = b"") -> "ExecResult":
        d = d or {}
        return cls(
            exit_code=int(d.get("exitCode", 0)),
            signal=int(d.get("signal", 0)),
            timed_out=bool(d.get("timedOut", False)),
            oom_killed=bool(d.get("oomKilled", False)),
            truncated=bool(d.get("truncated", False)),
            duration=parse_duration(d.get("duration")),
            stdout=stdout,
            stderr=stderr,
            exec_seq=int(d.get("execSeq", 0)),
            replayed=bool(d.get("replayed", False)),
            replay_output_truncated=bool(d.get("replayOutputTruncated", False)),
        )


@dataclass
class ExecLogEntry:
    """One command of a sandbox's exec log (see ``AsyncSandbox.list_execs``).

    ``state`` is ``running``, ``done``, ``failed`` (``error`` says why) or
    ``lost`` (the node restarted while it ran: outcome unknown); ``result``
    is set when done, without output (repeat the key to get it).
    """

    seq: int
    idempotency_key: str
    argv: List[str]
    shell: bool
    state: str
    result: Optional[ExecResult]
    error: str
    output_bytes: int
    output_kept_bytes: int

    @classmethod
    def _from_json(cls, d: Dict[str, Any]) -> "ExecLogEntry":
        state = str(d.get("state", "EXEC_STATE_UNSPECIFIED")).removeprefix("EXEC_STATE_").lower()
        return cls(
            seq=int(d.get("seq", 0)),
            idempotency_key=d.get("idempotencyKey", ""),
            argv=list(d.get("argv", [])),
            shell=bool(d.get("shell", False)),
            state=state,
            result=ExecResult._from_json(d["result"]) if "result" in d else None,
            error=d.get("error", ""),
            output_bytes=int(d.get("outputBytes", 0)),
            output_kept_bytes=int(d.get("outputKeptBytes", 0)),
        )


@dataclass
class BulkResult:
    """What ``pause_many`` or ``resume_many`` did.

    ``done`` counts the sandboxes paused (or reclaimed) or resumed;
    ``failures`` maps a sandbox id to why it failed (the others went on);
    ``node_failures`` maps a node id to why it could not be asked (through
    a cluster's control plane: a lost or unreachable node, whose sandboxes
    were left as they were). The resident bytes sum the reclaimed
    sandboxes' memory in RAM before and after (``reclaim=True``).
    """

    done: int
    failures: Dict[str, str]
    node_failures: Dict[str, str]
    resident_before_bytes: int = 0
    resident_after_bytes: int = 0

    @classmethod
    def _from_json(cls, d: Dict[str, Any], done_key: str) -> "BulkResult":
        return cls(
            done=int(d.get(done_key, 0)),
            failures={f.get("id", ""): f.get("error", "") for f in d.get("failures", [])},
            node_failures={f.get("nodeId", ""): f.get("error", "") for f in d.get("nodeFailures", [])},
            resident_before_bytes=int(d.get("residentBeforeBytes", 0)),
            resident_after_bytes=int(d.get("residentAfterBytes", 0)),
        )


@dataclass
class ExecChunk:
    """One event of ``exec_stream``: output, or the final result.

    ``stream`` is ``"stdout"``, ``"stderr"`` or ``"result"``; for the last,
    ``result`` holds the :class:`ExecResult` (without output) and ``data``
    is empty.
    """

    stream: str
    data: bytes = b""
    result: Optional[ExecResult] = None

    @property
    def text(self) -> str:
        """data decoded as UTF-8 (invalid bytes replaced; a multi-byte
        character split across chunks shows as replacement characters)."""
        return self.data.decode("utf-8", "replace")


@dataclass(frozen=True)
class FileInfo:
    """A file or directory inside a sandbox."""

    name: str
    path: str
    size: int
    mode: int  # permission bits, e.g. 0o644
    is_dir: bool
    is_symlink: bool
    modified_at: Optional[_dt.datetime]
    uid: int
    gid: int

    @classmethod
    def _from_json(cls, d: Optional[Dict[str, Any]]) -> "FileInfo":
        d = d or {}
        return cls(
            name=d.get("name", ""),
            path=d.get("path", ""),
            size=int(d.get("size", 0)),
            mode=int(d.get("mode", 0)),
            is_dir=bool(d.get("isDir", False)),
            is_symlink=bool(d.get("isSymlink", False)),
            modified_at=parse_timestamp(d.get("modifiedAt")),
            uid=int(d.get("uid", 0)),
            gid=int(d.get("gid", 0)),
        )


# --- protobuf JSON mapping helpers -----------------------------------------

_DURATION = re.compile(r"^(-)?(\d+)(?:\.(\d{1,9}))?s$")
_TIMESTAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)$")


def format_duration(seconds: float, what: str = "duration") -> str:
    """Seconds as a protobuf JSON Duration, e.g. 1.5 -> ``"1.500000000s"``."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{what}: want seconds as int or float, got {type(seconds).__name__}")
    if seconds < 0 or seconds != seconds or seconds == float("inf"):
        raise ValueError(f"{what}: {seconds!r} must be a finite number of seconds >= 0")
    nanos = int(round(seconds * 1e9))
    whole, frac = divmod(nanos, 1_000_000_000)
    return f"{whole}s" if frac == 0 else f"{whole}.{frac:09d}s"


def parse_duration(v: Any) -> float:
    """A protobuf JSON Duration (``"1.5s"``) as float seconds; None -> 0."""
    if not v:
        return 0.0
    m = _DURATION.match(str(v))
    if not m:
        raise ValueError(f"bad duration {v!r}")
    secs = int(m.group(2)) + (int(m.group(3).ljust(9, "0")) / 1e9 if m.group(3) else 0.0)
    return -secs if m.group(1) else secs


def parse_timestamp(v: Any) -> Optional[_dt.datetime]:
    """An RFC 3339 timestamp as an aware datetime (microseconds); None -> None."""
    if not v:
        return None
    m = _TIMESTAMP.match(str(v))
    if not m:
        raise ValueError(f"bad timestamp {v!r}")
    t = _dt.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")
    if m.group(2):
        t = t.replace(microsecond=int(m.group(2)[:6].ljust(6, "0")))
    zone = m.group(3)
    if zone == "Z":
        tz = _dt.timezone.utc
    else:
        sign = -1 if zone[0] == "-" else 1
        tz = _dt.timezone(sign * _dt.timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6])))
    return t.replace(tzinfo=tz)


def b64encode(data: bytes) -> str:
    """bytes as protobuf JSON (standard base64 with padding)."""
    return base64.b64encode(data).decode("ascii")


def b64decode(text: Optional[str]) -> bytes:
    """protobuf JSON bytes (standard or URL-safe base64, padded or not)."""
    if not text:
        return b""
    if "-" in text or "_" in text:
        text = text.replace("-", "+").replace("_", "/")
    return base64.b64decode(text + "=" * (-len(text) % 4))


def env_list(env: Optional[Dict[str, str]], what: str = "env") -> List[str]:
    """A mapping as the API's ``KEY=VALUE`` list (keys must not hold '=')."""
    out: List[str] = []
    for k, v in (env or {}).items():
        if not k or "=" in k:
            raise ValueError(f"{what}: bad variable name {k!r}")
        out.append(f"{k}={v}")
    return out

