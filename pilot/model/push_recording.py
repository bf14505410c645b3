"""Dependency recording on a PushContext: what a generated result read, noted as it reads it.

The accessors of PushContext note facets (pilot/model/dependencies.py) into the innermost open
recording; the per-push memo hands a memoized value's Deps to every later caller. Kept beside
the class as a mixin (methods stay on PushContext: no extra call per accessor).
"""

from __future__ import annotations

from pilot.model import dependencies as dep


class _Recording:
    """`with ctx.recording() as deps:` without a generator's frame (it runs for every generated
    result and memoized sub-result of a push)."""

    __slots__ = ("deps", "stack")

    def __init__(self, stack: list, deps: dep.Deps) -> None:
        self.stack, self.deps = stack, deps

    def __enter__(self) -> dep.Deps:
        self.stack.append(self.deps)
        return self.deps

    def __exit__(self, *exc: object) -> None:
        self.stack.pop()


class RecordingMixin:
    """PushContext's recording stack and memo: `recording`, `begin_resource`, `memoized`."""

    # PushContext's fields (declared here for the type checker only: dataclass fields of the class)
    _rec: list  # the Deps being recorded, innermost last
    _memo: dict  # per-push derived values, with the Deps of computing each

    def recording(self, deps: dep.Deps | None = None) -> _Recording:
        """Note into `deps` what the accessors are asked while the block runs (generation is
        synchronous, so a stack is enough; nested recordings note into the innermost)."""
        return _Recording(self._rec, dep.Deps() if deps is None else deps)

    def suspend_recording(self) -> list:
        """Detach the recording stack, for a generation that yields to the event loop between
        resources (pilot/xds/generated.py): what other tasks read meanwhile is not its input.
        Hand the result back to `resume_recording` when it continues."""
        saved = list(self._rec)
        self._rec.clear()
        return saved

    def resume_recording(self, saved: list) -> None:
        # Every other recording is synchronous, so none is open between two task steps.
        assert not self._rec, "resumed over an open recording"
        self._rec.extend(saved)

    def begin_resource(self, name: str) -> bool:
        """Within a recording: what is read until `end_resource` is the Deps of resource `name`
        alone (types pushed resource by resource: EDS). False, and nothing to end, otherwise."""
        rec = self._rec
        if not rec:
            return False
        top = rec[-1]
        if top.named is None:
            top.named = {}
        deps = top.named[name] = dep.Deps()
        rec.append(deps)
        return True

    def end_resource(self) -> None:
        self._rec.pop()

    def _note(self, *facets: tuple) -> None:
        rec = self._rec
        if rec:
            rec[-1].facets.update(facets)

    def _note_child(self, child: dep.Deps) -> None:
        rec = self._rec
        if rec:
            rec[-1].add_child(child)

    def memoized(self, key, compute):
        """A per-push derived value with the Deps of computing it: a later caller that gets the
        memoized value still depends on everything the first computation read. For the
        accessors, and for generators: a part of a result that proxies with different memo keys
        share within one push (CDS: one service's clusters, for every namespace)."""
        hit = self._memo.get(key)
        if hit is None:
            with self.recording() as deps:
                value = compute()
            hit = self._memo[key] = (value, deps)
        self._note_child(hit[1])
        return hit[0]
