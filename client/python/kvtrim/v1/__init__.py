"""Generated gRPC stubs of proto/kvtrim/v1/kvtrim.proto (built by setup.py)."""
