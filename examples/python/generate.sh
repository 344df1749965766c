#!/usr/bin/env bash
# Generates the Python modules for the broker's API from proto/ into examples/python/gen/
# (gitignored: the .proto files are the source, the stubs are rebuilt, never committed).
#
# Needs grpcio-tools (requirements.txt) in the Python it runs: `python3`, or set PYTHON, e.g.
# PYTHON=.venv/bin/python examples/python/generate.sh
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PROTO="$(cd "$HERE/../../proto" && pwd)"
PYTHON="${PYTHON:-python3}"

rm -rf "$HERE/gen"
mkdir "$HERE/gen"
# grpc_tools adds the well-known types (google/protobuf/timestamp.proto) to the include path.
"$PYTHON" -m grpc_tools.protoc -I "$PROTO" \
    --python_out="$HERE/gen" --pyi_out="$HERE/gen" --grpc_python_out="$HERE/gen" \
    "$PROTO"/approvals/v1/*.proto
echo "generated $(find "$HERE/gen" -name '*.py' | wc -l) modules in $HERE/gen"
