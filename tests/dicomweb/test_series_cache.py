"""The converted-series book: hits for an unchanged series, a changed series dropped, least recently used evicted
beyond the byte budget (never the series just added)."""

from rocm_zoo.dicomweb.series_cache import SeriesCache, series_signature


def test_signature_is_order_free_and_changes_with_instances():
    assert series_signature(["b", "a"]) == series_signature(["a", "b"])
    assert series_signature(["a", "b"]) != series_signature(["a", "c"])
    assert series_signature(["a"]) != series_signature(["a", "b"])


def test_hit_miss_and_invalidation():
    removed = []
    cache = SeriesCache(100, removed.append)
    assert not cache.lookup("s1", "v1")
    cache.add("s1", "v1", 10)
    assert cache.lookup("s1", "v1") and cache.lookup("s1", "v1")
    assert not cache.lookup("s1", "v2")  # the series changed in the PACS
    assert removed == ["s1"] and "s1" not in cache
    assert cache.info()["hits"] == 2 and cache.info()["invalidations"] == 1


def test_least_recently_used_goes_first_and_the_new_one_stays():
    removed = []
    cache = SeriesCache(100, removed.append)
    cache.add("a", "v", 40)
    cache.add("b", "v", 40)
    assert cache.lookup("a", "v")  # a is now the most recent
    assert cache.add("c", "v", 40) == ["b"]
    assert removed == ["b"] and "a" in cache and "c" in cache
    assert cache.add("huge", "v", 500) == ["a", "c"]
    assert "huge" in cache and cache.size_bytes() == 500
