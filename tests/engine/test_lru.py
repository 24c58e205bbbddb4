"""The byte-bounded LRU under the image, embedding and series caches (rocm_zoo.engine.lru): least recently used out
first, the newest always kept, sizes measured once. Plain Python values, no torch."""

from __future__ import annotations

import threading

from rocm_zoo.engine.lru import ByteLRU


def sized() -> ByteLRU[str, bytes]:
    return ByteLRU(10, len)


def test_get_moves_to_most_recent_and_put_evicts_least_recent_first():
    lru = sized()
    assert lru.put("a", b"xxx") == [] and lru.put("b", b"xxx") == [] and lru.put("c", b"xxx") == []
    assert lru.get("a") == b"xxx"  # "b" is now the least recently used
    assert lru.put("d", b"xxx") == [("b", b"xxx")]
    assert lru.keys() == ["c", "a", "d"] and lru.size_bytes() == 9
    assert lru.get("b") is None and "b" not in lru and len(lru) == 3


def test_peek_leaves_the_order_alone():
    lru = sized()
    lru.put("a", b"xxxx")
    lru.put("b", b"xxxx")
    assert lru.peek("a") == b"xxxx" and lru.peek("zz") is None
    assert lru.put("c", b"xxxx") == [("a", b"xxxx")]


def test_several_small_entries_go_for_one_large_one_and_the_newest_stays_over_the_budget():
    lru = sized()
    for k in "abcde":
        lru.put(k, b"xx")
    assert [k for k, _ in lru.put("big", b"x" * 8)] == ["a", "b", "c", "d"]
    assert lru.keys() == ["e", "big"] and lru.size_bytes() == 10
    assert [k for k, _ in lru.put("huge", b"x" * 50)] == ["e", "big"]
    assert lru.keys() == ["huge"] and lru.size_bytes() == 50, "the newest entry is kept even over the budget"


def test_replacing_a_key_counts_its_new_size_only():
    lru = sized()
    lru.put("a", b"xxxx")
    lru.put("b", b"xx")
    assert lru.put("a", b"xxxxxxxx") == []
    assert lru.size_bytes() == 10 and lru.keys() == ["b", "a"]


def test_pop_and_clear_give_the_bytes_back():
    lru = sized()
    lru.put("a", b"xxxx")
    lru.put("b", b"xx")
    assert lru.pop("a") == b"xxxx" and lru.pop("a") is None
    assert lru.size_bytes() == 2
    lru.clear()
    assert lru.size_bytes() == 0 and len(lru) == 0 and list(lru) == []


def test_size_is_measured_once_when_added():
    calls = []

    def measure(value: list) -> int:
        calls.append(1)
        return len(value)

    lru = ByteLRU(100, measure)
    value = [1, 2, 3]
    lru.put("a", value)
    for _ in range(3):
        lru.get("a")
    assert len(calls) == 1 and lru.size_bytes() == 3


def test_concurrent_puts_stay_within_the_budget():
    lru: ByteLRU[int, bytes] = ByteLRU(100, len)

    def worker(start: int) -> None:
        for i in range(start, start + 200):
            lru.put(i, b"x" * 10)
            lru.get(i - 1)

    threads = [threading.Thread(target=worker, args=(n * 1000,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(lru) == 10 and lru.size_bytes() == 100
