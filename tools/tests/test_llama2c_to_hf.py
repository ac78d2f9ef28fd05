"""Tests of tools/llama2c_to_hf.py on the trained llama2.c model stories260K.

Run from the repository root:
    .venv/bin/python -m pytest tools/tests/test_llama2c_to_hf.py -q

The checkpoint is $KVTRIM_STORIES260K, by default <repo>/../shared/models/stories260K.bin
(/work/shared/models/stories260K.bin); every test skips when it is absent. The transformers
tests skip when torch or transformers do not import (pytest.importorskip-like).

Tolerance: the float32 forward passes of this model differ from float64 by 3e-5..9e-5 over
40 tokens (make_sample.py's own prefill and token-by-token passes differ by as much), so
5e-4 bounds fp32 noise (up to ~1e-4 measured); a wrong permutation or mapping is off by ~10.
"""

import importlib
import json
import os
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

TOOLS = Path(__file__).resolve().parents[1]
REPO = TOOLS.parent
sys.path.insert(0, str(TOOLS))

import llama2c_to_hf as conv  # noqa: E402
import make_sample as ms  # noqa: E402

CHECKPOINT = Path(os.environ.get(
    "KVTRIM_STORIES260K", REPO.parent / "shared" / "models" / "stories260K.bin"))
TOL = 5e-4
SEED = 20240607          # make_sample.py's default sampling seed
SAMPLE_LEN = 40          # tokens sampled from the model, BOS included
PROMPT_LEN = 8           # prompt of the greedy generation check (a prefix of the sample)
NEW_TOKENS = 20


@pytest.fixture(scope="module")
def checkpoint():
    """Path of stories260K.bin; skips the test when it is absent."""
    if not CHECKPOINT.is_file():
        pytest.skip(f"llama2.c checkpoint not found: {CHECKPOINT} (set KVTRIM_STORIES260K)")
    return str(CHECKPOINT)


@pytest.fixture(scope="module")
def weights(checkpoint):
    """The checkpoint read by make_sample.Weights (after the converter's validation)."""
    return conv.load_checkpoint(checkpoint)


@pytest.fixture(scope="module")
def sample(weights):
    """SAMPLE_LEN tokens sampled from the model at temperature 1, from BOS."""
    tokens, _ = ms.generate(weights, [ms.BOS], SAMPLE_LEN - 1, np.random.default_rng(SEED))
    return tokens


@pytest.fixture(scope="module")
def converted(checkpoint, tmp_path_factory):
    """A Hugging Face directory converted from the checkpoint (shared by the tests)."""
    out = tmp_path_factory.mktemp("conv") / "stories260k_hf"
    conv.convert(checkpoint, str(out))
    return out


@pytest.fixture(scope="module")
def untied(checkpoint, tmp_path_factory):
    """(checkpoint path, converted dir) of a variant with a separate classifier.

    Built from stories260K.bin: the header's vocab_size negated (llama2.c's convention for a
    separate wcls) and wcls [vocab, dim] = 0.5 * the embedding rows in reverse order
    appended after the RoPE tables.
    """
    base = tmp_path_factory.mktemp("untied")
    raw = Path(checkpoint).read_bytes()
    hdr = list(struct.unpack("<7i", raw[:28]))
    vocab, dim = hdr[5], hdr[0]
    emb = np.frombuffer(raw, "<f4", count=vocab * dim, offset=28).reshape(vocab, dim)
    hdr[5] = -vocab
    path = base / "untied.bin"
    path.write_bytes(struct.pack("<7i", *hdr) + raw[28:]
                     + np.ascontiguousarray(0.5 * emb[::-1], "<f4").tobytes())
    out = base / "hf"
    conv.convert(str(path), str(out))
    return str(path), out


def import_or_skip(name):
    """pytest.importorskip that also skips on a broken install (any ImportError)."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        pytest.skip(f"{name} does not import: {e}")


def load_hf(path, dtype_name="float32"):
    """LlamaForCausalLM.from_pretrained(path) in eval mode; asserts a clean key match."""
    torch = import_or_skip("torch")
    transformers = import_or_skip("transformers")
    major, minor = (int(v) for v in transformers.__version__.split(".")[:2])
    key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"  # renamed in 4.56
    model, info = transformers.LlamaForCausalLM.from_pretrained(
        str(path), output_loading_info=True, **{key: getattr(torch, dtype_name)})
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info.get(kind), f"from_pretrained {kind}: {info[kind]}"
    return model.eval()


def hf_logits(model, tokens):
    """Logits [T, vocab] float32 of one sequence through a transformers model."""
    import torch
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float().numpy()


def test_convert_config_and_shapes(checkpoint, tmp_path):
    """The CLI writes the three files; config, names, shapes and the q/k permutation."""
    out = tmp_path / "hf"
    assert conv.main(["--checkpoint", checkpoint, "--out", str(out)]) == 0
    assert sorted(os.listdir(out)) == ["config.json", "generation_config.json",
                                       "model.safetensors"]
    dim, hidden, layers, heads, kv_heads, vocab, seq_len = struct.unpack(
        "<7i", Path(checkpoint).read_bytes()[:28])
    d = dim // heads
    cfg = json.loads((out / "config.json").read_text())
    want = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": dim,
            "intermediate_size": hidden, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": d,
            "vocab_size": abs(vocab), "max_position_embeddings": seq_len,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            "tie_word_embeddings": vocab > 0, "bos_token_id": 1, "eos_token_id": 2,
            "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
            "torch_dtype": "float32", "dtype": "float32"}
    assert {k: cfg.get(k) for k in want} == want
    if CHECKPOINT.name == "stories260K.bin":   # the documented fixture (README.md)
        assert (dim, hidden, layers, heads, kv_heads, vocab, seq_len, d) == (
            64, 172, 5, 8, 4, 512, 512, 8)
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen == {"bos_token_id": 1, "eos_token_id": 2}

    t = load_file(str(out / "model.safetensors"))
    assert {k: t[k].shape for k in t} == conv.expected_shapes(cfg)
    assert "lm_head.weight" not in t                     # tied: from_pretrained ties it
    assert all(v.dtype == np.float32 for v in t.values())
    assert t["model.layers.0.self_attn.q_proj.weight"].shape == (heads * d, dim)
    assert t["model.layers.0.self_attn.k_proj.weight"].shape == (kv_heads * d, dim)
    assert t["model.layers.0.mlp.gate_proj.weight"].shape == (hidden, dim)
    assert t["model.layers.0.mlp.down_proj.weight"].shape == (dim, hidden)

    w = ms.Weights(checkpoint)
    perm = [*range(0, d, 2), *range(1, d, 2)]            # [0, 2, 4, 6, 1, 3, 5, 7] at d = 8
    for l in range(layers):
        p = f"model.layers.{l}."
        for h in range(heads):
            for j in range(d):
                assert np.array_equal(t[p + "self_attn.q_proj.weight"][h * d + j],
                                      w.wq[l, h * d + perm[j]])
        k_hf = t[p + "self_attn.k_proj.weight"].reshape(kv_heads, d, dim)
        assert np.array_equal(k_hf, w.wk[l].reshape(kv_heads, d, dim)[:, perm])
        for name, ref in (("self_attn.v_proj", w.wv), ("self_attn.o_proj", w.wo),
                          ("mlp.gate_proj", w.w1), ("mlp.up_proj", w.w3),
                          ("mlp.down_proj", w.w2), ("input_layernorm", w.rms_att),
                          ("post_attention_layernorm", w.rms_ffn)):
            assert np.array_equal(t[p + name + ".weight"], ref[l]), name
    assert np.array_equal(t["model.embed_tokens.weight"], w.tok_emb)
    assert np.array_equal(t["model.norm.weight"], w.rms_final)

    with pytest.raises(SystemExit, match="not empty"):
        conv.main(["--checkpoint", checkpoint, "--out", str(out)])
    (out / "keep.txt").write_text("x")
    assert conv.main(["--checkpoint", checkpoint, "--out", str(out), "--force"]) == 0
    assert (out / "keep.txt").read_text() == "x"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dir left


def test_numpy_logits_match_llama2c(converted, weights, sample):
    """The HF-layout NumPy forward of the written files == make_sample.forward (< 5e-4)."""
    err = conv.verify(str(converted), weights, sample, tol=TOL)
    print(f"numpy HF-layout vs llama2.c logits over {len(sample)} tokens: max |diff| {err:.3e}")
    assert err < TOL


def test_separate_classifier(untied, weights):
    """A negative header vocab_size gives tie_word_embeddings false and lm_head.weight."""
    path, out = untied
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is False and cfg["vocab_size"] == weights.vocab_size
    t = load_file(str(out / "model.safetensors"))
    assert np.array_equal(t["lm_head.weight"], 0.5 * weights.tok_emb[::-1])
    w2 = ms.Weights(path)
    assert not w2.shared_classifier
    tokens = [ms.BOS] + list(range(3, 30))
    assert conv.verify(str(out), w2, tokens, tol=TOL) < TOL


def test_refuses_unconvertible(checkpoint, tmp_path):
    """Truncated files, bad headers and versioned exports are refused with a message."""
    raw = Path(checkpoint).read_bytes()
    hdr = list(struct.unpack("<7i", raw[:28]))
    cases = {
        "truncated": (raw[:-4], "truncated"),
        "trailing": (raw + b"\0" * 8, "trailing data"),
        "v1": (struct.pack("<Ii", conv.EXPORT_MAGIC, 1) + raw[8:], "version 1"),
        "kvheads": (struct.pack("<7i", *hdr[:4], 3, *hdr[5:]) + raw[28:], "n_kv_heads"),
        "zero": (struct.pack("<7i", 0, *hdr[1:]) + raw[28:], "non-positive dim"),
    }
    for name, (data, message) in cases.items():
        path = tmp_path / f"{name}.bin"
        path.write_bytes(data)
        out = tmp_path / f"out_{name}"
        with pytest.raises(SystemExit, match=message):
            conv.main(["--checkpoint", str(path), "--out", str(out)])
        assert not out.exists()
    # RoPE tables that are not theta 10000: ambiguous, refused.
    w = ms.Weights(checkpoint)
    tables = 28 + 4 * (conv.expected_floats(dict(zip(
        ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"),
        hdr))) - w.seq_len * w.head_dim)
    bad = bytearray(raw)
    bad[tables + 4 * (w.head_dim // 2 + 1) + 3] ^= 0x40  # real[1, 1]: flip an exponent bit
    path = tmp_path / "rope.bin"
    path.write_bytes(bytes(bad))
    with pytest.raises(SystemExit, match="RoPE tables"):
        conv.main(["--checkpoint", str(path), "--out", str(tmp_path / "out_rope")])


def test_transformers_matches_llama2c(converted, weights, sample):
    """from_pretrained logits (float32) within 5e-4; greedy generate == make_sample's."""
    torch = import_or_skip("torch")
    model = load_hf(converted)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    ref = ms.forward(weights, sample, 0, ms.empty_cache(weights))      # [T, vocab]
    err = float(np.max(np.abs(hf_logits(model, sample) - ref)))
    print(f"transformers vs llama2.c logits over {len(sample)} tokens: max |diff| {err:.3e}")
    assert err < TOL

    prompt = sample[:PROMPT_LEN]
    want, _ = ms.generate(weights, prompt, NEW_TOKENS)                 # greedy, no EOS stop
    ids = torch.tensor([prompt])
    with torch.no_grad():
        got = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=NEW_TOKENS, pad_token_id=conv.EOS)[0].tolist()
    if len(got) < len(want):                                           # stopped at EOS
        assert got[-1] == conv.EOS, got
    assert got == want[:len(got)] and len(got) > PROMPT_LEN, (got, want)
    print(f"greedy from {prompt}: {got[PROMPT_LEN:]}")


def test_transformers_separate_classifier(untied, sample):
    """The untied variant loads with its own lm_head and matches its llama2.c forward."""
    path, out = untied
    model = load_hf(out)
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    w2 = ms.Weights(path)
    ref = ms.forward(w2, sample, 0, ms.empty_cache(w2))
    err = float(np.max(np.abs(hf_logits(model, sample) - ref)))
    assert err < TOL, err
