"""Structured log lines for `gate worker`: one logfmt line per record, carrying the gate id.

    ts=2025-06-01T12:00:00.123Z level=info logger=gate.progress gate_id=5ed6... role=gate
      phase=reserved msg="   0.25s gate      reserved  reference on local-h200-0 GPU 0; ..."

The gate id comes from the record's `extra`, else from the gate the thread is running
(`gate.service.execution.CURRENT_GATE`), else from a Celery task id of the form `gate-<id>`.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Mapping
from typing import Any

from gate.service.execution import CURRENT_GATE

# Record attributes that are not extras; Celery's `data` repeats what its message says, and
# uvicorn's `color_message` repeats its message with terminal colour codes in it.
_STANDARD = set(logging.makeLogRecord({}).__dict__) | {
    "message",
    "asctime",
    "taskName",
    "data",
    "color_message",
}
# Terminal control sequences (CSI, OSC and lone escapes): a log line is for files and
# collectors, where `\x1b[36m` is noise, so none is written, whatever an engine or a library
# put in its text.
_ESCAPES = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
_FIRST = ("gate_id", "worker", "role", "phase", "scenario", "state", "verdict")


class GateIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "gate_id", None) is None:
            gate_id = CURRENT_GATE.get()
            if gate_id is None and isinstance(record.args, Mapping):
                task_id = str(record.args.get("id", ""))
                if task_id.startswith("gate-"):
                    gate_id = task_id.removeprefix("gate-")
            record.gate_id = gate_id
        return True


def _value(v: Any) -> str:
    s = _ESCAPES.sub("", str(v)).replace("\x1b", "")
    if s and not any(c in s for c in ' "=\n\t'):
        return s
    escaped = s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        parts = [
            f"ts={ts}.{int(record.msecs):03d}Z",
            f"level={record.levelname.lower()}",
            f"logger={record.name}",
        ]
        extra = {k: v for k, v in record.__dict__.items() if k not in _STANDARD}
        for key in (*_FIRST, *sorted(k for k in extra if k not in _FIRST)):
            value = extra.get(key)
            if value is not None and not key.startswith("_"):
                parts.append(f"{key}={_value(value)}")
        parts.append(f"msg={_value(record.getMessage())}")
        if record.exc_info:
            parts.append(f"exc={_value(self.formatException(record.exc_info))}")
        return " ".join(parts)


def configure_logging(level: int = logging.INFO) -> None:
    """One handler on the root logger, writing logfmt lines to stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter())
    handler.addFilter(GateIdFilter())
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level)
    for noisy in ("httpx", "httpcore", "alembic", "kombu", "amqp"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
