"""Log format: plain text by default, one JSON object per line with ``--log-json``; every line
carries the request id of the call it belongs to ("-" outside calls).

Whatever a call site puts into a message, the message is one line of printable text of at most
``LOG_MESSAGE_CHARS_MAX`` characters (control characters escaped, the rest cut): a caller
cannot forge a line, nor make one call cost unbounded log. A traceback, ours, keeps its lines.
"""

from __future__ import annotations

import json
import logging
import sys

from fluxmq.core.text import LOG_MESSAGE_CHARS_MAX, printable
from fluxmq.server.interceptors import request_id_var


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        return True


class _OneLineFilter(logging.Filter):
    """Renders the message once, escaped and bounded (see the module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a call site's bad arguments: the formatter reports them as usual
            return True
        safe = printable(message, LOG_MESSAGE_CHARS_MAX)
        if safe is not message or record.args:
            record.msg, record.args = safe, None
        return True


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "request_id": getattr(record, "request_id", "-"),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup(level: str, as_json: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_RequestIdFilter())
    handler.addFilter(_OneLineFilter())
    if as_json:
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
