"""Build hook of the kvtrim Python package: generates the gRPC stubs from the repo's proto.

`kvtrim/v1/kvtrim_pb2.py` and `kvtrim/v1/kvtrim_pb2_grpc.py` are written from
`<repo>/proto/kvtrim/v1/kvtrim.proto` with grpcio-tools before the package is built (they are
git-ignored). The generated modules import each other as `kvtrim.v1.*`, which is this
package's own `kvtrim.v1` subpackage.
"""

import os
import pathlib

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"
PROTO_FILE = PROTO_ROOT / "kvtrim" / "v1" / "kvtrim.proto"


def generate_stubs() -> None:
    """Runs protoc (grpcio-tools) on kvtrim.proto into kvtrim/v1/ of this directory."""
    out = HERE / "kvtrim" / "v1"
    if not PROTO_FILE.exists():
        if (out / "kvtrim_pb2.py").exists():
            return  # an sdist built earlier carries the generated stubs
        raise RuntimeError(f"kvtrim: {PROTO_FILE} not found; build from the repository")
    from grpc_tools import protoc  # build requirement
    import grpc_tools

    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    args = ["grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--python_out={HERE}",
            f"--pyi_out={HERE}", f"--grpc_python_out={HERE}", str(PROTO_FILE)]
    if protoc.main(args) != 0:
        raise RuntimeError("kvtrim: protoc failed on " + str(PROTO_FILE))


class BuildWithStubs(build_py):
    """build_py that generates the stubs first."""

    def run(self):
        generate_stubs()
        super().run()


setup(cmdclass={"build_py": BuildWithStubs})
