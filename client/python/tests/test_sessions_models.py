"""Sessions (per-layer and model-wide), automatic re-registration, and the C++ client's
answers on the same inputs."""

import re
import subprocess

import grpc
import pytest

import kvtrim

from conftest import BUNDLE, KVTRIM_CLI, LIBKVTRIM, SAMPLE


@pytest.mark.parametrize("native", [False, True])
def test_per_layer_answers_arrive_before_finish(server, layers, native):
    with kvtrim.Client(server.address, transport="inline", native=native,
                       library=LIBKVTRIM) as client:
        with client.session(policy="dropkv", keep=0.2) as session:
            for i, (k, v, q) in enumerate(layers):
                session.send(k, v, q, layer_id=i)
                assert session.result(i, timeout=60).kept_counts == [51] * 4
        result = session.finish()
    assert sorted(result.layers) == list(range(5))


def test_model_wide_policy_answers_at_finish(server, layers):
    with kvtrim.Client(server.address) as client:
        digest = client.register_model(str(BUNDLE))
        with client.session(policy="laprox", keep=0.2, model_digest=digest,
                            num_layers=5) as session:
            for i, (k, v, q) in enumerate(layers):
                session.send(k, v, q, layer_id=i)
        result = session.finish()
        unary = client.compress(layers=layers, policy="laprox", keep=0.2, model_digest=digest,
                                num_layers=5)
    assert result.summary.layers == 5
    # Model-wide: the total over layers is the budget, not each layer's.
    assert result.summary.tokens_kept == sum(sum(l.kept_counts) for l in unary.layers)
    for layer in unary.layers:
        assert [k.tolist() for k in layer.kept] == \
            [k.tolist() for k in result.layers[layer.layer_id].kept]


def test_lost_model_is_registered_again(server, layers):
    k, v, q = layers[0]
    with kvtrim.Client(server.address) as client, kvtrim.Client(server.address) as admin:
        digest = client.register_model(str(BUNDLE))
        expected = client.compress(k, v, q, policy="criticalkv", keep=0.2, model_digest=digest)
        admin.delete_model(digest)  # as a restarted replica without --data_dir would be
        again = client.compress(k, v, q, policy="criticalkv", keep=0.2, model_digest=digest)
        assert digest in {m.digest for m in admin.list_models().models}
        admin.delete_model(digest)
        with client.session(policy="criticalkv", keep=0.2, model_digest=digest) as session:
            session.send(k, v, q, layer_id=0)
        in_session = session.finish()
        # A client that never registered the model cannot recover: FAILED_PRECONDITION.
        admin.delete_model(digest)
        with pytest.raises(kvtrim.KvtrimError) as error:
            admin.compress(k, v, q, policy="criticalkv", keep=0.2, model_digest=digest)
        assert error.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert [x.tolist() for x in expected.layers[0].kept] == \
        [x.tolist() for x in again.layers[0].kept] == \
        [x.tolist() for x in in_session.layers[0].kept]


def cpp_client_lists(address, *flags):
    """{layer: [list, ...]} printed by the C++ client's compress --show_indices."""
    out = subprocess.run([str(KVTRIM_CLI), f"--target={address}", "compress",
                          f"--input={SAMPLE}", "--show_indices", *flags],
                         check=True, capture_output=True, text=True, timeout=120).stdout
    lists, layer = {}, None
    for line in out.splitlines():
        match = re.match(r"layer (\d+) ", line)
        if match:
            layer = int(match.group(1))
            lists[layer] = []
        match = re.match(r"\s+indices\[\w+\]: ?(.*)", line)
        if match:
            lists[layer].append([int(x) for x in match.group(1).split()])
    return lists


CASES = [
    ("dropkv", {"keep": 0.2}, ["--keep_fraction=0.2"]),
    ("snapkv+adakv", {"keep": 0.1}, ["--keep_fraction=0.1"]),
    ("pyramidkv", {"keep": 0.3, "num_layers": 5}, ["--keep_fraction=0.3", "--num_layers=5"]),
    ("knorm", {"keep_tokens": 33, "output_shape": "shared"},
     ["--keep_tokens=33", "--output_shape=shared"]),
    ("tova", {"keep": 0.2, "numerics": "exact"}, ["--keep_fraction=0.2", "--numerics=exact"]),
    ("criticalkv", {"keep": 0.2}, ["--keep_fraction=0.2", f"--model={BUNDLE}"]),
]


@pytest.mark.parametrize("policy,kwargs,flags", CASES, ids=[c[0] for c in CASES])
def test_answers_equal_the_cpp_clients(server, layers, policy, kwargs, flags):
    expected = cpp_client_lists(server.address, f"--policy={policy}", *flags)
    with kvtrim.Client(server.address) as client:
        if policy == "criticalkv":
            kwargs = dict(kwargs, model_digest=client.register_model(str(BUNDLE)))
        result = client.compress(layers=layers, policy=policy, **kwargs)
    assert sorted(expected) == list(range(5))
    for layer in result.layers:
        assert [k.tolist() for k in layer.kept] == expected[layer.layer_id], layer.layer_id
