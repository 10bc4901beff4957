"""Generate fluxmq/_pb from proto/ (``--check``: fail if the committed stubs are out of date).

protoc names generated modules after the .proto paths (``fluxmq/v1/queue_pb2.py`` importing
``fluxmq.v1``); we keep descriptor names as they are (``fluxmq/v1/queue.proto``, what reflection
shows) but place the modules under ``fluxmq/_pb/`` and rewrite their imports to match.
"""

from __future__ import annotations

import argparse
import filecmp
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO = ROOT / "proto"
OUT = ROOT / "fluxmq" / "_pb"
IMPORT_RE = re.compile(r"^from fluxmq\.(v1|internal) import", re.M)
# The gRPC stubs refuse to import under a grpcio older than the grpcio-tools that generated
# them. They use nothing newer than pyproject's floor (grpcio>=1.70), so they say that floor:
# the stubs are then the same whichever patch release of grpcio-tools a machine installs.
GRPC_FLOOR = "1.70.0"
DESCRIPTOR_SET = "descriptors_with_comments.binpb"  # a FileDescriptorSet of proto/, comments kept
GENERATED_VERSION_RE = re.compile(r"^GRPC_GENERATED_VERSION = '[^']*'$", re.M)


def generate(dest: Path) -> None:
    import grpc_tools

    files = sorted(str(p.relative_to(PROTO)) for p in PROTO.rglob("*.proto"))
    include = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTO}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *files,
        ]
        subprocess.run(cmd, check=True)
        # The same files with their comments (source info), for reflection: grpcurl describe
        # shows them (fluxmq/server/reflection.py). The generated modules carry none.
        described = Path(tmp) / DESCRIPTOR_SET
        subprocess.run(
            [*cmd[:5], "--include_source_info", f"--descriptor_set_out={described}", *files],
            check=True,
        )
        gen = Path(tmp) / "fluxmq"
        for path in sorted(gen.rglob("*.py*")):
            rel = path.relative_to(gen)
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            text = IMPORT_RE.sub(lambda m: f"from fluxmq._pb.{m.group(1)} import", path.read_text())
            text = GENERATED_VERSION_RE.sub(f"GRPC_GENERATED_VERSION = '{GRPC_FLOOR}'", text)
            target.write_text(text)
        for sub in {p.relative_to(gen).parent for p in gen.rglob("*.py")}:
            (dest / sub / "__init__.py").touch()
        shutil.copyfile(described, dest / DESCRIPTOR_SET)
    (dest / "__init__.py").write_text('"""Generated from proto/ by tools/gen_proto.py."""\n')


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    if not args.check:
        shutil.rmtree(OUT, ignore_errors=True)
        generate(OUT)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "_pb"
        generate(fresh)
        stale = []
        for path in fresh.rglob("*"):
            if path.is_file():
                old = OUT / path.relative_to(fresh)
                if not old.exists() or not filecmp.cmp(path, old, shallow=False):
                    stale.append(str(old.relative_to(ROOT)))
        if stale:
            print("generated stubs are out of date (run `make proto`):", *stale, sep="\n  ")
            return 1
    print("proto stubs up to date")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
