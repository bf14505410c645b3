"""Read a YAML stream into plain documents (dicts, lists, str, int, float, bool, None) the way
kubectl and the apiserver read manifests, with bounds an attacker cannot talk us past.

Syntax is parsed by ruamel.yaml (a maintained YAML 1.2 parser). Scalars are resolved here, by the
YAML 1.2 core schema and nothing else: `1.2.3.4`, `001:db8::`, `1:20`, `on`, `no`, `2026-12-01`
and `1_000` are strings; `0o17` is 15, `017` is 17, `0x1F` is 31. The document is built from the
parser's event stream rather than by ruamel's constructor because that is where the bounds are
cheap to enforce and no recursion is needed at any depth:

- nesting deeper than MAX_DEPTH is refused at the event that crosses it;
- aliases are shared, never copied, and each one is charged the size of the subtree it points at,
  so a "billion laughs" document is refused after a few thousand events, before anything walks
  the expanded tree (validation, comparison, /debug dumps would);
- files over MAX_FILE_BYTES are refused before parsing (see files.py).

Speed: libyaml's parser (ruamel.yaml.clib) produces events about 15x faster than the pure-Python
1.2 parser, but it implements YAML 1.1 syntax. Fuzzing found where the two read the same text
differently (anchor names: libyaml ends `&name:` at the colon; tabs; `...` followed by content;
a token starting with `:`), so libyaml only reads "plain" text, without anchors, aliases, tags,
directives, tabs or document-end markers (what kubectl and Helm write); everything else, and
anything libyaml fails on (e.g. `[001:db8::]`, 1.2 syntax), goes to the pure 1.2 parser, from
the document where libyaml stopped. tests/unit/test_file_source_fuzz.py checks that both paths
give the same documents.

Error messages never quote the document: a Secret's key may be in it. They give the line, the
column and what was wrong.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

from ruamel.yaml import YAML
from ruamel.yaml import events as ev
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.main import CParser

# ruamel.yaml.clib (libyaml) is an optional speed-up, never a difference in results.
HAVE_C_PARSER = CParser is not None

MAX_FILE_BYTES = 3 << 20
"""Larger files are refused unread. The apiserver refuses request bodies over 3 MiB; parsing one
takes ~1 s of a core with the C parser (and would take ~15 s with the pure one)."""
MAX_DEPTH = 100
"""Deepest nesting of mappings and sequences accepted (real manifests stay under 20)."""
ALIAS_FLOOR = 10_000
"""Aliases may add at most as many nodes as the document itself has written, plus this many."""
PURE_FALLBACK_MAX_BYTES = 256 << 10
"""The slow 1.2 parser re-reads at most this much of a file that libyaml could not parse (a few
seconds of a core at worst); past it the libyaml error is the answer."""

_CORE = "tag:yaml.org,2002:"
# Where libyaml (YAML 1.1) and YAML 1.2 read the same text differently, it is around these: anchor
# and alias names (libyaml ends them at `:`), tags, directives, tabs, `...` document ends, `?`/`:`
# starting a token, NEL/LS/PS and BOMs. Text with none of them at a token start is what kubectl
# and Helm write, and is left to the C parser; the rest goes to the pure 1.2 parser.
_NOT_PLAIN = re.compile(r"(?:^|[\s\[{,])[&*!%@`?:]|[\t\x85\u2028\u2029\ufeff]|^\.\.\.", re.MULTILINE)
_NULL = re.compile(r"(?:~|null|Null|NULL)?\Z")
_BOOL = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_INT10 = re.compile(r"[-+]?[0-9]+\Z")
_INT8 = re.compile(r"0o[0-7]+\Z")
_INT16 = re.compile(r"0x[0-9a-fA-F]+\Z")
_FLOAT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?\Z")
_INF = re.compile(r"[-+]?\.(?:inf|Inf|INF)\Z")
_NAN = re.compile(r"\.(?:nan|NaN|NAN)\Z")


class DocumentRefused(ValueError):
    """One document is not accepted (limit, tag, key); the rest of the stream is still read."""


class StreamError(ValueError):
    """The stream is not YAML from some point on; `message` has the line and column only."""

    def __init__(self, message: str, documents_before: int) -> None:
        super().__init__(message)
        self.message = message
        self.documents_before = documents_before  # complete documents read before the failure
        self.doc_line = 0  # 0-based line where the failing document starts


class LimitError(StreamError):
    """A bound was crossed where reading on would cost more than the bound saves (nesting: every
    further level makes both parsers' scanners slower); the rest of the stream is not read."""


class _TooDeep(Exception):
    pass


@dataclass(frozen=True)
class Document:
    index: int
    value: object = None
    refused: str = ""  # why the document was refused ("" when it was read)


def _where(mark) -> str:
    if mark is None:
        return ""
    return f"line {mark.line + 1}, column {mark.column + 1}"


# Problems the parsers report may quote the document ("found duplicate key 'x' with value 'y'",
# "found undefined alias 'z'"): keep quoted text only when it is one or two characters (the
# offending punctuation), which is what makes a syntax error understandable.
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_TOKEN = re.compile(r"'<[a-z ]+>'")  # the parser's token names: '<stream end>', '<block end>'


def _scrub(text: str | None) -> str:
    if not text:
        return ""
    return _QUOTED.sub(
        lambda m: m.group(0) if len(m.group(0)) <= 4 or _TOKEN.fullmatch(m.group(0)) else "'...'", text
    )


def describe_error(e: BaseException) -> str:
    if isinstance(e, MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        problem = _scrub(e.problem) or type(e).__name__
        context = _scrub(e.context)
        text = f"{context}: {problem}" if context else problem
        where = _where(mark)
        return f"{text} at {where}" if where else text
    return type(e).__name__


def _resolve_plain(value: str):
    if _NULL.match(value):
        return None
    b = _BOOL.get(value)
    if b is not None:
        return b
    if _INT10.match(value):
        return int(value)
    if _INT8.match(value):
        return int(value, 0)
    if _INT16.match(value):
        return int(value, 0)
    if _FLOAT.match(value):
        return float(value)
    if _INF.match(value):
        return -math.inf if value[0] == "-" else math.inf
    if _NAN.match(value):
        return math.nan
    return value


def _tag_name(tag: str) -> str:
    return "!!" + tag[len(_CORE) :] if tag.startswith(_CORE) else "(application-specific)"


def _scalar(e: ev.ScalarEvent):
    tag = e.tag if e.tag is None or isinstance(e.tag, str) else str(getattr(e.tag, "value", e.tag))
    plain = e.style in (None, "") and e.implicit[0]
    if tag is None or tag == "!":
        if not plain or tag is not None:
            return e.value
        try:
            return _resolve_plain(e.value)
        except ValueError:
            raise DocumentRefused(f"scalar at {_where(e.start_mark)} is too large a number") from None
    if tag == _CORE + "str":
        return e.value
    try:
        resolved = _resolve_plain(e.value)
    except ValueError:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise DocumentRefused(f"scalar at {_where(e.start_mark)} is too large a number") from None
    for name, kind in (("null", type(None)), ("bool", bool), ("int", int), ("float", float)):
        if tag == _CORE + name:
            if name == "float" and type(resolved) is int:
                return float(resolved)
            if type(resolved) is kind:
                return resolved
            raise DocumentRefused(f"scalar at {_where(e.start_mark)} is not a valid !!{name}")
    raise DocumentRefused(f"unsupported tag {_tag_name(tag)} at {_where(e.start_mark)}")


def _key(value, mark) -> str:
    """Mapping keys become strings as the YAML-to-JSON conversion kubectl uses makes them."""
    if isinstance(value, str):
        return value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    raise DocumentRefused(f"mapping key at {_where(mark)} is not a scalar")


class _Builder:
    """Builds one document from events with an explicit stack (no recursion at any depth)."""

    def __init__(self) -> None:
        self.stack: list[list] = []  # [container, size, pending key or _NO_KEY, merges, key marks]
        self.anchors: dict[str, tuple[object, int]] = {}
        self.written = 0  # nodes present in the text
        self.expanded = 0  # nodes added by aliases and merges
        self.root: object = None
        self.done = False

    def _check_budget(self, mark) -> None:
        if self.expanded > self.written + ALIAS_FLOOR:
            raise DocumentRefused(
                f"aliases expand the document past {self.written + ALIAS_FLOOR} nodes (at {_where(mark)}); "
                f"aliases may add at most as many nodes as are written plus {ALIAS_FLOOR}"
            )

    def _add(self, value, size: int, mark, anchor: str | None, is_merge_key: bool = False) -> None:
        if anchor:
            self.anchors[anchor] = (value, size)
        if not self.stack:
            self.root, self.done = value, True
            return
        top = self.stack[-1]
        top[1] += size
        container = top[0]
        if isinstance(container, list):
            container.append(value)
            return
        if top[2] is _NO_KEY:
            if isinstance(value, dict | list) and not is_merge_key:
                raise DocumentRefused(f"mapping key at {_where(mark)} is not a scalar")
            top[2] = _MERGE if is_merge_key else _key(value, mark)
            top[4] = mark
            return
        key, top[2] = top[2], _NO_KEY
        if key is _MERGE:
            sources = value if isinstance(value, list) else [value]
            if not all(isinstance(s, dict) for s in sources):
                raise DocumentRefused(
                    f"merge key at {_where(top[4])} must name a mapping or a list of mappings"
                )
            top[3].extend(sources)
            return
        if key in container:
            raise DocumentRefused(f"duplicate mapping key at {_where(top[4])}")
        container[key] = value

    def event(self, e) -> None:
        if isinstance(e, ev.ScalarEvent):
            self.written += 1
            value = _scalar(e)
            merge = (
                e.value == "<<"
                and e.tag is None
                and e.style in (None, "")
                and self.stack
                and isinstance(self.stack[-1][0], dict)
                and self.stack[-1][2] is _NO_KEY
            )
            self._add(value, 1, e.start_mark, e.anchor, is_merge_key=bool(merge))
        elif isinstance(e, ev.MappingStartEvent | ev.SequenceStartEvent):
            self.written += 1
            if len(self.stack) >= MAX_DEPTH:
                raise _TooDeep(f"nested deeper than {MAX_DEPTH} levels at {_where(e.start_mark)}")
            tag = e.tag if e.tag is None or isinstance(e.tag, str) else str(getattr(e.tag, "value", e.tag))
            want = "map" if isinstance(e, ev.MappingStartEvent) else "seq"
            if tag not in (None, "!", _CORE + want):
                raise DocumentRefused(f"unsupported tag {_tag_name(tag)} at {_where(e.start_mark)}")
            container: dict | list = {} if want == "map" else []
            self.stack.append([container, 1, _NO_KEY, [], None, e.anchor, e.start_mark])
        elif isinstance(e, ev.MappingEndEvent | ev.SequenceEndEvent):
            container, size, _, merges, _, anchor, mark = self.stack.pop()
            if merges:  # YAML merge keys (kubectl's go-yaml applies them): explicit keys win,
                merged: dict = {}  # then earlier mappings in the merge list
                for m in reversed(merges):
                    merged.update(m)
                    self.expanded += len(m)
                self._check_budget(mark)
                merged.update(container)
                container = merged
            self._add(container, size, mark, anchor)
        elif isinstance(e, ev.AliasEvent):
            if e.anchor not in self.anchors:
                raise DocumentRefused(f"alias to an undefined anchor at {_where(e.start_mark)}")
            value, size = self.anchors[e.anchor]
            self.expanded += size
            self._check_budget(e.start_mark)
            self._add(value, size, e.start_mark, None)


_NO_KEY = object()
_MERGE = object()


def _events(text: str, pure: bool) -> Iterator:
    return YAML(typ="safe", pure=pure).parse(text)


def _read(text: str, pure: bool, first_index: int, out: list[Document]) -> None:
    """Append the documents of `text` to `out`. Raises StreamError (with the number of complete
    documents before the failure and, in `__cause__`, the parser's error)."""
    index = first_index - 1
    start = len(out)
    builder: _Builder | None = None
    refused = ""
    doc_line = 0
    events = _events(text, pure)
    try:
        for e in events:
            if isinstance(e, ev.DocumentStartEvent):
                index += 1
                builder, refused = _Builder(), ""
                doc_line = e.start_mark.line if e.start_mark is not None else 0
            elif isinstance(e, ev.DocumentEndEvent):
                out.append(Document(index, None if refused or builder is None else builder.root, refused))
                builder = None
            elif builder is not None and not refused:
                try:
                    builder.event(e)
                except DocumentRefused as r:
                    refused = str(r)  # keep reading events (cheaply) to the end of the document
    except _TooDeep as e:
        err = LimitError(f"{e}; the rest of the file is not read", len(out) - start)
        err.doc_line = doc_line
        raise err from None
    except YAMLError as e:
        err = StreamError(describe_error(e), len(out) - start)
        err.doc_line = doc_line
        raise err from e
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()


def _shift(message: str, offset: int) -> str:
    return (
        message
        if not offset
        else re.sub(r"line (\d+)", lambda m: f"line {int(m.group(1)) + offset}", message)
    )


def is_plain(text: str) -> bool:
    """Text the C parser reads exactly as the YAML 1.2 parser would (see _NOT_PLAIN)."""
    return HAVE_C_PARSER and not _NOT_PLAIN.search(text)


def load_documents(text: str, *, pure: bool | None = None) -> list[Document]:
    """Every document of the stream, in order; raises StreamError when the stream is not YAML.

    `pure=None` uses the C parser for plain manifests and the pure 1.2 parser for the rest; True
    or False forces one (tests compare them)."""
    out: list[Document] = []
    if pure is True or not HAVE_C_PARSER or (pure is None and _NOT_PLAIN.search(text)):
        if pure is None and len(text.encode("utf-8", "surrogatepass")) > PURE_FALLBACK_MAX_BYTES:
            raise LimitError(
                f"a file over {PURE_FALLBACK_MAX_BYTES} bytes uses YAML features (anchors, "
                "aliases, tags, directives, tabs, document end markers) that only the slower "
                "YAML 1.2 parser reads exactly; split it into smaller files",
                0,
            )
        _read(text, True, 0, out)
        return out
    try:
        _read(text, False, 0, out)
        return out
    except LimitError:
        raise
    except StreamError as c_error:
        if pure is False:
            raise
        start_line = c_error.doc_line
        lines = text.splitlines(keepends=True)
        tail = "".join(lines[start_line:])
        if len(tail.encode("utf-8", "surrogatepass")) > PURE_FALLBACK_MAX_BYTES:
            raise
        kept = out[: c_error.documents_before]
        out = []
        try:
            _read(tail, True, len(kept), out)
        except StreamError as pure_error:
            cls = LimitError if isinstance(pure_error, LimitError) else StreamError
            raise cls(
                _shift(pure_error.message, start_line), len(kept) + pure_error.documents_before
            ) from pure_error
        return kept + out
