"""Model bundles for RegisterModel: a model's head layout, RoPE parameters and weights (W_O,
query statistics, LU-KV profiles), read from a bundle .safetensors file (the format of
client/model_bundle.h) or built from arrays, and framed as the RegisterModel stream."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List

import numpy as np

from . import _wire
from .errors import invalid_argument
from .tensors import view_of
from .v1 import kvtrim_pb2 as pb

_SAFETENSORS_DTYPES = {"F32": pb.DTYPE_F32, "F16": pb.DTYPE_F16, "BF16": pb.DTYPE_BF16}
_HEADER_INTS = ("num_layers", "num_query_heads", "num_kv_heads", "head_dim", "hidden_size")
MAX_SAFETENSORS_HEADER = 100 << 20


@dataclass
class Weight:
    """One weight as sent: proto dtype, shape, and its row-major little-endian bytes."""

    dtype: int
    shape: List[int]
    data: memoryview

    @classmethod
    def of(cls, array: Any, name: str) -> "Weight":
        """A weight from a NumPy array or torch tensor of any rank (f32 / f16 / bf16)."""
        if hasattr(array, "dim") and not isinstance(array, np.ndarray):
            shape = [int(s) for s in array.shape]
        else:
            array = np.asarray(array)
            shape = list(array.shape)
        padded = array.reshape(1, 1, -1) if hasattr(array, "reshape") else array
        view = view_of(padded, f"weights[{name}]")
        return cls(view.dtype, shape, view.host_bytes())


@dataclass
class ModelBundle:
    """Everything RegisterModel takes: the header, weights by name ("layers.0.w_o",
    "layers.0.query_mean", "profile.snapkv", ...) and profile manifests by weight name."""

    header: pb.ModelHeader
    weights: Dict[str, Weight] = field(default_factory=dict)
    manifests: Dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_arrays(cls, header: pb.ModelHeader, weights: Dict[str, Any],
                    manifests: Dict[str, str] = None) -> "ModelBundle":
        """A bundle from arrays / tensors by registration name."""
        return cls(header, {n: Weight.of(a, n) for n, a in weights.items()}, dict(manifests or {}))

    @classmethod
    def from_safetensors(cls, path: str) -> "ModelBundle":
        """Reads a bundle file: tensors by name and the header in __metadata__ (name,
        num_layers, num_query_heads, num_kv_heads, head_dim, hidden_size, rope_theta,
        rope_scaling_json, rope_layout, "profile.NAME.manifest"). INVALID_ARGUMENT naming
        the path and key for a malformed file."""
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise invalid_argument(path, "not a safetensors file (shorter than 8 bytes)")
            (header_len,) = struct.unpack("<Q", raw)
            if header_len > MAX_SAFETENSORS_HEADER:
                raise invalid_argument(path, f"safetensors header of {header_len} bytes")
            try:
                table = json.loads(f.read(header_len))
            except ValueError as error:
                raise invalid_argument(path, f"safetensors header is not JSON: {error}")
        data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
        meta = table.pop("__metadata__", {}) or {}
        header = pb.ModelHeader(name=meta.get("name", ""), rope_layout=meta.get("rope_layout", ""),
                                rope_scaling_json=meta.get("rope_scaling_json", ""))
        for key in _HEADER_INTS:
            try:
                setattr(header, key, int(meta[key]))
            except (KeyError, ValueError):
                raise invalid_argument(f"{path}: __metadata__.{key}", "missing or not an integer")
        try:
            header.rope_theta = float(meta["rope_theta"])
        except (KeyError, ValueError):
            raise invalid_argument(f"{path}: __metadata__.rope_theta", "missing or not a number")
        bundle = cls(header)
        for name, entry in table.items():
            dtype = _SAFETENSORS_DTYPES.get(entry.get("dtype"))
            if dtype is None:
                raise invalid_argument(f"{path}: {name}.dtype", f"unsupported {entry.get('dtype')}")
            begin, end = entry["data_offsets"]
            bundle.weights[name] = Weight(dtype, list(entry["shape"]),
                                          memoryview(data[begin:end]).cast("B"))
            manifest = meta.get(f"{name}.manifest")
            if manifest is not None:
                bundle.manifests[name] = manifest
        return bundle


def registration_messages(bundle: ModelBundle, chunk_bytes: int) -> Iterator[bytes]:
    """The RegisterModel stream: the header, then each weight in chunks of <= chunk_bytes."""
    yield pb.RegisterModelRequest(header=bundle.header).SerializeToString()
    for name in sorted(bundle.weights):
        weight = bundle.weights[name]
        total = weight.data.nbytes
        for offset in range(0, max(total, 1), chunk_bytes):
            chunk = pb.ModelWeightChunk(name=name, offset_bytes=offset)
            if offset == 0:
                chunk.dtype = weight.dtype
                chunk.shape.extend(weight.shape)
                chunk.manifest_json = bundle.manifests.get(name, "")
            piece = weight.data[offset:offset + chunk_bytes]
            parts = [chunk.SerializeToString(), *_wire.length_delimited(5, [piece])]
            yield b"".join(_wire.length_delimited(2, parts))
