"""Generates the gRPC stubs of `approvals.v1` when the wheel is built.

The `.proto` files are the contract and live once, in the repository's `proto/`; no stub is
committed. Building from the repository (`pip install ./clients/python`) reads them from
`../../proto`; building from an sdist reads the copy the sdist carries in `proto/`. The stubs land
in the wheel as `approval_broker/_pb/approvals/v1/`, with their imports rewritten to that place,
so they never clash with another copy of the same stubs under the top-level name `approvals`.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PACKAGE = "approval_broker._pb"


def find_proto_root(project: Path) -> Path:
    for candidate in (project / "proto", project.parent.parent / "proto"):
        if (candidate / "approvals" / "v1" / "agent.proto").is_file():
            return candidate
    raise RuntimeError(
        f"approval_broker: no approvals/v1/*.proto under {project / 'proto'} or "
        f"{project.parent.parent / 'proto'}; build from a clone of the repository or from its sdist"
    )


def generate(proto_root: Path, out: Path) -> None:
    from grpc_tools import protoc  # a build requirement
    import grpc_tools

    protos = sorted(str(p.relative_to(proto_root)) for p in (proto_root / "approvals" / "v1").glob("*.proto"))
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{proto_root}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"approval_broker: protoc failed on {protos}")
    for directory in (out / "approvals", out / "approvals" / "v1"):
        (directory / "__init__.py").write_text("")
    for module in (out / "approvals" / "v1").iterdir():
        if module.suffix in (".py", ".pyi"):
            text = module.read_text()
            text = re.sub(r"^from approvals\.v1 import", f"from {PACKAGE}.approvals.v1 import", text, flags=re.M)
            text = re.sub(r"^import approvals\.v1\.", f"import {PACKAGE}.approvals.v1.", text, flags=re.M)
            if module.name.endswith("_grpc.py"):
                # grpcio-tools writes the service stubs without annotations.
                text = "# mypy: ignore-errors\n" + text
            module.write_text(text)
    (out / "__init__.py").write_text('"""Stubs generated from proto/approvals/v1 at build time."""\n')


class CustomBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        self._tmp = tempfile.mkdtemp(prefix="approval-broker-stubs-")
        out = Path(self._tmp)
        generate(find_proto_root(Path(self.root)), out)
        build_data["force_include"][str(out)] = "approval_broker/_pb"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)
