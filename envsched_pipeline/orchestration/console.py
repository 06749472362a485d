"""The console logger of `envsched train`'s in-process Dagster runs: a run's warnings as one line
each, and nothing at ERROR or above — the driver reports each failed attempt itself, in one line
naming its cause, and the full error with its traceback stays in the run's event log (the Dagster
UI). Runs launched any other way keep Dagster's own console logger."""

from __future__ import annotations

import logging
import sys

import dagster as dg


class _FirstLine(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        meta = getattr(record, "dagster_meta", None) or {}
        source = str(meta.get("orig_message") or record.getMessage())  # Dagster's own text, unprefixed
        text = (source.strip().splitlines() or [""])[0]
        where = meta.get("step_key") or meta.get("job_name") or "dagster"
        return f"[{where}] {record.levelname.lower()}: {text}"


class _BelowError(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR


@dg.logger(
    config_schema={"log_level": dg.Field(str, default_value="WARNING", is_required=False)},
    description="One line per warning on stderr; errors are reported by `envsched train` itself.",
)
def envsched_console(init_context: dg.InitLoggerContext) -> logging.Logger:
    level = logging.getLevelName(init_context.logger_config["log_level"].upper())
    logger = logging.getLogger("envsched.dagster")  # one object for every run: runs here are sequential
    logger.propagate = False
    logger.setLevel(level if isinstance(level, int) else logging.WARNING)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_FirstLine())
    handler.addFilter(_BelowError())
    logger.handlers = [handler]
    return logger


LOGGERS = {"console": dg.colored_console_logger, "envsched_console": envsched_console}
