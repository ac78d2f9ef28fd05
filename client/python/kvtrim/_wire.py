"""Hand-written protobuf framing of the messages that carry tensor bytes.

Building a LayerInput with `inline_data = arr.tobytes()` and serialising it copies a 32K
layer twice inside protobuf. Here a message is a list of parts (protobuf-encoded headers
and memoryviews of the caller's arrays) that `b"".join` turns into the wire bytes with one
copy. Only the tensor-carrying fields are framed by hand; everything else is serialised by
the generated classes and concatenated (disjoint fields of one message may be concatenated:
protobuf parsers merge them).
"""

from __future__ import annotations

from typing import List, Sequence, Union

from .v1 import kvtrim_pb2 as pb

Part = Union[bytes, memoryview]

_WIRE_VARINT = 0
_WIRE_BYTES = 2


def varint(value: int) -> bytes:
    """The base-128 varint of `value` (negative values as 64-bit two's complement)."""
    value &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def key(field: int, wire_type: int) -> bytes:
    """The key of a field: (number << 3) | wire type."""
    return varint((field << 3) | wire_type)


def parts_size(parts: Sequence[Part]) -> int:
    """Total bytes of `parts`."""
    return sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)


def length_delimited(field: int, parts: Sequence[Part]) -> List[Part]:
    """Field `field` holding the message (or bytes) made of `parts`."""
    return [key(field, _WIRE_BYTES) + varint(parts_size(parts)), *parts]


def inline_tensor(dtype: int, shape: Sequence[int], data: memoryview) -> List[Part]:
    """A Tensor message with inline_data: dtype (1), shape (2, packed), inline_data (3)."""
    packed_shape = b"".join(varint(int(s)) for s in shape)
    header = (key(1, _WIRE_VARINT) + varint(dtype) + key(2, _WIRE_BYTES) +
              varint(len(packed_shape)) + packed_shape + key(3, _WIRE_BYTES) +
              varint(data.nbytes))
    return [header, data]


# LayerInput field numbers of its three tensors.
LAYER_TENSOR_FIELDS = {"keys": 2, "values": 3, "queries": 4}
# TensorSlot of each tensor.
TENSOR_SLOTS = {"keys": pb.TENSOR_SLOT_KEYS, "values": pb.TENSOR_SLOT_VALUES,
                "queries": pb.TENSOR_SLOT_QUERIES}


def layer_input(base: pb.LayerInput, inline: dict) -> List[Part]:
    """A LayerInput: `base` (every field but the inline tensors) followed by the inline
    tensors, `inline` = {"keys": (dtype, shape, bytes), ...}."""
    parts: List[Part] = [base.SerializeToString()]
    for name, (dtype, shape, data) in inline.items():
        parts += length_delimited(LAYER_TENSOR_FIELDS[name], inline_tensor(dtype, shape, data))
    return parts


def compress_request(settings: pb.CompressionSettings, layers: Sequence[List[Part]]) -> bytes:
    """The wire bytes of a CompressRequest (settings = field 1, layers = field 2)."""
    parts: List[Part] = length_delimited(1, [settings.SerializeToString()])
    for layer in layers:
        parts += length_delimited(2, layer)
    return b"".join(parts)


def session_layer(layer: List[Part]) -> List[Part]:
    """A SessionRequest carrying `layer` (field 2)."""
    return length_delimited(2, layer)


def session_chunk(layer_id: int, slot: int, offset: int, data: memoryview) -> List[Part]:
    """A SessionRequest carrying one TensorChunk (field 4)."""
    header = (key(1, _WIRE_VARINT) + varint(layer_id) + key(2, _WIRE_VARINT) + varint(slot) +
              key(3, _WIRE_VARINT) + varint(offset) + key(4, _WIRE_BYTES) + varint(data.nbytes))
    return length_delimited(4, [header, data])


def message(msg) -> List[Part]:
    """A generated message as a one-part list."""
    return [msg.SerializeToString()]
