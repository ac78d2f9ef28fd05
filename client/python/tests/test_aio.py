"""The asyncio client: the same answers and errors as the synchronous one."""

import asyncio

import grpc
import pytest

import kvtrim
from kvtrim.aio import AsyncClient

from conftest import BUNDLE


def test_async_client(server, layers):
    async def run():
        async with AsyncClient(server.address) as client:
            assert await client.health() == "SERVING"
            assert len((await client.list_policies()).policies) > 10
            unary = await client.compress(layers=layers, policy="dropkv", keep=0.2)
            async with client.session(policy="dropkv", keep=0.2) as session:
                for i, (k, v, q) in enumerate(layers):
                    await session.send(k, v, q, layer_id=i)
                first = await session.result(0)
            digest = await client.register_model(str(BUNDLE))
            assert digest in {m.digest for m in (await client.list_models()).models}
            with pytest.raises(kvtrim.KvtrimError) as error:
                await client.compress(layers=layers, policy="nope", keep=0.2)
            assert error.value.field == "settings.policy.name"
            await client.delete_model(digest)
            with pytest.raises(kvtrim.KvtrimError) as error:
                await client.delete_model(digest)
            assert error.value.code == grpc.StatusCode.NOT_FOUND
            return unary, first, session

    unary, first, session = asyncio.run(run())
    with kvtrim.Client(server.address) as client:
        sync = client.compress(layers=layers, policy="dropkv", keep=0.2)
    assert [k.tolist() for k in unary.layers[0].kept] == [k.tolist() for k in first.kept]
    assert [[k.tolist() for k in l.kept] for l in unary.layers] == \
        [[k.tolist() for k in l.kept] for l in sync.layers]
