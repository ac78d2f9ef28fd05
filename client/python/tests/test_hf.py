"""kvtrim.hf against a real kvtrimd: generation with the KV cache really evicted, on the
trained stories260K (converted by tools/llama2c_to_hf.py) and on a random GQA Llama.

Skipped without torch / transformers; the stories260K cases are skipped without the
checkpoint (<repo>/../shared/models/stories260K.bin, or $KVTRIM_STORIES260K)."""

import copy
import os
import pathlib
import subprocess
import sys
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import kvtrim  # noqa: E402
import kvtrim.hf as hf  # noqa: E402
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb  # noqa: E402

from conftest import REPO  # noqa: E402

STORIES = pathlib.Path(os.environ.get("KVTRIM_STORIES260K",
                                      REPO.parent / "shared" / "models" / "stories260K.bin"))
N = 200          # prompt tokens
NEW = 20         # generated tokens
K = 50           # round(0.25 * N): tokens kept per KV head at keep=0.25


def greedy(model, prompt, **kwargs):
    """Exactly NEW greedy tokens after `prompt` [B, N] (EOS cannot end it early)."""
    return model.generate(prompt, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                          **kwargs)


@pytest.fixture(scope="module")
def stories_lm(tmp_path_factory):
    """stories260K as a Hugging Face Llama (5 layers, 8 query / 4 KV heads, d 8) and a
    200-token prompt it sampled itself from BOS (seed 0)."""
    if not STORIES.exists():
        pytest.skip(f"no stories260K checkpoint at {STORIES}")
    out = tmp_path_factory.mktemp("stories260k") / "hf"
    subprocess.run([sys.executable, str(REPO / "tools" / "llama2c_to_hf.py"),
                    "--checkpoint", str(STORIES), "--out", str(out)], check=True,
                   capture_output=True, timeout=120)
    model = transformers.LlamaForCausalLM.from_pretrained(str(out)).eval()
    torch.manual_seed(0)
    prompt = model.generate(torch.tensor([[1]]), do_sample=True, max_new_tokens=N - 1,
                            min_new_tokens=N - 1)                         # [1, N]
    return SimpleNamespace(model=model, prompt=prompt)


@pytest.fixture(scope="module")
def random_lm():
    """A random GQA Llama (hidden 64, 4 layers, 8 query / 2 KV heads, d 16, vocab 256; seed
    0) and a random 200-token prompt (seed 1)."""
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=2, head_dim=16, vocab_size=256, max_position_embeddings=512)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    prompt = torch.randint(3, 256, (1, N), generator=torch.Generator().manual_seed(1))
    return SimpleNamespace(model=model, prompt=prompt)


@pytest.fixture(params=["stories260k", "random_gqa"])
def lm(request):
    """Each test model in turn."""
    return request.getfixturevalue("stories_lm" if request.param == "stories260k"
                                   else "random_lm")


@pytest.fixture(scope="module")
def client(server):
    """A client of the module's kvtrimd."""
    with kvtrim.Client(server.address) as c:
        yield c


def full_cache(model, prompt):
    """The uncompressed prefill cache of `prompt`."""
    with torch.no_grad():
        return model(prompt, use_cache=True).past_key_values


def kept_cache(model, prompt, report):
    """A reference cache built here: the full prefill cache gathered at the indices kvtrim
    returned (report.layers[l].kept [B, H_kv, k])."""
    cache = full_cache(model, prompt)
    for index, layer in enumerate(cache.layers):
        kept = report.layers[index].kept.unsqueeze(-1)                    # [B, H_kv, k, 1]
        layer.keys = layer.keys.gather(2, kept.expand(-1, -1, -1, layer.keys.shape[-1]))
        layer.values = layer.values.gather(2, kept.expand(-1, -1, -1, layer.values.shape[-1]))
    return cache


def next_logits(model, token, cache, position=None):
    """Logits [vocab] of one decode step of `token` on `cache` (at `position` if given)."""
    ids = torch.tensor([[token]])
    positions = None if position is None else torch.tensor([[position]])
    with torch.no_grad():
        return model(ids, past_key_values=cache, position_ids=positions).logits[0, -1]


def hook_count(model):
    """Forward (pre-)hooks installed on any module of `model`."""
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_keep_all_generates_the_same_tokens(lm, client):
    base = greedy(lm.model, lm.prompt)
    with hf.compress(lm.model, client, policy="dropkv", keep=1.0) as ctx:
        out = greedy(lm.model, lm.prompt)
    assert out.shape == (1, N + NEW)
    assert torch.equal(out, base)
    assert ctx.last.n == N and ctx.last.bytes_after == ctx.last.bytes_before > 0
    assert all(layer.k == N for layer in ctx.last.layers.values())


@pytest.mark.parametrize("output_shape", ["equal_count", "shared"])
def test_cache_holds_exactly_the_kept_entries(lm, client, output_shape):
    model, prompt = lm.model, lm.prompt
    full = full_cache(model, prompt)
    with hf.compress(model, client, policy="snapkv", keep=0.25,
                     output_shape=output_shape) as ctx:
        with torch.no_grad():
            cache = model(prompt, use_cache=True).past_key_values
    report = ctx.last
    assert sorted(report.layers) == list(range(model.config.num_hidden_layers))
    assert report.bytes_before == hf.cache_bytes(full)
    assert report.bytes_after == hf.cache_bytes(cache) == report.bytes_before * K // N
    for index, layer in enumerate(cache.layers):
        kept = report.layers[index].kept                                  # [1, H_kv, K]
        h_kv, d = full.layers[index].keys.shape[1], full.layers[index].keys.shape[3]
        assert report.layers[index].k == K
        assert layer.keys.shape == layer.values.shape == (1, h_kv, K, d)
        lists = report.layers[index].decisions[0].kept                    # kvtrim's answer
        answered = [torch.as_tensor(x) for x in lists] * (h_kv if len(lists) == 1 else 1)
        assert torch.equal(kept[0], torch.stack(answered))
        assert bool((kept[0, :, 1:] > kept[0, :, :-1]).all())             # ascending, unique
        if output_shape == "shared":
            assert bool((kept[0] == kept[0, :1]).all())
        rows = kept.unsqueeze(-1).expand(-1, -1, -1, d)                   # [1, H_kv, K, d]
        assert torch.equal(layer.keys, full.layers[index].keys.gather(2, rows))
        assert torch.equal(layer.values, full.layers[index].values.gather(2, rows))
    assert not all(torch.equal(r.kept[0, 0], torch.arange(N - K, N))
                   for r in report.layers.values())                        # not just recency


def test_generation_after_eviction_uses_true_positions(lm, client):
    model, prompt = lm.model, lm.prompt
    with hf.compress(model, client, policy="dropkv", keep=0.25) as ctx:
        out = greedy(model, prompt, return_dict_in_generate=True, output_logits=True)
        report = ctx.last
        with torch.no_grad():
            manual_cache = model(prompt, use_cache=True).past_key_values
        first = int(out.sequences[0, N])
        manual = next_logits(model, first, manual_cache)    # no position_ids: the hook's
    assert out.sequences.shape == (1, N + NEW) and len(out.logits) == NEW
    assert all(layer.k == K for layer in report.layers.values())
    # Step 2's logits come from the shrunk cache: equal to this file's own gather at the
    # returned indices, decoded at the true position N (not at the cache length K).
    reference = next_logits(model, first, kept_cache(model, prompt, report), position=N)
    torch.testing.assert_close(out.logits[1][0], reference, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(manual, reference, rtol=1e-5, atol=1e-5)
    wrong = next_logits(model, first, kept_cache(model, prompt, report), position=K)
    assert not torch.allclose(wrong, reference, rtol=1e-3, atol=1e-3)


def test_model_aware_policy_registers_the_model_once(lm, server):
    model, prompt = lm.model, lm.prompt
    with kvtrim.Client(server.address) as fresh:
        calls = []
        register = fresh.register_model
        fresh.register_model = lambda bundle: calls.append(bundle) or register(bundle)
        outputs, contexts = [], []
        for _ in range(2):
            with hf.compress(model, fresh, policy="criticalkv", keep=0.25) as ctx:
                outputs.append(greedy(model, prompt))
            contexts.append(ctx)
        assert len(calls) == 1
        assert [c.registered for c in contexts] == [True, False]
        digest = contexts[0].model_digest
        assert digest.startswith("sha256:") and digest == contexts[1].model_digest
        assert digest in {m.digest for m in fresh.list_models().models}
    header = calls[0].header
    assert (header.num_layers, header.num_query_heads, header.num_kv_heads, header.head_dim) \
        == (model.config.num_hidden_layers, model.config.num_attention_heads,
            model.config.num_key_value_heads, model.config.head_dim)
    assert header.rope_theta == 10000.0 and header.rope_layout == "rotate_half"
    assert torch.equal(outputs[0], outputs[1]) and outputs[0].shape == (1, N + NEW)
    assert all(layer.k == K for layer in contexts[0].last.layers.values())
    assert contexts[0].last.model_digest == digest


def test_the_queries_sent_are_the_models(lm, client):
    """Layer 0's window queries rebuilt independently (embedding, norm, q_proj, RoPE) give
    kvtrim the same snapkv answer as the hook's."""
    model, prompt = lm.model, lm.prompt
    with hf.compress(model, client, policy="snapkv", keep=0.25) as ctx:
        with torch.no_grad():
            model(prompt, use_cache=True)
    attn = model.model.layers[0].self_attn
    d = attn.head_dim
    with torch.no_grad():
        hidden = model.model.layers[0].input_layernorm(model.model.embed_tokens(prompt))
        q = attn.q_proj(hidden).view(1, N, -1, d).transpose(1, 2)          # [1, H_q, N, d]
        cos, sin = model.model.rotary_emb(hidden, torch.arange(N)[None])
        q, _ = apply_rotary_pos_emb(q, q, cos, sin)
        full = full_cache(model, prompt)
    answer = client.compress(full.layers[0].keys[0], full.layers[0].values[0], q[0, :, -32:],
                             policy="snapkv", keep=0.25, output_shape="equal_count",
                             num_layers=model.config.num_hidden_layers)
    assert torch.equal(torch.as_tensor(answer.layers[0].kept_matrix()),
                       ctx.last.layers[0].kept[0])


def test_query_statistics_and_expected_attention(random_lm, client):
    model, prompt = random_lm.model, random_lm.prompt
    stats = hf.query_statistics(model, prompt)
    h_q, d = model.config.num_attention_heads, model.config.head_dim
    assert stats["layers.3.query_mean"].shape == (h_q, d)
    assert stats["layers.3.query_cov"].shape == (h_q, d, d)
    attn = model.model.layers[0].self_attn
    with torch.no_grad():
        hidden = model.model.layers[0].input_layernorm(model.model.embed_tokens(prompt))
        q = attn.q_proj(hidden).view(N, h_q, d).double()                    # [N, H_q, d]
    centred = q - q.mean(0)
    cov = torch.einsum("thd,the->hde", centred, centred) / N                 # [H_q, d, d]
    torch.testing.assert_close(stats["layers.0.query_mean"], q.mean(0).float())
    torch.testing.assert_close(stats["layers.0.query_cov"], cov.float(), rtol=1e-4, atol=1e-6)
    with hf.compress(model, client, policy="expected_attention", keep=0.25,
                     query_stats=stats) as ctx:
        out = greedy(model, prompt)
    assert out.shape == (1, N + NEW) and ctx.model_digest
    assert all(layer.k == K for layer in ctx.last.layers.values())


def test_prompts_shorter_than_the_policy_window_stay_whole(random_lm, client):
    model, short = random_lm.model, random_lm.prompt[:, :16]
    base = greedy(model, short)
    with hf.compress(model, client, policy="snapkv", keep=0.25) as ctx:     # window 32
        out = greedy(model, short)
    assert torch.equal(out, base) and ctx.last is None


def test_unpadded_batch_rows_match_single_rows(random_lm, client):
    model = random_lm.model
    other = torch.randint(3, 256, (1, N), generator=torch.Generator().manual_seed(2))
    batch = torch.cat([random_lm.prompt, other])                             # [2, N]
    with hf.compress(model, client, policy="dropkv", keep=0.25) as ctx:
        together = greedy(model, batch, attention_mask=torch.ones_like(batch))
        both = ctx.last
        singles = [greedy(model, row[None]) for row in batch]
        kept = [ctx.reports[-2].layers, ctx.last.layers]
    assert both.batch == 2 and together.shape == (2, N + NEW)
    for b in range(2):
        assert all(torch.equal(both.layers[l].kept[b], kept[b][l].kept[0]) for l in kept[b])
        assert torch.equal(together[b], singles[b][0])


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_layers_of_different_lengths_decode(random_lm, client, attn_implementation):
    """pyramidkv with a shared list keeps a different count in each layer: the decode mask
    still fits every layer (eager needs the hook's all-visible mask)."""
    model, prompt = random_lm.model, random_lm.prompt
    model.set_attn_implementation(attn_implementation)
    try:
        with hf.compress(model, client, policy="pyramidkv", keep=0.25,
                         output_shape="shared") as ctx:
            out = greedy(model, prompt, return_dict_in_generate=True, output_logits=True)
    finally:
        model.set_attn_implementation("sdpa")
    counts = [layer.k for layer in ctx.last.layers.values()]
    assert len(set(counts)) > 1 and out.sequences.shape == (1, N + NEW)
    reference = next_logits(model, int(out.sequences[0, N]),
                            kept_cache(model, prompt, ctx.last), position=N)
    torch.testing.assert_close(out.logits[1][0], reference, rtol=1e-5, atol=1e-5)


def test_hooks_are_removed_after_the_block_and_after_exceptions(random_lm, client):
    model, prompt = random_lm.model, random_lm.prompt
    before = hook_count(model)
    with hf.compress(model, client, policy="dropkv", keep=0.25) as ctx:
        assert ctx.active and hook_count(model) > before
    assert not ctx.active and hook_count(model) == before
    with pytest.raises(RuntimeError, match="inside the block"):
        with hf.compress(model, client, policy="dropkv", keep=0.25):
            with torch.no_grad():
                model(prompt, use_cache=True)
            raise RuntimeError("inside the block")
    assert hook_count(model) == before
    padded = torch.ones(2, N, dtype=torch.long)
    padded[1, :10] = 0
    with pytest.raises(ValueError, match="padded batch"):       # raised by a hook
        with hf.compress(model, client, policy="dropkv", keep=0.25):
            model.generate(prompt.repeat(2, 1), attention_mask=padded, max_new_tokens=2)
    assert hook_count(model) == before
    assert greedy(model, prompt).shape == (1, N + NEW)      # the model is left as it was


def test_unsupported_uses_are_refused(random_lm, client):
    model, prompt = random_lm.model, random_lm.prompt
    before = hook_count(model)
    with pytest.raises(ValueError, match="rectangular"):
        with hf.compress(model, client, policy="snapkv+adakv", keep=0.25,
                         output_shape="per_head"):
            greedy(model, prompt)
    with pytest.raises(ValueError, match="forward on a compressed cache"):
        with hf.compress(model, client, policy="dropkv", keep=0.25):
            with torch.no_grad():
                cache = model(prompt, use_cache=True).past_key_values
                model(prompt[:, :4], past_key_values=cache)
    with pytest.raises(ValueError, match="output_shape"):
        hf.compress(model, client, output_shape="ragged")
    with pytest.raises(ValueError, match="already active"):
        with hf.compress(model, client), hf.compress(model, client):
            pass
    assert hook_count(model) == before


def test_cuda_model_through_cuda_ipc(random_lm, gpu_server):
    """On a GPU: the cache's CUDA tensors go to kvtrimd --backend=gpu by CUDA IPC, the kept
    lists come back on the GPU and the gather happens there."""
    model = copy.deepcopy(random_lm.model).cuda()
    prompt = random_lm.prompt.cuda()
    base = greedy(model, prompt)
    full = full_cache(model, prompt)
    with kvtrim.Client(gpu_server.address) as gpu_client:
        with hf.compress(model, gpu_client, policy="dropkv", keep=1.0):
            same = greedy(model, prompt)
        with hf.compress(model, gpu_client, policy="snapkv", keep=0.25) as ctx:
            with torch.no_grad():
                cache = model(prompt, use_cache=True).past_key_values
            out = greedy(model, prompt)
    assert torch.equal(same, base) and out.shape == (1, N + NEW)
    for index, layer in enumerate(cache.layers):
        kept = ctx.reports[0].layers[index].kept                          # [1, H_kv, K]
        assert kept.device.type == "cuda" and kept.shape[-1] == K
        rows = kept.unsqueeze(-1).expand(-1, -1, -1, layer.keys.shape[-1])
        assert torch.equal(layer.keys, full.layers[index].keys.gather(2, rows))
        assert torch.equal(layer.values, full.layers[index].values.gather(2, rows))
