#!/usr/bin/env python3
"""Adds an LU-KV profile (.npy written by `kvtrim-lukv-profile`) to a model bundle.

The bundle (client/model_bundle.h) gets the tensor profile.{metric} [99, L, H_kv] float32 and
the metadata key "profile.{metric}.manifest" = {"metric": ..., "sink": ..., "window": ...}
(the three keys kvtrimd accepts), read from the profile's manifest PROFILE.npy.json. The
profile's shape is checked against the bundle's num_layers and num_kv_heads, and its sha256
against the manifest. The bundle is rewritten in place (or to --out).

Usage (from the repository root, after tools/setup_venv.sh):
    .venv/bin/python tools/bundle_add_profile.py \
        --bundle samples/stories260k_model.safetensors \
        --profile samples/stories260k_lukv_snapkv.npy
"""

import argparse
import hashlib
import json
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file


def main():
    """Reads bundle, profile and manifest, checks them and writes the bundle."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", required=True, help="model bundle .safetensors")
    ap.add_argument("--profile", required=True, help="PROFILE.npy (manifest: PROFILE.npy.json)")
    ap.add_argument("--out", help="output bundle (default: rewrite --bundle)")
    args = ap.parse_args()

    tensors = load_file(args.bundle)
    with safe_open(args.bundle, "np") as f:
        meta = dict(f.metadata() or {})
    profile = np.load(args.profile)
    with open(args.profile + ".json") as f:
        manifest = json.load(f)

    L, hkv = int(meta["num_layers"]), int(meta["num_kv_heads"])
    if profile.dtype != np.float32 or profile.shape != (99, L, hkv):
        raise SystemExit(f"{args.profile}: {profile.dtype} {profile.shape}, expected float32 "
                         f"(99, {L}, {hkv})")
    digest = hashlib.sha256(np.ascontiguousarray(profile).tobytes()).hexdigest()
    if digest != manifest["sha256"]:
        raise SystemExit(f"{args.profile}: sha256 {digest} != manifest {manifest['sha256']}")
    if manifest.get("model") not in (None, "", meta.get("name")):
        raise SystemExit(f"profile built for model {manifest['model']!r}, bundle is "
                         f"{meta.get('name')!r}")

    metric = manifest["metric"]
    tensors[f"profile.{metric}"] = np.ascontiguousarray(profile, np.float32)
    meta[f"profile.{metric}.manifest"] = json.dumps(
        {"metric": metric, "sink": int(manifest["sink"]), "window": int(manifest["window"])},
        separators=(",", ":"))
    out = args.out or args.bundle
    save_file(tensors, out, metadata=meta)
    back = load_file(out)
    if not all(np.array_equal(back[k], tensors[k]) for k in tensors):
        raise SystemExit(f"{out}: does not read back")
    print(f"wrote {out}: profile.{metric} {list(profile.shape)} sha256 {digest[:16]}.., "
          f"manifest {meta[f'profile.{metric}.manifest']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
