"""The ``--py-files`` archive: FluxMQ's own Python packages, for Spark's driver and executors.

    fluxmq-audit --py-files-archive fluxmq-audit.zip
    spark-submit --master spark://host:7077 --py-files fluxmq-audit.zip \\
        "$(fluxmq-audit --job-path)" --data-dir /shared/n1 --out /shared/report

With it, the Python that spark-submit runs (driver and executors) needs only the third-party
packages (``THIRD_PARTY``), not fluxmq: in client mode spark-submit puts the archive on the
driver's PYTHONPATH before the job file runs, and ships it to every executor's Python workers.

The archive holds every module of ``PACKAGES`` (pure Python, the generated protobuf modules
included), not just what the audit imports today: a module imported lazily, or by a child
process, is there too. No bytecode: it would tie the archive to one Python version.
"""

from __future__ import annotations

import os
import zipfile

from fluxmq.audit.layout import AuditUsageError

# What fluxmq.audit imports, transitively, of ours (tests/audit/test_audit_spark_cluster.py
# checks this against the import graph).
PACKAGES = ("fluxmq", "storage")
# What the archive does not carry: the driver's and the executors' Python must have these
# (matplotlib on the driver only: the report's chart).
THIRD_PARTY = ("pyspark", "pyarrow", "pandas", "lmdb", "google.protobuf", "crc32c", "matplotlib")
# A fixed time stamp: the same sources give the same archive, byte for byte.
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)


def package_dir(package: str) -> str:
    """The directory a package of ours is imported from."""
    module = __import__(package)
    path = os.path.dirname(os.path.abspath(module.__file__ or ""))
    if not os.path.isfile(os.path.join(path, "__init__.py")):
        # Imported from an archive itself (this very one, under spark-submit): no files to copy.
        raise AuditUsageError(
            f"--py-files-archive: {package} is not installed as files here ({path}); "
            "run it with the Python that has fluxmq installed"
        )
    return path


def archive_members() -> list[tuple[str, str]]:
    """(name in the archive, file) of every module of ``PACKAGES``, in name order."""
    members: list[tuple[str, str]] = []
    for package in PACKAGES:
        root = package_dir(package)
        top = os.path.dirname(root)
        for dirpath, dirnames, filenames in os.walk(root):
            # Only packages: a directory without __init__.py (caches, stray data) is not imported.
            dirnames[:] = [
                d for d in dirnames if os.path.isfile(os.path.join(dirpath, d, "__init__.py"))
            ]
            for name in filenames:
                if name.endswith(".py"):
                    path = os.path.join(dirpath, name)
                    members.append((os.path.relpath(path, top).replace(os.sep, "/"), path))
    return sorted(members)


def write_archive(out: str) -> int:
    """Write the archive to ``out`` (replacing a file there); returns how many modules."""
    if os.path.isdir(out):
        raise AuditUsageError(f"--py-files-archive {out!r} is a directory (give a file name)")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise AuditUsageError(f"--py-files-archive {out!r}: no such directory {parent!r}")
    members = archive_members()
    # Written beside and renamed: a spark-submit reading the old archive never sees half a zip.
    tmp = f"{out}.tmp-{os.getpid()}"
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, path in members:
                info = zipfile.ZipInfo(name, _ZIP_DATE)
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                with open(path, "rb") as f:
                    zf.writestr(info, f.read())
        os.replace(tmp, out)
    except OSError as err:
        raise AuditUsageError(f"--py-files-archive {out!r}: {err}") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return len(members)
