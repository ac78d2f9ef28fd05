#!/usr/bin/env bash
# The language model's corpus: downloads the Debian packages bible-kjv-text (the King James
# Version, public domain) and bible-kjv (its decoder, GPL-2+) with apt-get download (no root,
# nothing installed), decodes Genesis 1:1 to Revelation 22:21 and writes the normalised text
# (tools/eval/corpus.py) to .corpus/kjv.txt, checking its SHA-256.
# Usage: bash scripts/fetch_kjv.sh        Environment: PYTHON (default .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
EXPECTED=376f0fd8429cec6cc77659d428b2debd01f069dbfb3917776a09a36a7cfed5c4
mkdir -p .corpus
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download -q bible-kjv-text bible-kjv >/dev/null)
for deb in "$work"/*.deb; do dpkg -x "$deb" "$work/root"; done
"$work/root/usr/bin/bible" -p "$work/root/usr/lib" "gen1:1-rev22:21" >"$work/raw.txt"
"$PYTHON" - "$work/raw.txt" .corpus/kjv.txt "$EXPECTED" <<'PY'
import sys
sys.path.insert(0, "tools/eval")
import corpus
text = corpus.normalise(open(sys.argv[1], encoding="latin-1").read())
digest = corpus.sha256(text)
if digest != sys.argv[3]:
    sys.exit(f"fetch_kjv: normalised text sha256 {digest}, expected {sys.argv[3]}")
open(sys.argv[2], "w").write(text)
print(f"fetch_kjv: {sys.argv[2]}: {len(text)} bytes, {text.count(chr(10))} verses, sha256 {digest}")
PY
