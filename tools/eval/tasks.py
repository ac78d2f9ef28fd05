"""Synthetic long-context retrieval tasks for the retrieval model (NumPy, seeded).

Vocabulary (3072 ids): 0 pad, 1 BOS, 2 ';' (end of record), 3 '=', 4 '?' (question),
5 '#' (needle marker), 16..2063 keys, 2064..2575 values, 2576..3071 filler.
A record is `k = v ;`; keys are distinct within a prompt, values are not.

Tasks (n = prompt length in tokens, the cache the policies compress):
  * kv_lookup: filler with many records, one per 16 tokens (256 at 4K, 1024 at 16K): every
    other record is a distractor;
  * needle: filler with one `# k = v ;` needle at a random depth and 16 distractor needles.
The prompt ends with the question `? k`; the answer is read with the cache compressed: `=` is
appended and the model must predict v from the evicted cache.

Training sequences end with several `? k = v ;` questions instead; the loss is taken on the
value of each question only (training_batch's targets).
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
RECORD = 4            # tokens of `k = v ;`
QUESTION = 5          # tokens of `? k = v ;`
TASKS = ("kv_lookup", "needle")
IGNORE = -100


@dataclass
class Sample:
    """One evaluation prompt: ids [n] ending with `? k`, and the answer v."""

    task: str
    ids: np.ndarray
    answer: int
    depth: float          # where the asked record starts, as a fraction of the prompt


def _records(rng: np.random.Generator, count: int) -> np.ndarray:
    """count records [count, 4] with distinct keys and random values."""
    keys = KEY0 + rng.choice(NUM_KEYS, size=count, replace=False)
    values = VALUE0 + rng.integers(0, NUM_VALUES, count)
    return np.stack([keys, np.full(count, EQ), values, np.full(count, SEP)], axis=1)


def _body(rng: np.random.Generator, task: str, length: int) -> Tuple[np.ndarray, np.ndarray,
                                                                      List[int]]:
    """Filler of `length` tokens with the task's records placed at random, non-overlapping
    offsets. Returns the body, the records [R, 4] (record 0 is the asked one) and each
    record's start offset."""
    marker = 1 if task == "needle" else 0
    width = RECORD + marker
    count = 17 if task == "needle" else max(2, length // 16)
    count = min(count, max(2, length // (width + 1)), NUM_KEYS)
    records = _records(rng, count)
    body = FILLER0 + rng.integers(0, NUM_FILLER, length)
    slots = length // width
    chosen = np.sort(rng.choice(slots, size=count, replace=False))
    order = rng.permutation(count)
    starts = [0] * count
    for slot, index in zip(chosen, order):
        start = int(slot) * width
        if marker:
            body[start] = NEEDLE
        body[start + marker:start + width] = records[index]
        starts[index] = start
    return body, records, starts


def eval_sample(rng: np.random.Generator, task: str, n: int) -> Sample:
    """A prompt of exactly n tokens: BOS, body, `? k` asking record 0."""
    body, records, starts = _body(rng, task, n - 3)
    ids = np.concatenate(([BOS], body, [QUERY, records[0, 0]]))
    return Sample(task, ids.astype(np.int64), int(records[0, 2]), (starts[0] + 1) / n)


def answer_ids(sample: Sample) -> np.ndarray:
    """The token appended after the prompt to read the answer: `=`; the logits at its
    position must predict the value."""
    return np.array([EQ], dtype=np.int64)


def training_batch(rng: np.random.Generator, task: str, n: int, batch: int,
                   questions: int = 16) -> Tuple[np.ndarray, np.ndarray]:
    """ids [batch, n] and targets [batch, n] (IGNORE except at each question's `=`, whose
    next token is the value asked)."""
    ids = np.empty((batch, n), dtype=np.int64)
    targets = np.full((batch, n), IGNORE, dtype=np.int64)
    for row in range(batch):
        body, records, _ = _body(rng, task, n - 1 - QUESTION * questions)
        picks = rng.choice(len(records), size=questions, replace=len(records) < questions)
        tail = []
        for pick in picks:
            key, _, value, _ = records[pick]
            tail += [QUERY, key, EQ, value, SEP]
        seq = np.concatenate(([BOS], body, tail))
        ids[row] = seq
        start = 1 + len(body)
        for q in range(questions):
            eq_at = start + QUESTION * q + 2
            targets[row, eq_at] = seq[eq_at + 1]
    return ids, targets


def eval_set(seed: int, task: str, n: int, count: int) -> List[Sample]:
    """`count` prompts of length n, reproducible from (seed, task, n)."""
    rng = np.random.default_rng([seed, TASKS.index(task), n])
    return [eval_sample(rng, task, n) for _ in range(count)]
