"""What is remembered per subscription name set (pilot/xds/identity_memo.py) goes with the set:
a server whose proxies keep changing subscriptions must not keep an entry per set it ever saw.
And an equal set that is another object gets the same answer (worked out again)."""

from __future__ import annotations

import gc

from pilot.xds.generators import eds
from pilot.xds.identity_memo import IdentityMemo


def test_an_entry_lives_as_long_as_its_object():
    memo: IdentityMemo[frozenset[str], int] = IdentityMemo()
    kept = frozenset({"a", "b"})
    memo.put(kept, 1)
    for i in range(100):
        memo.put(frozenset({f"n{i}", "x"}), i)  # each set dies at once: its entry with it
    gc.collect()
    assert len(memo) == 1 and memo.get(kept) == 1
    equal = frozenset({"b", "a"})
    assert equal == kept and equal is not kept and memo.get(equal) is None  # found by identity only


def test_reads_no_proxy_answers_by_content_for_any_set_object():
    subset = "outbound|9080|v1|reviews.default.svc.cluster.local"
    plain = "outbound|9080||reviews.default.svc.cluster.local"
    for _ in range(2):  # fresh objects each time: the same answers
        assert eds.reads_no_proxy(frozenset({plain})) is True
        assert eds.reads_no_proxy(frozenset({plain, subset})) is False
    assert eds.reads_no_proxy(frozenset()) is True and eds.reads_no_proxy(None) is True
