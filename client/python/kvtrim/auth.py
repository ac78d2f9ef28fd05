"""Bearer tokens (kvtrimd --auth_tokens_file): channel interceptors that send
`authorization: Bearer <token>` with every call of a grpcio channel (sync and grpc.aio)."""

from __future__ import annotations

import collections
import re
from typing import Any, List, Optional, Tuple

import grpc

from .errors import invalid_argument

AUTHORIZATION_HEADER = "authorization"
_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/=]{16,512}")


def check_token(token: Optional[str]) -> Optional[str]:
    """The token when well formed (16..512 characters of RFC 6750's b64token), else a
    KvtrimError INVALID_ARGUMENT naming "auth_token" (which never quotes the token)."""
    if token is None or token == "":
        return None
    if not isinstance(token, str) or not _TOKEN.fullmatch(token):
        length = len(token) if isinstance(token, str) else type(token).__name__
        raise invalid_argument("auth_token", f"expected 16..512 characters of A-Z a-z 0-9 "
                                             f"- . _ ~ + / = (got {length})")
    return token


def _with_header(metadata, value: str) -> List[Tuple[str, str]]:
    """`metadata` plus the authorization header."""
    return [*(metadata or ()), (AUTHORIZATION_HEADER, value)]


class _Details(collections.namedtuple(
        "_Details", ("method", "timeout", "metadata", "credentials", "wait_for_ready",
                     "compression")), grpc.ClientCallDetails):
    """A sync call's details with other metadata."""


class BearerTokenInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                             grpc.StreamUnaryClientInterceptor,
                             grpc.StreamStreamClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call of a sync channel."""

    def __init__(self, token: str):
        self._value = f"Bearer {token}"

    def _details(self, details: Any) -> _Details:
        """`details` with the header."""
        return _Details(details.method, details.timeout,
                        _with_header(details.metadata, self._value), details.credentials,
                        getattr(details, "wait_for_ready", None),
                        getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation, client_call_details, request):
        """Unary calls."""
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        """Server-streaming calls."""
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        """Client-streaming calls (RegisterModel)."""
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        """Bidirectional calls (CompressSession, Regions)."""
        return continuation(self._details(client_call_details), request_iterator)


def aio_interceptors(token: str) -> list:
    """grpc.aio interceptors adding `authorization: Bearer <token>` to every call."""
    value = f"Bearer {token}"

    def details(call_details):
        return grpc.aio.ClientCallDetails(call_details.method, call_details.timeout,
                                          _with_header(call_details.metadata, value),
                                          call_details.credentials,
                                          call_details.wait_for_ready)

    class UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
        """Unary calls."""

        async def intercept_unary_unary(self, continuation, call_details, request):
            return await continuation(details(call_details), request)

    class StreamUnary(grpc.aio.StreamUnaryClientInterceptor):
        """Client-streaming calls."""

        async def intercept_stream_unary(self, continuation, call_details, request_iterator):
            return await continuation(details(call_details), request_iterator)

    class StreamStream(grpc.aio.StreamStreamClientInterceptor):
        """Bidirectional calls."""

        async def intercept_stream_stream(self, continuation, call_details, request_iterator):
            return await continuation(details(call_details), request_iterator)

    return [UnaryUnary(), StreamUnary(), StreamStream()]
