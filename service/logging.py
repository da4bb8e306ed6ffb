"""Structured logs: one JSON object per line, and one line per finished request (`log_request`).

Request lines carry `event="request"` and the fields a dashboard or `jq` needs: id, worker, status, tokens, TTFT,
duration and acceptance (mean tokens per verify round). Everything else the service logs goes through the same
formatter, so `python -m service 2>&1 | jq` works.
"""

from __future__ import annotations

import json
import logging
import sys
import time

from deepspec_protocol.worker import RequestStats

_request_logger = logging.getLogger("service.requests")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": round(record.created, 3), "level": record.levelname, "logger": record.name}
        fields = getattr(record, "fields", None)
        if fields:
            entry.update(fields)
        else:
            entry["msg"] = record.getMessage()
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").disabled = True  # the request line below replaces it


def log_request(
    *,
    request_id: str,
    api: str,
    model: str,
    worker: str | None,
    status: str,
    stats: RequestStats,
    ttft_s: float | None,
    duration_s: float,
    error: str | None = None,
) -> None:
    if not _request_logger.isEnabledFor(logging.INFO):
        return
    tau = stats.acceptance_length
    fields = {
        "event": "request",
        "id": request_id,
        "api": api,
        "model": model,
        "worker": worker,
        "status": status,
        "prompt_tokens": stats.num_prompt_tokens,
        "completion_tokens": stats.num_output_tokens,
        "ttft_s": None if ttft_s is None else round(ttft_s, 4),
        "duration_s": round(duration_s, 4),
        "draft_tokens": stats.num_draft_tokens,
        "accepted_tokens": stats.num_accepted_tokens,
        "acceptance_length": None if tau is None else round(tau, 3),
    }
    if error:
        fields["error"] = error
    _request_logger.info("request", extra={"fields": fields})


def now() -> float:
    return time.perf_counter()
