"""What kvtrim answers: per-layer decisions (kept indices per KV head) and their statistics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np

from .v1 import kvtrim_pb2 as pb

_SHAPE_NAMES = {pb.OUTPUT_SHAPE_UNSPECIFIED: "per_head", pb.PER_HEAD: "per_head",
                pb.SHARED: "shared", pb.BLOCK_ALIGNED: "block_aligned",
                pb.EQUAL_COUNT: "equal_count"}
_NUMERICS_NAMES = {pb.NUMERICS_FAST: "fast", pb.NUMERICS_EXACT: "exact",
                   pb.NUMERICS_UNSPECIFIED: "unspecified"}


@dataclass
class HeadStats:
    """Statistics of one KV head: kept tokens and, when computed, the relative output
    perturbation on the observation window (None otherwise)."""

    kept: int
    perturbation: Optional[float]


class LayerDecision:
    """The decision for one layer, read from kvtrim's LayerResult when first asked for (a
    decision nobody reads costs no tensor views and no per-head objects).

    Attributes:
      layer_id: the layer.
      num_tokens: n, the cached tokens the layer had.
      output_shape: "per_head", "shared", "block_aligned" or "equal_count".
      kept: one ascending index array per list: [H_kv] lists for per_head / equal_count, one
        for shared / block_aligned. NumPy int64 arrays, or for CUDA inputs int32 torch
        tensors on their device (views of the buffer kvtrim wrote them into on the region
        and in-process paths).
      heads: [H_kv] HeadStats.
      numerics: "fast" or "exact", the mode that computed the scores.
      compute_seconds: server time scoring and selecting this layer.
      perturbation_rows: window rows per query head the perturbation averaged (0 = none).
      output_written: the lists went to the request's output region instead.
      profile: per-stage seconds (CompressionSettings.profile), else None.
    """

    __slots__ = ("_result", "_device", "_output", "_kept", "_heads")

    def __init__(self, result: pb.LayerResult, device: Any = None, output: Any = None):
        """`result`: the LayerResult; `device`: the torch device of CUDA inputs (lists as
        int32 tensors there), else None (NumPy); `output`: the uint8 device buffer kvtrim
        wrote the lists into when the answer says output_written, or a (block, byte offset)
        of one (a session's OutputPool)."""
        self._result = result
        self._device = device
        self._output = output
        self._kept: Optional[List[Any]] = None
        self._heads: Optional[List[HeadStats]] = None

    @property
    def layer_id(self) -> int:
        """The layer."""
        return self._result.layer_id

    @property
    def num_tokens(self) -> int:
        """n, the cached tokens the layer had."""
        return self._result.num_tokens

    @property
    def output_shape(self) -> str:
        """"per_head", "shared", "block_aligned" or "equal_count"."""
        shape = self._result.output_shape
        return _SHAPE_NAMES.get(shape, str(shape))

    @property
    def numerics(self) -> str:
        """"fast" or "exact", the mode that computed the scores."""
        return _NUMERICS_NAMES.get(self._result.numerics, "?")

    @property
    def compute_seconds(self) -> float:
        """Server time scoring and selecting this layer."""
        return self._result.compute_seconds

    @property
    def perturbation_rows(self) -> int:
        """Window rows per query head the perturbation averaged (0 = none)."""
        return self._result.perturbation_rows

    @property
    def output_written(self) -> bool:
        """The lists went to the request's output region instead."""
        return self._result.output_written

    @property
    def profile(self) -> Optional[Dict[str, float]]:
        """Per-stage seconds (CompressionSettings.profile), else None."""
        return _profile(self._result)

    @property
    def heads(self) -> List[HeadStats]:
        """[H_kv] HeadStats (built on first access)."""
        if self._heads is None:
            self._heads = [HeadStats(h.kept, h.perturbation if h.HasField("perturbation")
                                     else None) for h in self._result.heads]
        return self._heads

    @property
    def kept(self) -> List[Any]:
        """The kept index lists (views made on first access; see the class docstring)."""
        if self._kept is None:
            self._kept = _kept_lists(self._result, self._device, self._output)
        return self._kept

    @property
    def kept_counts(self) -> List[int]:
        """Kept tokens per KV head."""
        return [h.kept for h in self._result.heads]

    def kept_matrix(self):
        """The per-head lists stacked to [H_kv, k]; ValueError when the heads keep different
        counts (allocating policies) or the answer is a shared list."""
        counts = {len(k) for k in self.kept}
        if self.output_shape in ("shared", "block_aligned") or len(counts) != 1:
            raise ValueError(f"layer {self.layer_id}: lists of unequal lengths {sorted(counts)}")
        first = self.kept[0]
        if hasattr(first, "device") and not isinstance(first, np.ndarray):
            import torch

            return torch.stack(self.kept)
        return np.stack(self.kept)

    def __repr__(self) -> str:
        return (f"LayerDecision(layer_id={self.layer_id}, num_tokens={self.num_tokens}, "
                f"output_shape={self.output_shape!r}, kept_counts={self.kept_counts}, "
                f"numerics={self.numerics!r}, compute_seconds={self.compute_seconds:.6g})")


@dataclass
class CompressResult:
    """The answer of one compress call: its layers (in request order) and the backend."""

    layers: List[LayerDecision]
    backend: str

    def __getitem__(self, layer_id: int) -> LayerDecision:
        """The decision of `layer_id`."""
        for layer in self.layers:
            if layer.layer_id == layer_id:
                return layer
        raise KeyError(layer_id)


@dataclass
class SessionSummary:
    """What a session's `finished` message reports."""

    layers: int
    tokens_in: int
    tokens_kept: int
    backend: str


@dataclass
class SessionResult:
    """Every layer a session answered (by layer id) and its summary."""

    layers: Dict[int, LayerDecision] = field(default_factory=dict)
    summary: Optional[SessionSummary] = None


def _flat_lists(result: pb.LayerResult):
    """(indices [total] int64, lengths per list) of `result` (PACKED or REPEATED encoding);
    (None, []) when the lists went to an output region."""
    if result.output_written:
        return None, []
    if result.packed.offsets:
        offsets = np.frombuffer(result.packed.offsets, dtype="<i8")
        index_type = "<u2" if result.packed.index_bytes == 2 else "<u4"
        indices = np.frombuffer(result.packed.indices, dtype=index_type).astype(np.int64)
    else:
        offsets = np.asarray(result.offsets, dtype=np.int64)
        indices = np.asarray(result.indices, dtype=np.int64)
    return indices, np.diff(offsets).tolist()


def _profile(result: pb.LayerResult) -> Optional[Dict[str, float]]:
    """LayerProfile as {stage: seconds}, or None when absent."""
    if not result.HasField("profile"):
        return None
    return {f.name: value for f, value in result.profile.ListFields()}


def output_bytes(num_lists: int, num_tokens: int) -> int:
    """Bytes of an output region for `num_lists` lists over n tokens: 8 (L + 1) + 4 L n."""
    return 8 * (num_lists + 1) + 4 * num_lists * num_tokens


def _kept_lists(result: pb.LayerResult, device: Any, output: Any) -> List[Any]:
    """The kept lists of a LayerResult. CUDA inputs (`device`): int32 torch tensors on it:
    views of `output` (the uint8 device buffer kvtrim wrote the lists into, or a (block,
    byte offset) of one, when the answer says output_written), else one copy of all the
    answered lists, then views."""
    if result.output_written and output is not None:
        import torch

        counts = [h.kept for h in result.heads]
        start = 8 * (len(counts) + 1)
        if isinstance(output, tuple):  # (block, offset) of a session's OutputPool
            output, base = output
            start += base
        written = output[start:start + 4 * sum(counts)].view(torch.int32)
        return list(written.split(counts))                  # views: no copy, no kernel
    indices, lengths = _flat_lists(result)
    if indices is not None and device is not None:
        import torch

        on_device = torch.from_numpy(indices.astype(np.int32)).to(device)
        return list(on_device.split(lengths))
    if indices is not None:
        bounds = np.cumsum([0] + lengths)
        return [indices[bounds[i]:bounds[i + 1]] for i in range(len(lengths))]
    return []


def decision_of(result: pb.LayerResult, device: Any = None, output: Any = None
                ) -> LayerDecision:
    """The LayerDecision of a LayerResult (see LayerDecision: lists on `device` for CUDA
    inputs, views of `output` when kvtrim wrote them there)."""
    return LayerDecision(result, device, output)


def summary_of(summary: pb.SessionSummary) -> SessionSummary:
    """The SessionSummary of a `finished` message."""
    return SessionSummary(summary.layers, summary.tokens_in, summary.tokens_kept,
                          summary.backend)
