"""The Python clients against kvtrimd --auth_tokens_file: every call carries the bearer
token (grpcio, grpc.aio, the native C++ client); without one, or with an unknown one,
calls are refused UNAUTHENTICATED naming "authorization", and the token is never echoed."""

import asyncio

import grpc
import pytest

import kvtrim
import kvtrim.aio

from conftest import LIBKVTRIM, Server

ALPHA = "alpha-token-0123456789abcdef"
BETA = "beta-token-0123456789abcdef0"


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory):
    """kvtrimd with two tenants' tokens and regions allowed."""
    directory = tmp_path_factory.mktemp("kvtrimd_auth")
    tokens = directory / "tokens"
    tokens.write_text(f"# token tenant\n{ALPHA} alpha\n{BETA} beta\n")
    s = Server(directory, f"--auth_tokens_file={tokens}", "--allow_client_shm")
    yield s
    s.stop()


def test_calls_need_a_listed_token(auth_server, layers):
    k, v, q = layers[0]
    for native in (False, True):
        with kvtrim.Client(auth_server.address, auth_token=ALPHA, native=native,
                           library=LIBKVTRIM) as client:
            assert client.health() == "SERVING"
            assert client.list_policies().policies
            answer = client.compress(k, v, q, policy="dropkv", keep=0.2)
            assert answer.layers[0].kept_counts
            with client.session(policy="dropkv", keep=0.2) as session:
                session.send(k, v, q, layer_id=0)
            assert session.finish().layers[0].kept_counts == answer.layers[0].kept_counts
    wrong = "wrong-token-0123456789abcdef"
    for token in (None, wrong):
        for native in (False, True):
            with kvtrim.Client(auth_server.address, auth_token=token, native=native,
                               library=LIBKVTRIM) as client:
                assert client.health() == "SERVING"  # probes need no token
                with pytest.raises(kvtrim.KvtrimError) as error:
                    client.compress(k, v, q, policy="dropkv", keep=0.2)
                assert error.value.code == grpc.StatusCode.UNAUTHENTICATED
                assert error.value.field == "authorization"
                assert wrong not in str(error.value)


def test_host_shm_regions_with_a_token(auth_server, layers):
    """The lease stream carries the token too: host-shm tensors through regions."""
    k, v, q = layers[0]
    with kvtrim.Client(auth_server.address, auth_token=BETA, native=False,
                       transport="regions", region_min_bytes=0) as client:
        shared = client.compress(k, v, q, policy="dropkv", keep=0.2)
        inline = client.compress(k, v, q, policy="dropkv", keep=0.2, transport="inline")
        assert [x.tolist() for x in shared.layers[0].kept] == \
            [x.tolist() for x in inline.layers[0].kept]


def test_async_client_sends_the_token(auth_server, layers):
    k, v, q = layers[0]

    async def run(token):
        async with kvtrim.aio.AsyncClient(auth_server.address, auth_token=token) as client:
            return await client.compress(k, v, q, policy="dropkv", keep=0.2)

    assert asyncio.run(run(ALPHA)).layers[0].kept_counts
    with pytest.raises(kvtrim.KvtrimError) as error:
        asyncio.run(run(None))
    assert error.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_malformed_tokens_are_refused_before_any_call():
    with pytest.raises(kvtrim.KvtrimError) as error:
        kvtrim.Client("127.0.0.1:1", auth_token="short")
    assert error.value.field == "auth_token"
    assert "short" not in str(error.value)
