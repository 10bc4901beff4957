"""Names threads for the operating system, so ``top -H``, ``py-spy`` and ``/proc/<pid>/task``
(``bench.threads``) tell the Raft driver, the apply thread and the journal writer apart.

Python's thread names live only inside the interpreter (3.11 does not pass them to the kernel).
Linux keeps 15 bytes of a thread's name; elsewhere this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_PR_SET_NAME = 15
OS_THREAD_NAME_BYTES_MAX = 15

_libc: ctypes.CDLL | None = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        _libc = None


def set_os_thread_name(name: str) -> bool:
    """Name the calling thread (its first 15 bytes). -> whether the kernel took it."""
    if _libc is None:
        return False
    raw = name.encode("utf-8", "replace")[:OS_THREAD_NAME_BYTES_MAX]
    return int(_libc.prctl(_PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0)) == 0
