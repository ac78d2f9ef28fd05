"""Synthetic long-context retrieval tasks for the retrieval model (NumPy, seeded, vectorised).

Vocabulary (3072 ids): 0 pad, 1 BOS, 2 ';' (end of record), 3 '=' (unused since records are
`k v ;`), 4 '?' (question), 5 '#' (needle marker), 16..2063 keys, 2064..2575 values,
2576..3071 filler.
A record is `k v ;`; keys are distinct within a prompt, values are not.

Tasks (n = prompt length in tokens, the cache the policies compress):
  * kv_lookup: filler with many records, one per 16 tokens (256 at 4K, 1024 at 16K): every
    record but the asked one is a distractor;
  * needle: filler with one `# k v ;` needle at a random depth and 16 distractor needles.
The prompt ends with the question `? k`, and the logits at k must predict v: an induction
lookup (find the position whose previous token is k, copy its token). The policies see the
question in their query window; the answer is read from the evicted cache by encoding the
question's QUESTION_TAIL tokens again over the compressed context (evaluate.py).

Training sequences end with several `? k v ;` questions (4 tokens each); the loss is taken on
each question's value only (training_batch's targets). repeat_batch gives a dense induction
signal (random tokens with a span repeated at a random offset) that the trainer mixes in while
the lookup circuit forms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

import numpy as np

VOCAB = 3072
BOS, SEP, EQ, QUERY, NEEDLE = 1, 2, 3, 4, 5
KEY0, NUM_KEYS = 16, 2048
VALUE0, NUM_VALUES = 2064, 512
FILLER0, NUM_FILLER = 2576, 496
RECORD = 3            # tokens of `k v ;`
QUESTION = 4          # tokens of `? k v ;` in training sequences
QUESTION_TAIL = 2     # tokens of `? k` ending an evaluation prompt
TASKS = ("kv_lookup", "needle")
IGNORE = -100
RECORD_SPACING = 16   # kv_lookup: one record per this many tokens
NEEDLES = 17          # needle: the asked needle and 16 distractors


@dataclass
class Sample:
    """One evaluation prompt: ids [n] ending with `? k`, and the answer v."""

    task: str
    ids: np.ndarray
    answer: int
    depth: float          # where the asked record starts, as a fraction of the prompt


@dataclass
class Bodies:
    """`batch` bodies of filler with records: tokens [b, L], keys and values [b, R] (record 0
    is the one an evaluation prompt asks) and each record's start offset [b, R]."""

    tokens: np.ndarray
    keys: np.ndarray
    values: np.ndarray
    starts: np.ndarray


def record_count(task: str, length: int) -> int:
    """How many records a body of `length` tokens holds for the task."""
    width = RECORD + (1 if task == "needle" else 0)
    count = NEEDLES if task == "needle" else max(2, length // RECORD_SPACING)
    return min(count, max(2, length // (width + 1)), NUM_KEYS)


def _first_columns_of_permutations(rng: np.random.Generator, rows: int, size: int,
                                   count: int) -> np.ndarray:
    """[rows, count]: per row, `count` distinct integers of [0, size) in random order."""
    return np.argsort(rng.random((rows, size)), axis=1)[:, :count]


def bodies(rng: np.random.Generator, task: str, length: int, batch: int) -> Bodies:
    """`batch` filler bodies of `length` tokens with the task's records at random,
    non-overlapping offsets."""
    marker = 1 if task == "needle" else 0
    width = RECORD + marker
    count = record_count(task, length)
    keys = KEY0 + _first_columns_of_permutations(rng, batch, NUM_KEYS, count)
    values = VALUE0 + rng.integers(0, NUM_VALUES, (batch, count))
    tokens = FILLER0 + rng.integers(0, NUM_FILLER, (batch, length))
    starts = _first_columns_of_permutations(rng, batch, length // width, count) * width
    rows = np.arange(batch)[:, None]
    if marker:
        tokens[rows, starts] = NEEDLE
    tokens[rows, starts + marker] = keys
    tokens[rows, starts + marker + 1] = values
    tokens[rows, starts + marker + 2] = SEP
    return Bodies(tokens, keys, values, starts)


def eval_sample(rng: np.random.Generator, task: str, n: int) -> Sample:
    """A prompt of exactly n tokens: BOS, body, `? k` asking record 0."""
    body = bodies(rng, task, n - 3, 1)
    ids = np.concatenate(([BOS], body.tokens[0], [QUERY, body.keys[0, 0]]))
    return Sample(task, ids.astype(np.int64), int(body.values[0, 0]),
                  (int(body.starts[0, 0]) + 1) / n)


def repeat_batch(rng: np.random.Generator, n: int, batch: int) -> Tuple[np.ndarray, np.ndarray]:
    """ids [batch, n] of random tokens in which a span of n/4 .. n/3 tokens is repeated later
    at a random offset, and targets [batch, n]: the next token inside the repeat (IGNORE
    elsewhere). Solving it needs an induction head, the circuit the lookup uses."""
    ids = rng.integers(KEY0, VOCAB, (batch, n))
    ids[:, 0] = BOS
    span = int(rng.integers(n // 4, n // 3 + 1))
    source = rng.integers(1, n - 2 * span, batch)
    dest = source + span + rng.integers(0, n - 2 * span - source + 1)
    offsets = np.arange(span)
    rows = np.arange(batch)[:, None]
    ids[rows, dest[:, None] + offsets] = ids[rows, source[:, None] + offsets]
    targets = np.full((batch, n), IGNORE, dtype=np.int64)
    inside = dest[:, None] + offsets[:-1]
    targets[rows, inside] = ids[rows, inside + 1]
    return ids.astype(np.int64), targets


def training_batch(rng: np.random.Generator, task: str, n: int, batch: int,
                   questions: int = 16) -> Tuple[np.ndarray, np.ndarray]:
    """ids [batch, n] and targets [batch, n] (IGNORE except at each question's key, whose
    next token is the value asked)."""
    body_length = n - 1 - QUESTION * questions
    body = bodies(rng, task, body_length, batch)
    picks = rng.integers(0, body.keys.shape[1], (batch, questions))
    rows = np.arange(batch)[:, None]
    asked_keys, asked_values = body.keys[rows, picks], body.values[rows, picks]
    tail = np.stack([np.full_like(asked_keys, QUERY), asked_keys, asked_values,
                     np.full_like(asked_keys, SEP)], axis=2).reshape(batch, -1)
    ids = np.concatenate((np.full((batch, 1), BOS), body.tokens, tail), axis=1).astype(np.int64)
    targets = np.full((batch, n), IGNORE, dtype=np.int64)
    key_at = 1 + body_length + QUESTION * np.arange(questions) + 1
    targets[:, key_at] = asked_values
    return ids, targets


def eval_set(seed: int, task: str, n: int, count: int) -> List[Sample]:
    """`count` prompts of length n, reproducible from (seed, task, n)."""
    rng = np.random.default_rng([seed, TASKS.index(task), n])
    return [eval_sample(rng, task, n) for _ in range(count)]
