"""CompressionSettings from keyword arguments: the one place the client's options become the
proto's fields (kvtrimd validates them again and names the field it refuses)."""

from __future__ import annotations

import numbers
from typing import Any, Mapping, Optional, Union

from .errors import invalid_argument
from .v1 import kvtrim_pb2 as pb

OUTPUT_SHAPES = {"per_head": pb.PER_HEAD, "shared": pb.SHARED,
                 "block_aligned": pb.BLOCK_ALIGNED, "equal_count": pb.EQUAL_COUNT}
NUMERICS = {"fast": pb.NUMERICS_FAST, "exact": pb.NUMERICS_EXACT}
PERTURBATION = {"full": pb.PERTURBATION_FULL, "off": pb.PERTURBATION_OFF,
                "sampled": pb.PERTURBATION_SAMPLED}

ParamValue = Union[bool, int, float, str]


def _enum(value: Any, table: Mapping[str, int], field: str) -> int:
    """A proto enum from a name of `table` (case-insensitive) or the enum number itself."""
    if isinstance(value, str):
        name = value.lower()
        if name not in table:
            raise invalid_argument(field, f"expected one of {sorted(table)}, got '{value[:64]}'")
        return table[name]
    return int(value)


def param_value(value: ParamValue, field: str) -> pb.ParamValue:
    """A ParamValue: bool -> flag, number -> number, str -> text."""
    if isinstance(value, bool):
        return pb.ParamValue(flag=value)
    if isinstance(value, numbers.Real):
        return pb.ParamValue(number=float(value))
    if isinstance(value, str):
        return pb.ParamValue(text=value)
    raise invalid_argument(field, f"expected bool, number or str, got {type(value).__name__}")


def per_head_answer(settings: Mapping[str, Any]) -> bool:
    """Whether compress keywords ask for one list per head (per_head / equal_count): the
    answers an output region takes without reading its offsets back."""
    shape = settings.get("output_shape")
    return shape is None or shape in ("per_head", "equal_count", pb.PER_HEAD, pb.EQUAL_COUNT,
                                      pb.OUTPUT_SHAPE_UNSPECIFIED)


def _budget(keep: Optional[float], keep_tokens: Optional[int],
            max_perturbation: Optional[float], max_keep: Optional[float]) -> pb.Budget:
    """The Budget of exactly one of keep / keep_tokens / max_perturbation (+ max_keep)."""
    given = [keep is not None, keep_tokens is not None, max_perturbation is not None]
    if sum(given) != 1:
        raise invalid_argument("settings.budget",
                               "give exactly one of keep, keep_tokens or max_perturbation")
    if max_keep is not None and max_perturbation is None:
        raise invalid_argument("settings.budget.max_perturbation.max_keep_fraction",
                               "max_keep is the cap of a max_perturbation budget; give both")
    if keep is not None:
        return pb.Budget(keep_fraction=float(keep))
    if keep_tokens is not None:
        return pb.Budget(keep_tokens=int(keep_tokens))
    cap = 0.0 if max_keep is None else float(max_keep)  # 0 = 1: no cap below n
    return pb.Budget(max_perturbation=pb.PerturbationBudget(
        epsilon=float(max_perturbation), max_keep_fraction=cap))


def build_settings(
    policy: str,
    *,
    keep: Optional[float] = None,
    keep_tokens: Optional[int] = None,
    max_perturbation: Optional[float] = None,
    max_keep: Optional[float] = None,
    params: Optional[Mapping[str, ParamValue]] = None,
    sink_tokens: Optional[int] = None,
    recent_tokens: Optional[int] = None,
    output_shape: Union[str, int, None] = None,
    num_layers: int = 0,
    model_digest: str = "",
    seed: int = 0,
    request_id: str = "",
    block_size: int = 0,
    numerics: Union[str, int, None] = None,
    perturbation: Union[str, bool, int, None] = None,
    packed: bool = True,
    profile: bool = False,
) -> pb.CompressionSettings:
    """The CompressionSettings of a compress call or session.

    Args:
      policy: a preset ("dropkv", "snapkv", ...) or "SCORER+ALLOCATOR" (ListPolicies).
      keep: fraction of each layer's n tokens kept per KV head, in (0, 1].
      keep_tokens: tokens kept per KV head instead.
      max_perturbation: an error target epsilon >= 0 instead: each KV head keeps the fewest
        tokens of its ranking whose output perturbation is <= epsilon (Budget.max_perturbation;
        needs values and queries, per-head output, perturbation not "off").
        Exactly one of keep / keep_tokens / max_perturbation.
      max_keep: with max_perturbation only: the cap, a fraction in (0, 1] (None = 1).
      params: parameter overrides, e.g. {"window": 32, "pooling": "max"}.
      sink_tokens, recent_tokens: protected first / last tokens (None = policy default).
      output_shape: "per_head" (default), "shared", "block_aligned" or "equal_count".
      num_layers: layers in the model (PyramidKV's schedule; 0 = unknown).
      model_digest: a RegisterModel digest (model-aware policies).
      seed: RNG seed of the random policy.
      request_id: free-form id echoed into kvtrimd's logs.
      block_size: tokens per block for "block_aligned".
      numerics: "fast" or "exact" (None = the server's default).
      perturbation: "full", "sampled", "off" (or True = full, False = off; None = server's).
      packed: ask for packed kept lists (fast to decode); False = repeated fields.
      profile: ask for per-stage server times (LayerDecision.profile).
    """
    if not isinstance(policy, str) or not policy:
        raise invalid_argument("settings.policy.name", "required (a preset or SCORER+ALLOCATOR)")
    budget = _budget(keep, keep_tokens, max_perturbation, max_keep)
    selection = pb.PolicySelection(name=policy)
    for name, value in (params or {}).items():
        selection.params[name].CopyFrom(param_value(value, f"settings.policy.params[{name}]"))
    settings = pb.CompressionSettings(
        policy=selection, budget=budget, num_layers=int(num_layers),
        model_digest=model_digest, seed=int(seed), request_id=request_id,
        block_size=int(block_size), profile=bool(profile),
        answer_encoding=pb.ANSWER_ENCODING_PACKED if packed else pb.ANSWER_ENCODING_REPEATED)
    if sink_tokens is not None:
        settings.sink_tokens = int(sink_tokens)
    if recent_tokens is not None:
        settings.recent_tokens = int(recent_tokens)
    if output_shape is not None:
        settings.output_shape = _enum(output_shape, OUTPUT_SHAPES, "settings.output_shape")
    if numerics is not None:
        settings.numerics = _enum(numerics, NUMERICS, "settings.numerics")
    if perturbation is not None:
        if isinstance(perturbation, bool):
            perturbation = "full" if perturbation else "off"
        settings.perturbation = _enum(perturbation, PERTURBATION, "settings.perturbation")
    return settings
