"""The one exception type of the kvtrim client: a gRPC status with the field it names."""

from __future__ import annotations

import re
from typing import Optional

import grpc

# kvtrimd's INVALID_ARGUMENT (and most other) messages start with the offending field:
# "layers[0].keys.shape: expected ...", "settings.budget.keep_fraction: ...",
# "weights[layers.3.w_o].offset_bytes: ...", "--allow_client_shm: ...".
_FIELD = re.compile(r"^((?:--)?[A-Za-z_][A-Za-z0-9_]*"
                    r"(?:\[[^\]\n]{0,200}\]|\.[A-Za-z_][A-Za-z0-9_]*)*): ")


def field_of(message: str) -> Optional[str]:
    """The field a kvtrim status message starts with ("layers[0].keys.shape"), or None."""
    match = _FIELD.match(message or "")
    return match.group(1) if match else None


class KvtrimError(Exception):
    """A failed kvtrim call.

    Attributes:
      code: the grpc.StatusCode (INVALID_ARGUMENT, FAILED_PRECONDITION, NOT_FOUND, ...).
      message: kvtrimd's status message (or the client's own, for checks made before sending).
      field: the request field the message names ("layers[0].keys.shape"), or None.
    """

    def __init__(self, code: grpc.StatusCode, message: str, field: Optional[str] = None):
        self.code = code
        self.message = message
        self.field = field if field is not None else field_of(message)
        super().__init__(f"{code.name}: {message}")

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> "KvtrimError":
        """The KvtrimError of a grpc.RpcError (a grpc.Call's code() and details())."""
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = error.details() if hasattr(error, "details") else str(error)
        return cls(code or grpc.StatusCode.UNKNOWN, details or "")

    @classmethod
    def from_code_number(cls, number: int, message: str) -> "KvtrimError":
        """The KvtrimError of a numeric google.rpc.Code (SessionError, RegionResponse)."""
        for code in grpc.StatusCode:
            if code.value[0] == number:
                return cls(code, message)
        return cls(grpc.StatusCode.UNKNOWN, f"code {number}: {message}")


def invalid_argument(field: str, message: str) -> KvtrimError:
    """A client-side INVALID_ARGUMENT naming `field`, raised before anything is sent."""
    return KvtrimError(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {message}", field)
