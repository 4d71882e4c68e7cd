"""protostubs.py - Python stubs of proto/refit/v1 for the tests and benchmarks.

generate(prefix) runs grpc_tools on proto/refit/v1/refit.proto into a new
temporary folder and puts that folder first on sys.path, so that
`from refit.v1 import refit_pb2` works afterwards.  Run from the repository
root, like every test here.  Returns the folder (tests keep their files in it).
"""
import os
import subprocess
import sys
import tempfile


def generate(prefix):
    tmp = tempfile.mkdtemp(prefix=prefix)
    # REFIT_PROTO_STUBS: stubs made before (tests/gpu/device-run.sh prepare:
    # the GPU machine has grpcio and protobuf, not grpc_tools)
    made = os.environ.get("REFIT_PROTO_STUBS")
    if made:
        sys.path.insert(0, tmp)
        sys.path.insert(1, made)
        return tmp
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-Iproto",
                    f"--python_out={tmp}", f"--grpc_python_out={tmp}",
                    "proto/refit/v1/refit.proto"], check=True)
    sys.path.insert(0, tmp)
    return tmp
