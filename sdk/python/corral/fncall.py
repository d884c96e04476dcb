"""Stateless function calls (fncall): a call runs in a warm pooled sandbox
that the server resets afterwards, so no call sees another's files,
processes or environment. See :meth:`AsyncClient.call`."""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Union

from .types import b64decode, b64encode, env_list, format_duration, parse_duration

__all__ = ["CallResult", "call_request"]

_CALL = "/corral.v1.FnCallService/Call"
_BATCH = "/corral.v1.FnCallService/CallBatch"

_VERDICTS = {
    "VERDICT_OK": "ok", "VERDICT_RUNTIME_ERROR": "runtime_error", "VERDICT_TIME_LIMIT": "time_limit",
    "VERDICT_MEMORY_LIMIT": "memory_limit", "VERDICT_OUTPUT_LIMIT": "output_limit",
}


@dataclass
class CallResult:
    """How a call ended. ``verdict`` is ``"ok"``, ``"runtime_error"``,
    ``"time_limit"``, ``"memory_limit"`` or ``"output_limit"``; times are
    seconds; ``files`` holds the requested output files that existed."""

    verdict: str = ""
    exit_code: int = 0
    signal: int = 0
    stdout: bytes = b""
    stderr: bytes = b""
    cpu_time: float = 0.0
    wall_time: float = 0.0
    peak_memory_bytes: int = 0
    files: Dict[str, bytes] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"

    @property
    def text(self) -> str:
        """stdout decoded as UTF-8 (invalid bytes replaced)."""
        return self.stdout.decode("utf-8", "replace")

    @classmethod
    def _from_json(cls, d: Optional[Dict[str, Any]]) -> "CallResult":
        d = d or {}
        return cls(
            verdict=_VERDICTS.get(d.get("verdict", ""), "unspecified"),
            exit_code=int(d.get("exitCode", 0)), signal=int(d.get("signal", 0)),
            stdout=b64decode(d.get("stdout")), stderr=b64decode(d.get("stderr")),
            cpu_time=parse_duration(d.get("cpuTime")), wall_time=parse_duration(d.get("wallTime")),
            peak_memory_bytes=int(d.get("peakMemoryBytes", 0)),
            files={k: b64decode(v) for k, v in (d.get("files") or {}).items()},
        )


def _bytes(v: Union[str, bytes]) -> bytes:
    return v.encode() if isinstance(v, str) else bytes(v)


def call_request(source: Optional[str] = None, *, language: str = "", args: Optional[Sequence[str]] = None,
                 image: str = "", stdin: Union[str, bytes, None] = None, env: Optional[Dict[str, str]] = None,
                 files: Optional[Dict[str, Union[str, bytes]]] = None, output_files: Optional[List[str]] = None,
                 timeout: Optional[float] = None, cpu_timeout: Optional[float] = None,
                 memory_mb: float = 0, output_limit: int = 0) -> Dict[str, Any]:
    """The JSON CallRequest of :meth:`AsyncClient.call`'s arguments."""
    req: Dict[str, Any] = {}
    if args:
        req["argv"] = [str(a) for a in args]
    if language:
        req["language"] = language
    if source is not None:
        req["source"] = source
    if image:
        req["image"] = image
    if stdin:
        req["stdin"] = b64encode(_bytes(stdin))
    if env:
        req["env"] = env_list(env)
    if files:
        req["files"] = {str(k): b64encode(_bytes(v)) for k, v in files.items()}
    if output_files:
        req["outputFiles"] = list(output_files)
    if timeout is not None:
        req["wallTimeLimit"] = format_duration(timeout, "timeout")
    if cpu_timeout is not None:
        req["cpuTimeLimit"] = format_duration(cpu_timeout, "cpu_timeout")
    if memory_mb:
        req["memoryLimitBytes"] = str(int(memory_mb * (1 << 20)))
    if output_limit:
        req["outputLimitBytes"] = str(int(output_limit))
    return req
