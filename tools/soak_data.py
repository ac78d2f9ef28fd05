"""What the soak test's clients send: layer shapes, dtypes, the policy mix and the plan of
one request (tensors, settings, layers), carved from a fixed random pool per dtype."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import ml_dtypes
import numpy as np

# (H_kv, H_q, d) of the synthetic layers; n tokens and their weights; window query rows.
SHAPES = ((2, 8, 64), (4, 16, 64), (4, 8, 32), (8, 8, 32), (1, 4, 128))
TOKENS = (256, 512, 1024, 2048)
TOKEN_WEIGHTS = (0.35, 0.3, 0.2, 0.15)
DTYPES = ("f16", "bf16", "f32")
WINDOW = 32
# The bundled sample model (samples/stories260k_model.safetensors): H_kv, H_q, d and layers.
MODEL_SHAPE = (4, 8, 8)
MODEL_LAYERS = 5
# Transports whose requests are sessions (model-wide policies are only sent there).
SESSION_TRANSPORTS = ("session_inline", "session_chunked", "session_shm", "native_session")
POOL_ELEMENTS = 1 << 22

_NUMPY = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32}
_INPUT_NAMES = {1: "keys", 2: "values", 3: "queries"}


def itemsize(dtype: str) -> int:
    """Bytes per element of "f16" / "bf16" / "f32"."""
    return 4 if dtype == "f32" else 2


@dataclass
class PolicyInfo:
    """What ListPolicies says of one policy (the parts the soak needs)."""

    name: str
    scope: int
    allocator: str
    inputs: List[int]
    optional: List[int]
    shapes: List[str]

    def to_json(self) -> dict:
        """The JSON form passed to worker processes."""
        return dict(self.__dict__)


def catalog_of(response) -> Dict[str, PolicyInfo]:
    """{name: PolicyInfo} of a ListPoliciesResponse."""
    from kvtrim.v1 import kvtrim_pb2 as pb

    return {p.name: PolicyInfo(p.name, int(p.scope), p.allocator, list(p.inputs),
                               list(p.optional_inputs),
                               [pb.OutputShape.Name(s).lower() for s in p.output_shapes])
            for p in response.policies}


@dataclass
class Plan:
    """One request: transport, policy, layer shape, layers and the settings keywords of
    kvtrim.Client.compress / session (build_settings)."""

    transport: str
    policy: str
    family: str                      # "layer", "model" (model-aware) or "wide" (model-wide)
    shape: Tuple[int, int, int]      # (H_kv, H_q, d)
    n: int
    dtype: str
    layer_ids: List[int]
    settings: dict
    send: Tuple[str, ...]            # tensors sent: "keys" and optionally values, queries
    serial: bool = False             # sessions: wait for each layer's answer before the next
    offsets: Dict[int, int] = field(default_factory=dict)  # pool offset of each layer

    def layer_bytes(self) -> int:
        """Bytes of one layer's tensors as sent."""
        hkv, hq, d = self.shape
        sizes = {"keys": hkv * self.n * d, "values": hkv * self.n * d, "queries": hq * WINDOW * d}
        return sum(sizes[name] for name in self.send) * itemsize(self.dtype)


class DataPool:
    """Random normal elements per dtype; layers are views at random offsets (no copies)."""

    def __init__(self, seed: int):
        """Draws POOL_ELEMENTS normal values and casts them to every dtype."""
        rng = np.random.default_rng(seed)
        base = rng.standard_normal(POOL_ELEMENTS, dtype=np.float32)
        self.pools = {name: base.astype(t) for name, t in _NUMPY.items()}

    def tensor(self, dtype: str, shape: Sequence[int], offset: int) -> np.ndarray:
        """A dense view of `shape` starting `offset` elements into the dtype's pool."""
        size = int(np.prod(shape))
        start = offset % (POOL_ELEMENTS - size)
        return self.pools[dtype][start:start + size].reshape(shape)

    def layer(self, plan: Plan, layer_id: int) -> Dict[str, np.ndarray]:
        """{name: array} of the tensors `plan` sends for `layer_id`."""
        hkv, hq, d = plan.shape
        offset = plan.offsets.get(layer_id, 0)
        shapes = {"keys": (hkv, plan.n, d), "values": (hkv, plan.n, d),
                  "queries": (hq, WINDOW, d)}
        return {name: self.tensor(plan.dtype, shapes[name], offset + 7919 * i)
                for i, name in enumerate(plan.send)}


def _budget(rng: np.random.Generator, n: int) -> dict:
    """keep (a fraction) or, one time in five, keep_tokens."""
    if rng.random() < 0.2:
        return {"keep_tokens": int(rng.integers(1, n + 1))}
    return {"keep": float(rng.choice((0.05, 0.1, 0.2, 0.3, 0.5)))}


def _settings(rng: np.random.Generator, info: PolicyInfo, family: str, n: int,
              digest: str) -> dict:
    """Settings keywords: budget, numerics, perturbation, output shape, encoding, profile."""
    settings = _budget(rng, n)
    exact = rng.random() < 0.15
    if exact:
        settings["numerics"] = "exact"
    modes = (None, "off", "full") if exact else (None, "off", "full", "sampled")
    perturbation = modes[int(rng.integers(len(modes)))]
    if perturbation is not None:
        settings["perturbation"] = perturbation
    if rng.random() < 0.15:
        shapes = [s for s in ("shared", "equal_count", "block_aligned") if s in info.shapes]
        if shapes:
            settings["output_shape"] = shapes[int(rng.integers(len(shapes)))]
            if settings["output_shape"] == "block_aligned":
                settings["block_size"] = 16
    settings["packed"] = bool(rng.random() < 0.9)
    settings["profile"] = bool(rng.random() < 0.1)
    if family != "layer":
        settings["model_digest"] = digest
    return settings


def _sent_tensors(rng: np.random.Generator, info: PolicyInfo) -> Tuple[str, ...]:
    """Keys, the policy's required tensors, optional ones half the time, others rarely."""
    send = {"keys"}
    for number, name in _INPUT_NAMES.items():
        if number in info.inputs:
            send.add(name)
        elif number in info.optional and rng.random() < 0.5:
            send.add(name)
        elif rng.random() < 0.15:
            send.add(name)
    return tuple(name for name in ("keys", "values", "queries") if name in send)


def make_plan(rng: np.random.Generator, transport: str, mix: Dict[str, List[str]],
              catalog: Dict[str, PolicyInfo], digest: str, max_layer_bytes: int) -> Plan:
    """A random request for `transport` over the policy mix ({family: [policies]})."""
    session = transport in SESSION_TRANSPORTS
    roll = rng.random()
    family = "wide" if roll < 0.1 and session else "model" if roll < 0.3 else "layer"
    if not mix.get(family):
        family = "layer"
    policy = mix[family][int(rng.integers(len(mix[family])))]
    shape = MODEL_SHAPE if family != "layer" else SHAPES[int(rng.integers(len(SHAPES)))]
    n = int(rng.choice(TOKENS, p=TOKEN_WEIGHTS))
    dtype = DTYPES[int(rng.integers(len(DTYPES)))]
    info = catalog[policy]
    settings = _settings(rng, info, family, n, digest)
    if family == "wide":
        layer_ids = list(range(MODEL_LAYERS))
        settings.pop("output_shape", None), settings.pop("block_size", None)
    elif session:
        count = int(rng.integers(1, MODEL_LAYERS + 1)) if family == "model" else int(
            rng.integers(2, 9))
        layer_ids = list(range(count))
    else:
        limit = MODEL_LAYERS if family == "model" else 8
        count = 2 if rng.random() < 0.2 else 1
        layer_ids = sorted(int(x) for x in rng.choice(limit, size=count, replace=False))
    if family == "layer":
        settings["num_layers"] = max(layer_ids) + 1 if session else 8
    plan = Plan(transport, policy, family, shape, n, dtype, layer_ids, settings,
                _sent_tensors(rng, info), serial=bool(session and rng.random() < 0.5))
    while len(plan.layer_ids) > 1 and plan.layer_bytes() * len(plan.layer_ids) > max_layer_bytes:
        plan.layer_ids.pop()
    if plan.layer_bytes() > max_layer_bytes:
        plan.n = TOKENS[0]
    plan.offsets = {l: int(rng.integers(POOL_ELEMENTS)) for l in plan.layer_ids}
    return plan


def expected_k(settings: dict, n: int) -> int:
    """Tokens per KV head the budget asks for (Budget's rule in kvtrim.proto)."""
    if "keep_tokens" in settings:
        return min(int(settings["keep_tokens"]), n)
    return max(1, int(np.floor(settings["keep"] * n + 0.5)))


def check_lists(lists: Sequence[np.ndarray], counts: Sequence[int], n: int,
                per_head: bool) -> Optional[str]:
    """A problem with CSR kept lists (ascending, in [0, n), matching the heads' counts)."""
    for i, kept in enumerate(lists):
        kept = np.asarray(kept)
        if kept.size and (kept[0] < 0 or kept[-1] >= n or np.any(np.diff(kept) <= 0)):
            return f"list {i} is not strictly ascending within [0, {n})"
        if per_head and kept.size != counts[i]:
            return f"list {i} holds {kept.size} indices but its head says kept={counts[i]}"
    return None


def check_decision(decision, plan: Plan, info: PolicyInfo) -> Optional[str]:
    """A problem with one answered layer (None when it is consistent with the request)."""
    hkv = plan.shape[0]
    shape = plan.settings.get("output_shape", "per_head")
    per_head = shape in ("per_head", "equal_count")
    counts = decision.kept_counts
    if decision.num_tokens != plan.n or len(counts) != hkv:
        return f"answer has n={decision.num_tokens}, {len(counts)} heads; sent n={plan.n}, {hkv}"
    lists = decision.kept
    if len(lists) != (hkv if per_head else 1):
        return f"{len(lists)} kept lists for output_shape {shape} and H_kv={hkv}"
    problem = check_lists(lists, counts, plan.n, per_head)
    if problem:
        return problem
    return check_budget(counts, plan, info, shape)


def check_budget(counts: Sequence[int], plan: Plan, info: PolicyInfo, shape: str
                 ) -> Optional[str]:
    """Kept counts against the budget: equal to k per head for uniform per-layer policies,
    H_kv * k in total for AdaKV, within [0, n] otherwise."""
    k = expected_k(plan.settings, plan.n)
    if any(c < 0 or c > plan.n for c in counts):
        return f"kept counts {list(counts)} outside [0, {plan.n}]"
    if shape == "block_aligned" or info.scope == 3:
        return None
    if shape != "per_head" and info.allocator != "uniform":
        return None
    if info.allocator == "uniform" and any(c != k for c in counts):
        return f"uniform policy kept {list(counts)}, expected {k} per head"
    if info.allocator == "adakv" and sum(counts) != k * len(counts):
        return f"AdaKV kept {sum(counts)} in total, expected {k * len(counts)}"
    return None
