"""The asyncio kvtrim client (grpc.aio): the same calls as kvtrim.Client, awaited.

Tensors go as inline bytes (chunked over a session above the message cap); the zero-copy
region transports are the synchronous Client's (its lease is a long-lived stream that
belongs with a worker's process, not an event loop).
"""

from __future__ import annotations

import asyncio
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import grpc

from . import _wire
from .auth import check_token
from .client import (HEALTH_SERVICE, as_layers, health_request, health_state,
                     load_balancing_options, make_channel)
from .errors import KvtrimError
from .layers import Layer, encode_chunked, encode_inline
from .models import ModelBundle, registration_messages
from .results import (CompressResult, LayerDecision, SessionResult, decision_of,
                      summary_of)
from .session import SESSION_METHOD
from .settings import build_settings
from .v1 import kvtrim_pb2 as pb

_FINISH = pb.SessionRequest(finish=pb.Finish()).SerializeToString()


class AsyncSession:
    """An asyncio CompressSession: `await send(...)`, `await result(layer_id)`,
    `await finish()`; `async with` finishes on normal exit and cancels on an exception."""

    def __init__(self, client: "AsyncClient", settings: pb.CompressionSettings,
                 timeout: Optional[float]):
        self._client = client
        self._queue: "asyncio.Queue[Optional[bytes]]" = asyncio.Queue()
        self._answers: Dict[int, LayerDecision] = {}
        self._summary = None
        self._error: Optional[KvtrimError] = None
        self._session_error: Optional[KvtrimError] = None
        self._changed = asyncio.Condition()
        self._finished_sending = False
        self._queue.put_nowait(pb.SessionRequest(begin=settings).SerializeToString())
        call = client._channel.stream_stream(SESSION_METHOD, request_serializer=None,
                                             response_deserializer=pb.SessionResponse.FromString)
        self._call = call(self._requests(), timeout=timeout)
        self._reader = asyncio.ensure_future(self._read())

    async def _requests(self):
        """The request stream, fed by send / finish."""
        while True:
            item = await self._queue.get()
            if item is None:
                return
            yield item

    async def _read(self) -> None:
        """Collects answers until the stream ends."""
        try:
            async for response in self._call:
                kind = response.WhichOneof("message")
                if kind == "layer":
                    self._answers[response.layer.layer_id] = decision_of(response.layer)
                elif kind == "finished":
                    self._summary = summary_of(response.finished)
                elif kind == "error":
                    self._session_error = KvtrimError.from_code_number(
                        response.error.code, response.error.message)
                async with self._changed:
                    self._changed.notify_all()
            if self._summary is None:
                self._error = self._session_error or KvtrimError(
                    grpc.StatusCode.INTERNAL, "session ended without its summary")
        except grpc.RpcError as error:
            self._error = self._session_error or KvtrimError.from_rpc_error(error)
        async with self._changed:
            self._changed.notify_all()

    async def send(self, keys, values=None, queries=None, *, layer_id: int,
                   softmax_scale: float = 0.0) -> None:
        """Queues one layer (inline, or chunked above the client's chunk_bytes)."""
        if self._error is not None:
            raise self._error
        layer = Layer(keys, values, queries, layer_id, softmax_scale)
        views = layer.views("layer")
        if sum(v.nbytes for v in views.values()) > self._client.chunk_bytes:
            encoded = encode_chunked(layer, views, self._client.chunk_bytes)
        else:
            encoded = encode_inline(layer, views)
        await self._queue.put(b"".join(_wire.session_layer(encoded.parts)))
        for chunk in encoded.chunks:
            await self._queue.put(b"".join(chunk))

    async def result(self, layer_id: int) -> LayerDecision:
        """Waits for the answer of `layer_id`."""
        async with self._changed:
            await self._changed.wait_for(lambda: layer_id in self._answers or
                                         self._error is not None or self._reader.done())
        if layer_id in self._answers:
            return self._answers[layer_id]
        raise self._error or KvtrimError(grpc.StatusCode.NOT_FOUND,
                                         f"layer {layer_id} was not answered")

    async def finish(self) -> SessionResult:
        """Sends finish and waits for the summary."""
        if not self._finished_sending:
            self._finished_sending = True
            await self._queue.put(_FINISH)
            await self._queue.put(None)
        await self._reader
        if self._error is not None:
            raise self._error
        return SessionResult(dict(self._answers), self._summary)

    async def cancel(self) -> None:
        """Cancels the stream."""
        self._finished_sending = True
        self._call.cancel()
        await self._queue.put(None)
        await asyncio.gather(self._reader, return_exceptions=True)

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            await self.cancel()
        elif not self._finished_sending:
            await self.finish()


class AsyncClient:
    """kvtrim.Client for asyncio (grpc.aio). Arguments as Client (no transport: inline)."""

    def __init__(self, target: str, *, tls=None, auth_token: Optional[str] = None,
                 timeout: float = 30.0,
                 session_timeout: float = 600.0, max_message_bytes: int = 64 << 20,
                 chunk_bytes: int = 4 << 20, channel_options: Sequence[Tuple[str, Any]] = (),
                 load_balancing: Optional[str] = None):
        self.timeout = timeout
        self.session_timeout = session_timeout
        self.max_message_bytes = max_message_bytes
        self.chunk_bytes = chunk_bytes
        self._channel = make_channel(target, tls, max_message_bytes,
                                     [*channel_options, *load_balancing_options(load_balancing)],
                                     aio=True, auth_token=check_token(auth_token))
        self._bundles: Dict[str, ModelBundle] = {}

    async def _unary(self, method: str, request: bytes, deserializer,
                     timeout: Optional[float] = None):
        """One unary call; KvtrimError on failure."""
        call = self._channel.unary_unary(method, request_serializer=None,
                                         response_deserializer=deserializer)
        try:
            return await call(request, timeout=timeout or self.timeout)
        except grpc.RpcError as error:
            raise KvtrimError.from_rpc_error(error) from None

    async def health(self, service: str = HEALTH_SERVICE) -> str:
        """grpc.health.v1 Check: "SERVING", "NOT_SERVING", ..."""
        return health_state(await self._unary("/grpc.health.v1.Health/Check",
                                              health_request(service), None))

    async def list_policies(self) -> pb.ListPoliciesResponse:
        """Every policy served (see Client.list_policies)."""
        return await self._unary("/kvtrim.v1.Kvtrim/ListPolicies", b"",
                                 pb.ListPoliciesResponse.FromString)

    async def list_models(self) -> pb.ListModelsResponse:
        """The registered models."""
        return await self._unary("/kvtrim.v1.Kvtrim/ListModels", b"",
                                 pb.ListModelsResponse.FromString)

    async def delete_model(self, digest: str) -> None:
        """Deletes a registered model."""
        await self._unary("/kvtrim.v1.Kvtrim/DeleteModel",
                          pb.DeleteModelRequest(digest=digest).SerializeToString(),
                          pb.DeleteModelResponse.FromString)
        self._bundles.pop(digest, None)

    async def register_model(self, bundle: Union[str, ModelBundle]) -> str:
        """Registers a model (path or ModelBundle); remembered for re-registration."""
        if isinstance(bundle, str):
            bundle = ModelBundle.from_safetensors(bundle)
        call = self._channel.stream_unary("/kvtrim.v1.Kvtrim/RegisterModel",
                                          request_serializer=None,
                                          response_deserializer=pb.RegisterModelResponse.FromString)

        async def messages():
            for message in registration_messages(bundle, self.chunk_bytes):
                yield message

        try:
            response = await call(messages(), timeout=self.session_timeout)
        except grpc.RpcError as error:
            raise KvtrimError.from_rpc_error(error) from None
        self._bundles[response.digest] = bundle
        return response.digest

    async def compress(self, keys=None, values=None, queries=None, *, policy: str,
                       layers=None, layer_id: int = 0, softmax_scale: float = 0.0,
                       timeout: Optional[float] = None, **settings) -> CompressResult:
        """As Client.compress (answers are NumPy arrays)."""
        call_layers = as_layers(keys, values, queries, layers, layer_id, softmax_scale)
        request_settings = build_settings(policy, **settings)
        for attempt in range(2):
            try:
                return await self._compress_once(call_layers, request_settings, timeout)
            except KvtrimError as error:
                digest = request_settings.model_digest
                if (attempt or error.code != grpc.StatusCode.FAILED_PRECONDITION
                        or "digest" not in error.message or digest not in self._bundles):
                    raise
                await self.register_model(self._bundles[digest])
        raise AssertionError("unreachable")

    async def _compress_once(self, layers, settings, timeout) -> CompressResult:
        """One attempt: unary inline, or a chunked session above the message cap."""
        views = [layer.views(f"layers[{i}]") for i, layer in enumerate(layers)]
        total = sum(v.nbytes for layer_views in views for v in layer_views.values())
        if total + (1 << 20) > self.max_message_bytes:
            session = AsyncSession(self, settings, timeout or self.session_timeout)
            for layer in layers:
                await session.send(layer.keys, layer.values, layer.queries,
                                   layer_id=layer.layer_id, softmax_scale=layer.softmax_scale)
            result = await session.finish()
            return CompressResult([result.layers[l.layer_id] for l in layers],
                                  result.summary.backend)
        encoded = [encode_inline(layer, v) for layer, v in zip(layers, views)]
        request = _wire.compress_request(settings, [e.parts for e in encoded])
        response = await self._unary("/kvtrim.v1.Kvtrim/Compress", request,
                                     pb.CompressResponse.FromString, timeout)
        return CompressResult([decision_of(r) for r in response.layers], response.backend)

    def session(self, *, policy: str, timeout: Optional[float] = None,
                **settings) -> AsyncSession:
        """An AsyncSession (settings as compress)."""
        return AsyncSession(self, build_settings(policy, **settings),
                            timeout or self.session_timeout)

    async def close(self) -> None:
        """Closes the channel."""
        await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
