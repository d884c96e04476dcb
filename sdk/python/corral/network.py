"""Network policy: what a sandbox may reach (default none: loopback only).

``create(network=...)`` takes ``None`` or ``"none"`` (loopback only),
``"open"`` (everything but the node's always-denied ranges), a list of
allow rules (an allowlist), ``{"mode": ..., "allow": [...]}`` or a
:class:`Network`. A rule is
``TARGET[:PORTS][/PROTOCOLS]``: a node preset (``"pypi"``, ``"npm"``,
``"github"``, ``"goproxy"``), a name (``"example.org:443"``,
``"*.example.org"``) or an address or prefix (``"203.0.113.0/24:80,443"``).
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Union

__all__ = ["Network", "NetworkRefusal", "NetworkStats", "NetworkArg"]

_MODES = {"none": "NETWORK_MODE_NONE", "allowlist": "NETWORK_MODE_ALLOWLIST", "open": "NETWORK_MODE_OPEN"}


@dataclass(frozen=True)
class Network:
    """A network policy: ``mode`` is ``"none"``, ``"allowlist"`` or ``"open"``."""

    mode: str = "none"
    allow: List[str] = field(default_factory=list)

    @classmethod
    def _from_json(cls, d: Optional[Dict[str, Any]]) -> "Network":
        d = d or {}
        mode = str(d.get("mode", "NETWORK_MODE_NONE")).replace("NETWORK_MODE_", "").lower()
        if mode == "unspecified":
            mode = "none"
        return cls(mode=mode, allow=list(d.get("allow", [])))


NetworkArg = Union[None, str, Sequence[str], Dict[str, Any], Network]


def mode_json(mode: str) -> str:
    """The API's name of mode (``"none"``, ``"allowlist"``, ``"open"``)."""
    try:
        return _MODES[mode.lower()]
    except KeyError:
        raise ValueError(f"network mode: {mode!r} is not none, allowlist or open") from None


def network_json(network: NetworkArg) -> Optional[Dict[str, Any]]:
    """The NetworkPolicy message for create's ``network`` argument."""
    if network is None:
        return None
    if isinstance(network, Network):
        return {"mode": mode_json(network.mode), "allow": list(network.allow)}
    if isinstance(network, str):
        return {"mode": mode_json(network)}
    if isinstance(network, dict):
        unknown = set(network) - {"mode", "allow"}
        if unknown:
            raise ValueError(f"network: unknown keys {sorted(unknown)} (mode, allow)")
        allow = [str(r) for r in network.get("allow") or []]
        return {"mode": mode_json(network.get("mode") or ("allowlist" if allow else "none")), "allow": allow}
    rules = [str(r) for r in network]
    return {"mode": _MODES["allowlist"], "allow": rules}


@dataclass(frozen=True)
class NetworkRefusal:
    """A refused destination: ``hook`` is connect, sendmsg, egress or dns."""

    address: str
    port: int
    protocol: str
    hook: str
    name: str
    count: int

    @classmethod
    def _from_json(cls, d: Dict[str, Any]) -> "NetworkRefusal":
        return cls(address=d.get("address", ""), port=int(d.get("port", 0)), protocol=d.get("protocol", ""),
                   hook=d.get("hook", ""), name=d.get("name", ""), count=int(d.get("count", 0)))


@dataclass(frozen=True)
class NetworkStats:
    """Refused connects, sends and packets (DNS refusals listed, not counted)."""

    refused_total: int
    refusals: List[NetworkRefusal]

    @classmethod
    def _from_json(cls, d: Dict[str, Any]) -> "NetworkStats":
        return cls(refused_total=int(d.get("refusedTotal", 0)),
                   refusals=[NetworkRefusal._from_json(r) for r in d.get("refusals", [])])
