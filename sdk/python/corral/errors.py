"""Typed exceptions for errors returned by the corral server.

Every error a call can raise is a :class:`CorralError` carrying the server's
Connect code (``.code``, e.g. ``"not_found"``) and message (``.message``).
Each common code has its own subclass, so callers write::

    try:
        await client.get(sandbox_id)
    except corral.NotFoundError:
        ...

Transport failures (connection refused, reset, malformed response) are
raised as :class:`UnavailableError`; client-side deadlines as
:class:`DeadlineExceededError` (also a :class:`TimeoutError`).
"""

from typing import Dict, Optional, Type

__all__ = [
    "CorralError",
    "InvalidArgumentError",
    "NotFoundError",
    "AlreadyExistsError",
    "FailedPreconditionError",
    "ResourceExhaustedError",
    "UnavailableError",
    "PermissionDeniedError",
    "UnauthenticatedError",
    "UnimplementedError",
    "DeadlineExceededError",
    "CanceledError",
    "InternalError",
    "error_from_code",
]


class CorralError(Exception):
    """An error from the corral server (or the transport to it).

    Attributes:
        code: the Connect error code, e.g. ``"not_found"``.
        message: the server's message, without the code.
    """

    code: str = "unknown"

    def __init__(self, message: str, code: Optional[str] = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


class InvalidArgumentError(CorralError, ValueError):
    """The request was malformed (bad id, path, limit ...)."""

    code = "invalid_argument"


class NotFoundError(CorralError, LookupError):
    """The sandbox, file or image does not exist."""

    code = "not_found"


class AlreadyExistsError(CorralError):
    """The object to create already exists."""

    code = "already_exists"


class FailedPreconditionError(CorralError):
    """The sandbox is not in a state that allows the call (e.g. stopped)."""

    code = "failed_precondition"


class ResourceExhaustedError(CorralError):
    """A quota or capacity limit was reached."""

    code = "resource_exhausted"


class UnavailableError(CorralError, ConnectionError):
    """The server cannot be reached or is shutting down; safe calls retry."""

    code = "unavailable"


class PermissionDeniedError(CorralError, PermissionError):
    """The caller may not do this."""

    code = "permission_denied"


class UnauthenticatedError(CorralError):
    """The caller's identity is missing or invalid."""

    code = "unauthenticated"


class UnimplementedError(CorralError, NotImplementedError):
    """The backend (or this SDK / server version) does not support the call."""

    code = "unimplemented"


class DeadlineExceededError(CorralError, TimeoutError):
    """The call's deadline passed (client side or server side)."""

    code = "deadline_exceeded"


class CanceledError(CorralError):
    """The server reports the call as cancelled."""

    code = "canceled"


class InternalError(CorralError):
    """A server bug or an unexpected failure (also Connect ``unknown``)."""

    code = "internal"


_BY_CODE: Dict[str, Type[CorralError]] = {
    cls.code: cls
    for cls in (
        InvalidArgumentError,
        NotFoundError,
        AlreadyExistsError,
        FailedPreconditionError,
        ResourceExhaustedError,
        UnavailableError,
        PermissionDeniedError,
        UnauthenticatedError,
        UnimplementedError,
        DeadlineExceededError,
        CanceledError,
        InternalError,
    )
}

# Connect's fallback mapping from an HTTP status to a code, for error
# responses that carry no Connect error body (e.g. from a proxy).
_HTTP_STATUS_CODES: Dict[int, str] = {
    400: "internal",
    401: "unauthenticated",
    403: "permission_denied",
    404: "unimplemented",
    408: "deadline_exceeded",
    429: "unavailable",
    502: "unavailable",
    503: "unavailable",
    504: "unavailable",
}


def error_from_code(code: str, message: str) -> CorralError:
    """Build the typed exception for a Connect code.

    ``unknown`` is reported as :class:`InternalError` (as the Go SDK does);
    codes without a dedicated class give a plain :class:`CorralError`.
    """
    if code == "unknown":
        code = "internal"
    cls = _BY_CODE.get(code)
    if cls is None:
        return CorralError(message, code=code or "unknown")
    return cls(message)


def error_from_http_status(status: int, body: bytes) -> CorralError:
    """Build the exception for a non-200 response without a Connect body."""
    code = _HTTP_STATUS_CODES.get(status, "unknown")
    text = body[:200].decode("utf-8", "replace").strip()
    return error_from_code(code, f"HTTP {status}" + (f": {text}" if text else ""))
