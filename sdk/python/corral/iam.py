"""Projects, tokens, quotas and the audit log: corral.v1.IAMService.

On TCP every call needs a bearer token (``AsyncClient(token=...)`` or
``$CORRAL_TOKEN``); the node's unix socket is the node administrator.
Projects nest (``job42/agent7``); a parent gives each child part of its
quota, and a child's use counts against every ancestor.
"""

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, AsyncIterator, Dict, List, Optional

from .types import parse_timestamp

__all__ = ["Quota", "Usage", "Project", "Token", "Identity", "AuditEntry", "IAMMixin"]

_IAM = "/corral.v1.IAMService/"


@dataclass(frozen=True)
class Quota:
    """Limits of a project and its subprojects; 0 is no limit of its own."""

    max_sandboxes: int = 0
    cpu_millis: int = 0
    memory_bytes: int = 0
    disk_bytes: int = 0
    creates_per_sec: float = 0.0
    calls_per_sec: float = 0.0

    def _to_json(self) -> Dict[str, Any]:
        return {"maxSandboxes": str(int(self.max_sandboxes)), "cpuMillis": str(int(self.cpu_millis)),
                "memoryBytes": str(int(self.memory_bytes)), "diskBytes": str(int(self.disk_bytes)),
                "createsPerSec": float(self.creates_per_sec), "callsPerSec": float(self.calls_per_sec)}

    @classmethod
    def _from_json(cls, d: Optional[Dict[str, Any]]) -> "Quota":
        d = d or {}
        return cls(int(d.get("maxSandboxes", 0)), int(d.get("cpuMillis", 0)), int(d.get("memoryBytes", 0)),
                   int(d.get("diskBytes", 0)), float(d.get("createsPerSec", 0)), float(d.get("callsPerSec", 0)))


@dataclass(frozen=True)
class Usage:
    """What a project's live sandboxes (its subprojects' included) use."""

    sandboxes: int = 0
    cpu_millis: int = 0
    memory_bytes: int = 0
    disk_bytes: int = 0

    @classmethod
    def _from_json(cls, d: Optional[Dict[str, Any]]) -> "Usage":
        d = d or {}
        return cls(int(d.get("sandboxes", 0)), int(d.get("cpuMillis", 0)), int(d.get("memoryBytes", 0)),
                   int(d.get("diskBytes", 0)))


@dataclass(frozen=True)
class Project:
    """A project; ``delegated`` is the sum of its direct subprojects' quotas."""

    path: str
    quota: Quota = field(default_factory=Quota)
    delegated: Quota = field(default_factory=Quota)
    usage: Usage = field(default_factory=Usage)
    created_at: Optional[datetime] = None
    created_by: str = ""

    @classmethod
    def _from_json(cls, d: Optional[Dict[str, Any]]) -> "Project":
        d = d or {}
        return cls(d.get("path", ""), Quota._from_json(d.get("quota")), Quota._from_json(d.get("delegated")),
                   Usage._from_json(d.get("usage")), parse_timestamp(d.get("createdAt")), d.get("createdBy", ""))


@dataclass(frozen=True)
class Token:
    """A token's record; the secret is only ever returned by create_token."""

    id: str
    project: str = ""
    role: str = ""
    description: str = ""
    created_at: Optional[datetime] = None
    expires_at: Optional[datetime] = None
    created_by: str = ""

    @classmethod
    def _from_json(cls, d: Optional[Dict[str, Any]]) -> Optional["Token"]:
        if not d:
            return None
        return cls(d.get("id", ""), d.get("project", ""), d.get("role", ""), d.get("description", ""),
                   parse_timestamp(d.get("createdAt")), parse_timestamp(d.get("expiresAt")), d.get("createdBy", ""))


@dataclass(frozen=True)
class Identity:
    """Who the server takes the caller for."""

    node_admin: bool
    project: str = ""
    role: str = ""
    token: Optional[Token] = None


@dataclass(frozen=True)
class AuditEntry:
    """One management request of the audit log."""

    key: str
    time: Optional[datetime]
    procedure: str
    result: str
    summary: str = ""
    node_admin: bool = False
    token_id: str = ""
    project: str = ""

    @classmethod
    def _from_json(cls, d: Dict[str, Any]) -> "AuditEntry":
        return cls(d.get("key", ""), parse_timestamp(d.get("time")), d.get("procedure", ""), d.get("result", ""),
                   d.get("summary", ""), bool(d.get("nodeAdmin", False)), d.get("tokenId", ""), d.get("project", ""))


class IAMMixin:
    """The IAM calls of :class:`corral.AsyncClient`."""

    _t: Any

    async def whoami(self, *, request_timeout: Optional[float] = None) -> Identity:
        """Describe the caller (node administrator, or a token's project and role)."""
        d = await self._t.unary(_IAM + "WhoAmI", {}, idempotent=True, timeout=request_timeout)
        return Identity(bool(d.get("nodeAdmin", False)), d.get("project", ""), d.get("role", ""),
                        Token._from_json(d.get("token")))

    async def create_token(self, project: str, *, role: str = "member", ttl: float = 0, description: str = "",
                           request_timeout: Optional[float] = None) -> "tuple[Token, str]":
        """Make a token of project with role (admin, member, viewer), expiring
        after ttl seconds (0: until revoked). Returns (token, secret): the
        secret is not shown again."""
        msg = {"project": project, "role": role, "ttlSeconds": str(int(-(-ttl // 1))), "description": description}
        d = await self._t.unary(_IAM + "CreateToken", msg, timeout=request_timeout)
        tok = Token._from_json(d.get("token"))
        assert tok is not None
        return tok, d.get("secret", "")

    async def list_tokens(self, project: str = "", *, request_timeout: Optional[float] = None) -> List[Token]:
        """The tokens the caller administers (of project and beneath, if given)."""
        d = await self._t.unary(_IAM + "ListTokens", {"project": project}, idempotent=True, timeout=request_timeout)
        return [t for t in (Token._from_json(x) for x in d.get("tokens", [])) if t is not None]

    async def revoke_token(self, token_id: str, *, request_timeout: Optional[float] = None) -> None:
        """Make a token fail from its next call on."""
        await self._t.unary(_IAM + "RevokeToken", {"id": token_id}, timeout=request_timeout)

    async def create_project(self, path: str, quota: Optional[Quota] = None, *,
                             request_timeout: Optional[float] = None) -> Project:
        """Make a project; a subproject's quota comes out of what its parent
        has left (ResourceExhaustedError naming project, quota and what is left)."""
        msg = {"path": path, "quota": (quota or Quota())._to_json()}
        d = await self._t.unary(_IAM + "CreateProject", msg, timeout=request_timeout)
        return Project._from_json(d.get("project"))

    async def list_projects(self, *, request_timeout: Optional[float] = None) -> List[Project]:
        """The projects the caller sees, with quota and usage."""
        d = await self._t.unary(_IAM + "ListProjects", {}, idempotent=True, timeout=request_timeout)
        return [Project._from_json(p) for p in d.get("projects", [])]

    async def get_project(self, path: str, *, request_timeout: Optional[float] = None) -> Project:
        """One project, with quota and usage."""
        d = await self._t.unary(_IAM + "GetProject", {"path": path}, idempotent=True, timeout=request_timeout)
        return Project._from_json(d.get("project"))

    async def set_quota(self, path: str, quota: Quota, *, request_timeout: Optional[float] = None) -> Project:
        """Replace a (sub)project's quota."""
        d = await self._t.unary(_IAM + "SetQuota", {"path": path, "quota": quota._to_json()}, timeout=request_timeout)
        return Project._from_json(d.get("project"))

    async def delete_project(self, path: str, *, keep: bool = False, request_timeout: Optional[float] = None) -> None:
        """Delete a project with its subprojects, tokens, sandboxes and images;
        with keep, refuse (FailedPreconditionError) if it holds anything."""
        await self._t.unary(_IAM + "DeleteProject", {"path": path, "keep": keep}, timeout=request_timeout)

    async def share_image(self, name: str, project: str, *, unshare: bool = False,
                          request_timeout: Optional[float] = None) -> None:
        """Let project (and its subprojects) use an image name of the
        caller's project, every version; unshare takes it back."""
        msg = {"name": name, "project": project, "unshare": bool(unshare)}
        await self._t.unary(_IAM + "ShareImage", msg, timeout=request_timeout)

    async def audit(self, project: str = "", *, after: str = "", limit: int = 0,
                    request_timeout: Optional[float] = None) -> List[AuditEntry]:
        """Audit entries the caller may read, oldest first."""
        msg = {"project": project, "after": after, "limit": int(limit)}
        d = await self._t.unary(_IAM + "ListAudit", msg, idempotent=True, timeout=request_timeout)
        return [AuditEntry._from_json(e) for e in d.get("entries", [])]

    async def follow_audit(self, project: str = "", *, after: str = "", limit: int = 0,
                           request_timeout: Optional[float] = None) -> AsyncIterator[AuditEntry]:
        """The entries :meth:`audit` returns, then each new one as it is
        recorded, until the caller stops iterating or request_timeout ends."""
        msg = {"project": project, "after": after, "limit": int(limit)}
        async with self._t.stream(_IAM + "StreamAudit", msg, timeout=request_timeout) as stream:
            async for d in stream:
                yield AuditEntry._from_json(d)
