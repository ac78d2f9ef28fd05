"""The English text corpus of the language model: the King James Version of the Bible as the
Debian package bible-kjv-text 4.38 ships it (public domain text; the package's retrieval
program, bible-kjv, is GPL-2+ and only used to decode it). scripts/fetch_kjv.sh writes the
normalised text; this module turns it into bytes and splits it.

Normalisation (normalise()): chapter headings and verse numbers dropped, each verse on one
line, runs of spaces collapsed, ASCII only. Tokens are the text's bytes (vocabulary 256).
Split: the last HELDOUT_BYTES bytes (from the Book of Revelation) are held out; the language
model never trains on them, and tools/eval/data/kjv_heldout.txt is that tail, committed.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Tuple

import numpy as np

HELDOUT_BYTES = 65536
HERE = os.path.dirname(os.path.abspath(__file__))
HELDOUT_PATH = os.path.join(HERE, "data", "kjv_heldout.txt")

_VERSE = re.compile(r"^\s*(\d+)\s+(.*)$")


def normalise(raw: str) -> str:
    """The `bible` program's output (chapter headings between blank lines, verses starting
    with an indented number, wrapped at 80 columns) as one verse per line."""
    lines = raw.splitlines()
    verses = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        match = _VERSE.match(line) if line.startswith(" ") else None
        if match:
            verses.append(match.group(2).strip())
            continue
        isolated = (i == 0 or not lines[i - 1].strip()) and \
            (i + 1 == len(lines) or not lines[i + 1].strip())
        if isolated or not verses:
            continue                     # a chapter heading ("Genesis 1")
        verses[-1] += " " + line.strip()
    text = "\n".join(re.sub(r"\s+", " ", v) for v in verses) + "\n"
    return text.encode("ascii", "ignore").decode("ascii")


def split(text: str) -> Tuple[np.ndarray, np.ndarray]:
    """(train, held-out) byte arrays uint8 of the normalised text."""
    data = np.frombuffer(text.encode("ascii"), dtype=np.uint8)
    return data[:-HELDOUT_BYTES], data[-HELDOUT_BYTES:]


def heldout_bytes() -> np.ndarray:
    """The committed held-out tail as uint8 [HELDOUT_BYTES]."""
    with open(HELDOUT_PATH, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8)


def sha256(text: str) -> str:
    """Hex digest of the normalised text (docs/quality.md records it)."""
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def decode(ids) -> str:
    """Bytes back to text (invalid bytes replaced)."""
    return bytes(int(i) for i in ids).decode("ascii", "replace")
