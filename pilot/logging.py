"""structlog setup: key=value lines for people, JSON (`--log_as_json`) for log pipelines."""

from __future__ import annotations

import logging
import sys

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING,
           "warning": logging.WARNING, "error": logging.ERROR, "none": logging.CRITICAL + 10}


def parse_level(spec: str) -> int:
    """istiod's `--log_output_level` is `scope:level,...` or just `level`; we honour the default
    scope (or a bare level) and accept other scopes without failing."""
    level = logging.INFO
    for part in filter(None, (p.strip() for p in spec.split(","))):
        scope, _, lvl = part.rpartition(":")
        if scope in ("", "default", "all"):
            if lvl.lower() not in _LEVELS:
                raise ValueError(f"unknown log level {lvl!r} (want one of {', '.join(_LEVELS)})")
            level = _LEVELS[lvl.lower()]
    return level


def configure(level: int = logging.INFO, as_json: bool = False) -> None:
    renderer = structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def get(name: str):
    return structlog.get_logger(scope=name)
