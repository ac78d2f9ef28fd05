"""kvtrim: the Python client of the kvtrim KV-cache eviction sidecar.

    import kvtrim
    with kvtrim.Client("127.0.0.1:50051") as client:
        result = client.compress(keys, values, queries, policy="dropkv", keep=0.2)
        kept = result.layers[0].kept        # one ascending index array per KV head

See docs/python.md in the repository for sessions, model registration, zero-copy regions,
asyncio (kvtrim.aio) and the transformers integration (kvtrim.hf).
"""

from .client import Client, TlsConfig
from .errors import KvtrimError
from .layers import Layer
from .models import ModelBundle
from .results import CompressResult, HeadStats, LayerDecision, SessionResult, SessionSummary
from .session import Session
from .settings import build_settings

__all__ = ["Client", "TlsConfig", "KvtrimError", "Layer", "ModelBundle", "CompressResult",
           "HeadStats", "LayerDecision", "SessionResult", "SessionSummary", "Session",
           "build_settings"]
__version__ = "0.1.0"
