"""llama-server's JSON error objects: ``{"error": {"code", "message", "type"}}``.

Every failure a client can cause is answered with one of these and its HTTP status, never with a
traceback or a dropped connection; the type names and codes are llama-server's (server-common.cpp).
"""

from __future__ import annotations

from enum import Enum


class ErrorType(Enum):
    """error type -> (type string, HTTP status), as llama-server's format_error_response."""

    INVALID_REQUEST = ("invalid_request_error", 400)
    AUTHENTICATION = ("authentication_error", 401)
    NOT_FOUND = ("not_found_error", 404)
    SERVER = ("server_error", 500)
    PERMISSION = ("permission_error", 403)
    NOT_SUPPORTED = ("not_supported_error", 501)
    UNAVAILABLE = ("unavailable_error", 503)
    EXCEED_CONTEXT_SIZE = ("exceed_context_size_error", 400)
    # not llama-server's: a body over the size limit (its HTTP layer answers 413 without a body)
    PAYLOAD_TOO_LARGE = ("invalid_request_error", 413)

    @property
    def type_name(self) -> str:
        return self.value[0]

    @property
    def status(self) -> int:
        return self.value[1]


class APIError(Exception):
    """A request that fails with a llama-server error object."""

    def __init__(self, message: str, kind: ErrorType = ErrorType.INVALID_REQUEST) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind

    def body(self) -> dict:
        return error_body(self.message, self.kind)


def error_body(message: str, kind: ErrorType) -> dict:
    return {"error": {"code": kind.status, "message": message, "type": kind.type_name}}
