"""CompressSession from Python: a whole prefill on one stream. Layers are sent as the model
produces them (send returns at once; a background thread reads the answers), per-layer
policies answer each layer as soon as it is decided, model-wide ones at finish."""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Dict, List, Optional

import grpc

from . import _wire
from .errors import KvtrimError
from .layers import EncodedLayer, Layer
from .results import LayerDecision, SessionResult, decision_of, summary_of
from .v1 import kvtrim_pb2 as pb

SESSION_METHOD = "/kvtrim.v1.Kvtrim/CompressSession"
_FINISH = b"".join(_wire.message(pb.SessionRequest(finish=pb.Finish())))


class Session:
    """One CompressSession call. Use as a context manager (finish on normal exit, cancel on
    an exception) or call finish(). Not for concurrent send() from several threads.

    Created by Client.session(); `encode(layer) -> EncodedLayer` is the client's transport,
    `reregister(digest) -> bool` re-registers a model the server lost (once per session,
    before any answer: the stream is then replayed from `begin`).
    """

    def __init__(self, channel: grpc.Channel, settings: pb.CompressionSettings, *,
                 encode: Callable[[Layer], EncodedLayer], metadata, timeout: Optional[float],
                 reregister: Callable[[str], bool] = lambda digest: False):
        self._channel = channel
        self._encode = encode
        self._metadata = list(metadata)
        self._timeout = timeout
        self._reregister = reregister
        self._settings = settings
        self._cond = threading.Condition()
        self._answers: Dict[int, LayerDecision] = {}
        self._devices: Dict[int, Any] = {}
        self._summary = None
        self._error: Optional[KvtrimError] = None
        self._session_error: Optional[KvtrimError] = None
        self._sent: List[bytes] = []         # replay log until the first answer
        self._recording = True
        self._recovered = False
        self._finished_sending = False
        self._done = False
        self._begin = b"".join(_wire.message(pb.SessionRequest(begin=settings)))
        self._sent.append(self._begin)
        self._start([self._begin])
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        name="kvtrim-session-reader")
        self._reader.start()

    def _start(self, replay: List[bytes]) -> None:
        """Opens a new stream whose first requests are `replay`."""
        self._queue: "queue.Queue[Optional[bytes]]" = queue.Queue()
        for item in replay:
            self._queue.put(item)
        call = self._channel.stream_stream(SESSION_METHOD, request_serializer=None,
                                           response_deserializer=pb.SessionResponse.FromString)
        self._call = call(iter(self._queue.get, None), metadata=self._metadata,
                          timeout=self._timeout)

    def _put(self, message: bytes) -> None:
        """Queues one request (and logs it for a replay while nothing has been answered)."""
        with self._cond:
            if self._recording:
                self._sent.append(message)
            self._queue.put(message)

    def send(self, keys, values=None, queries=None, *, layer_id: int,
             softmax_scale: float = 0.0) -> None:
        """Sends one layer ([H_kv, n, d] keys, values, [H_q, w, d] queries); returns once it
        is queued. Raises the session's error if it has already failed."""
        self._raise_if_failed()
        if self._finished_sending:
            raise KvtrimError(grpc.StatusCode.FAILED_PRECONDITION, "session already finished")
        layer = Layer(keys, values, queries, layer_id, softmax_scale)
        encoded = self._encode(layer)
        device = getattr(keys, "device", None)
        if device is not None and getattr(device, "type", "cpu") != "cpu":
            self._devices[int(layer_id)] = device
        self._put(b"".join(_wire.session_layer(encoded.parts)))
        for chunk in encoded.chunks:
            self._put(b"".join(chunk))

    def result(self, layer_id: int, timeout: Optional[float] = None) -> LayerDecision:
        """Waits for the answer of `layer_id` (per-layer policies answer before finish)."""
        with self._cond:
            ok = self._cond.wait_for(
                lambda: layer_id in self._answers or self._error is not None or self._done,
                timeout)
            if layer_id in self._answers:
                return self._answers[layer_id]
            if self._error is not None:
                raise self._error
            if not ok:
                raise KvtrimError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                  f"no answer for layer {layer_id} within {timeout} s")
            raise KvtrimError(grpc.StatusCode.NOT_FOUND, f"layer {layer_id} was not answered")

    def finish(self, timeout: Optional[float] = None) -> SessionResult:
        """Sends `finish` and waits for every answer and the summary."""
        if not self._finished_sending:
            self._finished_sending = True
            self._put(_FINISH)
            with self._cond:
                self._queue.put(None)
        self._reader.join(timeout)
        with self._cond:
            if self._error is not None:
                raise self._error
            if self._summary is None:
                raise KvtrimError(grpc.StatusCode.DEADLINE_EXCEEDED, "session did not finish")
            return SessionResult(dict(self._answers), self._summary)

    def cancel(self) -> None:
        """Cancels the stream (kvtrimd drops the session)."""
        self._finished_sending = True
        self._call.cancel()
        with self._cond:
            self._queue.put(None)
        self._reader.join(5)

    def _raise_if_failed(self) -> None:
        """Raises the session's error, if any."""
        with self._cond:
            if self._error is not None:
                raise self._error

    def _read(self) -> None:
        """Reader thread: answers into _answers until the summary or an error."""
        while True:
            try:
                for response in self._call:
                    self._on_response(response)
                with self._cond:
                    if self._summary is None and self._error is None:
                        self._error = KvtrimError(grpc.StatusCode.INTERNAL,
                                                  "session ended without its summary")
                    self._done = True
                    self._cond.notify_all()
                return
            except grpc.RpcError as rpc_error:
                error = self._session_error or KvtrimError.from_rpc_error(rpc_error)
                if self._try_recover(error):
                    continue
                with self._cond:
                    self._error = error
                    self._done = True
                    self._cond.notify_all()
                return

    def _try_recover(self, error: KvtrimError) -> bool:
        """Re-registers a lost model and replays the stream, once, before any answer."""
        digest = self._settings.model_digest
        if (self._recovered or not digest or error.code != grpc.StatusCode.FAILED_PRECONDITION
                or "digest" not in error.message):
            return False
        with self._cond:
            if not self._recording:
                return False
        if not self._reregister(digest):
            return False
        with self._cond:
            self._recovered = True
            self._session_error = None
            replay = list(self._sent)
            if self._finished_sending:
                replay.append(None)
            self._start([m for m in replay if m is not None])
            if self._finished_sending:
                self._queue.put(None)
        return True

    def _on_response(self, response: pb.SessionResponse) -> None:
        """One SessionResponse: a layer answer, the summary or the session's error."""
        kind = response.WhichOneof("message")
        with self._cond:
            if kind in ("layer", "finished"):
                self._recording = False  # answered: a lost model can no longer be replayed
                self._sent.clear()
            if kind == "layer":
                layer_id = response.layer.layer_id
                self._answers[layer_id] = decision_of(response.layer,
                                                      self._devices.get(layer_id))
            elif kind == "finished":
                self._summary = summary_of(response.finished)
            elif kind == "error":
                self._session_error = KvtrimError.from_code_number(response.error.code,
                                                                   response.error.message)
            self._cond.notify_all()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.cancel()
        elif not self._finished_sending:
            self.finish()
