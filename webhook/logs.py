"""Structured JSON logs, one object per line, with context (``uid``, ``namespace``, ``pod``, ``job``) passed
with ``extra=`` as top-level keys. Messages are built from names and counts: no key material, no Secret data.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

CONTEXT_KEYS = ("uid", "namespace", "pod", "job", "result", "plugins", "operation")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in CONTEXT_KEYS:
            if key in record.__dict__:
                entry[key] = record.__dict__[key]
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def configure(level: str = "info") -> None:
    """Send every logger's records to stderr as JSON lines. uvicorn's per-request access lines only
    at ``debug``: the API server calls for every Pod, and the webhook logs its own decisions."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
    logging.getLogger("uvicorn.access").setLevel(logging.DEBUG if level.upper() == "DEBUG" else logging.WARNING)
