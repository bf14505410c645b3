"""structlog setup: key=value lines for people, JSON (`--log_as_json`) for log pipelines.

Levels are istiod's `--log_output_level scope:level,...`: `default` (or `all`, or a bare level)
sets every scope, a named scope overrides it for that scope alone (`ads:debug,default:info`
shows the ADS scope's debug lines and only info for the rest). Scopes are the names given to
`get()`: ads, agent, ambient, authn, bootstrap, ca, cache, debounce, files, kube, sds, ...

A running server changes one scope's level with `set_level()` (istiod's ControlZ "scopes" page:
`/debug/scopes` and `/debug/ui` here); `scopes()` lists every scope a module asked for.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING,
           "warning": logging.WARNING, "error": logging.ERROR, "fatal": logging.CRITICAL,
           "none": logging.CRITICAL + 10}
_DEFAULT_SCOPES = ("", "default", "all")


@dataclass(frozen=True)
class Levels:
    default: int = logging.INFO
    scopes: dict[str, int] = field(default_factory=dict)

    def lowest(self) -> int:
        return min((self.default, *self.scopes.values()))


def parse_levels(spec: str) -> Levels:
    """`scope:level,...` or a bare `level`. Raises ValueError naming the bad part."""
    default = logging.INFO
    scopes: dict[str, int] = {}
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        scope, _, lvl = part.rpartition(":")
        level = _LEVELS.get(lvl.strip().lower())
        if level is None:
            raise ValueError(f"unknown log level {lvl!r} in {part!r} (want one of {', '.join(_LEVELS)})")
        scope = scope.strip()
        if scope in _DEFAULT_SCOPES:
            default = level
        elif not scope.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"bad log scope {scope!r} in {part!r} (want scope:level, e.g. ads:debug)")
        else:
            scopes[scope] = level
    return Levels(default, scopes)


def parse_level(spec: str) -> int:
    """The default scope's level only (for callers with a single level)."""
    return parse_levels(spec).default


def _scope_filter(levels: Levels):
    def processor(_logger, method_name: str, event_dict):
        level = _METHOD_LEVELS.get(method_name, logging.INFO)
        if level < levels.scopes.get(event_dict.get("scope", ""), levels.default):
            raise structlog.DropEvent
        return event_dict

    return processor


_METHOD_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
                  "warn": logging.WARNING, "error": logging.ERROR, "exception": logging.ERROR,
                  "critical": logging.CRITICAL, "fatal": logging.CRITICAL, "msg": logging.INFO}


_current = Levels()
_as_json = False
# Every scope a module asked for, so an operator can see (and change) the ones that exist.
_known: set[str] = set()
_NAMES = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warn", logging.ERROR: "error",
          logging.CRITICAL: "fatal", logging.CRITICAL + 10: "none"}
LEVEL_NAMES = tuple(_NAMES.values())
DEFAULT_SCOPE = "default"


def level_name(level: int) -> str:
    return _NAMES.get(level, str(level))


def current() -> Levels:
    return _current


def scopes() -> list[dict]:
    """Each known scope (and `default`, what a scope without its own level uses) with the level
    in force and whether it is the scope's own or inherited from `default`."""
    out = [{"name": DEFAULT_SCOPE, "output_level": level_name(_current.default), "own_level": True}]
    for name in sorted((_known | set(_current.scopes)) - {""}):
        own = name in _current.scopes
        out.append({"name": name, "output_level": level_name(_current.scopes.get(name, _current.default)),
                    "own_level": own})
    return out


def set_level(scope: str, level_text: str) -> None:
    """Change one scope's level now (`default`: the level of every scope without its own).
    Raises ValueError for an unknown level or scope; lines already filtered stay dropped."""
    level = _LEVELS.get(level_text.strip().lower())
    if level is None:
        raise ValueError(f"unknown log level {level_text!r} (want one of {', '.join(LEVEL_NAMES)})")
    if scope in _DEFAULT_SCOPES:
        configure(Levels(level, dict(_current.scopes)), _as_json)
        return
    if scope not in _known and scope not in _current.scopes:
        raise ValueError(f"unknown log scope {scope!r} (known: {', '.join(sorted(_known))})")
    configure(Levels(_current.default, {**_current.scopes, scope: level}), _as_json)


def enabled(scope: str, level: int = logging.DEBUG) -> bool:
    """Whether a line of `scope` at `level` is logged: a hot path checks this first, because a
    filtered call through structlog's lazy logger still costs microseconds."""
    return level >= _current.scopes.get(scope, _current.default)


def configure(level: int | Levels = logging.INFO, as_json: bool = False) -> None:
    global _current, _as_json
    levels = _current = level if isinstance(level, Levels) else Levels(level)
    _as_json = as_json
    renderer = structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer(colors=False)
    processors: list[structlog.typing.Processor] = [structlog.contextvars.merge_contextvars]
    if levels.scopes:  # only then does a line's scope decide; otherwise the bound logger filters alone
        processors.append(_scope_filter(levels))
    processors += [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
        renderer,
    ]
    structlog.configure(
        processors=processors,
        # The cheapest filter runs first: nothing below the lowest level any scope wants is built.
        wrapper_class=structlog.make_filtering_bound_logger(levels.lowest()),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def get(name: str):
    _known.add(name)
    return structlog.get_logger(scope=name)
