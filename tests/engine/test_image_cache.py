"""Tests for the preprocessed-image cache (rocm_zoo.engine.image_cache). CPU only, tiny tensors."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from monai.data import MetaTensor

from rocm_zoo.engine.image_cache import ImageCache, file_identity
from rocm_zoo.engine.lru import tensor_bytes

KB = 1024


def _entry(nbytes: int, fill: float = 0.0) -> dict:
    """A cache entry holding one float32 tensor of exactly `nbytes` bytes."""
    assert nbytes % 4 == 0
    return {"image": torch.full((nbytes // 4,), fill, dtype=torch.float32)}


class Maker:
    """A `make` callable that counts how often the cache calls it."""

    def __init__(self, value):
        self.value = value
        self.calls = 0

    def __call__(self) -> dict:
        self.calls += 1
        return self.value() if callable(self.value) else self.value


# --- hits, misses, make ---------------------------------------------------------------------------------------------


def test_make_is_called_once_per_key_and_hits_and_misses_are_counted():
    cache = ImageCache(max_bytes=10 * KB)
    a, b = Maker(lambda: _entry(KB, 1.0)), Maker(lambda: _entry(KB, 2.0))

    for _ in range(3):
        assert cache.get_or_make(("a",), a)["image"][0].item() == 1.0
    assert cache.get_or_make(("b",), b)["image"][0].item() == 2.0
    assert cache.get_or_make(("a",), a)["image"][0].item() == 1.0

    assert (a.calls, b.calls) == (1, 1)
    assert (cache.misses, cache.hits) == (2, 3)
    assert cache.size_bytes() == 2 * KB


def test_an_entry_made_without_keep_is_used_but_not_kept_and_an_existing_one_is_still_a_hit():
    # Batch work (a batch, the uncertainty ranking) reads each study once: it must not push out clinicians' images.
    cache = ImageCache(max_bytes=10 * KB)
    kept, once = Maker(lambda: _entry(KB, 1.0)), Maker(lambda: _entry(KB, 2.0))
    cache.get_or_make(("kept",), kept)
    assert cache.get_or_make(("kept",), kept, keep=False)["image"][0].item() == 1.0
    for _ in range(2):
        assert cache.get_or_make(("once",), once, keep=False)["image"][0].item() == 2.0
    assert (kept.calls, once.calls) == (1, 2)
    assert cache.size_bytes() == KB


def test_clear_forgets_everything_so_make_runs_again():
    cache = ImageCache(max_bytes=10 * KB)
    a = Maker(lambda: _entry(KB))
    cache.get_or_make(("a",), a)
    cache.clear()
    assert cache.size_bytes() == 0
    cache.get_or_make(("a",), a)
    assert a.calls == 2


# --- fresh copies ---------------------------------------------------------------------------------------------------


def test_mutating_a_returned_tensor_does_not_change_the_next_result():
    cache = ImageCache(max_bytes=10 * KB)
    make = Maker(lambda: {"image": torch.arange(6, dtype=torch.float32), "spacing": [1.0, 1.0, 2.0]})

    first = cache.get_or_make(("k",), make)
    first["image"].mul_(-1)
    first["image"][0] = 99.0
    first["spacing"].append(5.0)
    first["extra"] = "added"

    second = cache.get_or_make(("k",), make)
    assert torch.equal(second["image"], torch.arange(6, dtype=torch.float32))
    assert second["spacing"] == [1.0, 1.0, 2.0]
    assert "extra" not in second
    assert make.calls == 1


def test_the_first_result_is_already_a_copy_of_what_make_returned():
    cache = ImageCache(max_bytes=10 * KB)
    original = {"image": torch.zeros(4)}
    got = cache.get_or_make(("k",), Maker(original))
    got["image"].fill_(7.0)
    assert torch.equal(original["image"], torch.zeros(4))
    assert torch.equal(cache.get_or_make(("k",), Maker(original))["image"], torch.zeros(4))


def test_mutating_metatensor_meta_and_applied_operations_does_not_leak():
    cache = ImageCache(max_bytes=10 * KB)

    def make() -> dict:
        img = MetaTensor(torch.ones(1, 4, 4, 4), meta={"affine": torch.eye(4), "filename_or_obj": "a.nii.gz"})
        img.push_applied_operation({"class": "LoadImaged"})
        return {"image": img}

    first = cache.get_or_make(("k",), make)
    assert isinstance(first["image"], MetaTensor)
    first["image"].meta["affine"][0, 0] = 5.0
    first["image"].meta["filename_or_obj"] = "changed"
    first["image"].meta["new_key"] = 1
    first["image"].push_applied_operation({"class": "Spacingd"})
    first["image"].applied_operations[0]["class"] = "changed"
    first["image"].array = torch.zeros(1, 4, 4, 4)

    second = cache.get_or_make(("k",), make)
    assert isinstance(second["image"], MetaTensor)
    assert torch.equal(second["image"].as_tensor(), torch.ones(1, 4, 4, 4))
    assert torch.equal(second["image"].meta["affine"], torch.eye(4))
    assert second["image"].meta["filename_or_obj"] == "a.nii.gz"
    assert "new_key" not in second["image"].meta
    assert [op["class"] for op in second["image"].applied_operations] == ["LoadImaged"]


# --- eviction -------------------------------------------------------------------------------------------------------


def test_eviction_keeps_total_bytes_within_the_limit_least_recently_used_first():
    cache = ImageCache(max_bytes=3 * KB)
    makers = {k: Maker(lambda: _entry(KB)) for k in "abcd"}
    for k in "abc":
        cache.get_or_make((k,), makers[k])
    assert cache.size_bytes() == 3 * KB

    cache.get_or_make(("a",), makers["a"])  # "a" is now the most recently used; "b" the least
    cache.get_or_make(("d",), makers["d"])  # over the limit: "b" goes
    assert cache.size_bytes() <= 3 * KB

    for k in "acd":  # all still cached: no make call
        cache.get_or_make((k,), makers[k])
    assert {k: m.calls for k, m in makers.items()} == {"a": 1, "b": 1, "c": 1, "d": 1}
    cache.get_or_make(("b",), makers["b"])  # evicted, so made again
    assert makers["b"].calls == 2
    assert cache.size_bytes() <= 3 * KB


def test_eviction_of_several_small_entries_for_one_large_one():
    cache = ImageCache(max_bytes=4 * KB)
    for k in "abcd":
        cache.get_or_make((k,), Maker(lambda: _entry(KB)))
    big = Maker(lambda: _entry(3 * KB))
    cache.get_or_make(("big",), big)
    assert cache.size_bytes() == 4 * KB  # a, b and c went; d (1 KB) and big (3 KB) stay
    d = Maker(lambda: _entry(KB))
    cache.get_or_make(("d",), d)
    assert d.calls == 0


def test_the_newest_entry_is_kept_even_when_alone_it_is_over_the_limit():
    cache = ImageCache(max_bytes=2 * KB)
    cache.get_or_make(("small",), Maker(lambda: _entry(KB)))
    huge = Maker(lambda: _entry(8 * KB))

    got = cache.get_or_make(("huge",), huge)
    assert got["image"].numel() * 4 == 8 * KB
    assert cache.size_bytes() == 8 * KB  # only "huge" is left
    cache.get_or_make(("huge",), huge)
    assert huge.calls == 1 and cache.hits == 1


def test_size_counts_metatensor_bytes():
    cache = ImageCache(max_bytes=10 * KB)
    cache.get_or_make(("k",), Maker(lambda: {"image": MetaTensor(torch.zeros(1, 4, 4, 4)), "name": "x"}))
    assert cache.size_bytes() == 4 * 4 * 4 * 4  # float32; the string is not counted


def test_tensor_bytes_counts_the_tensors_of_nested_outputs():
    """The embedding cache's values are tuples of tensors and None (VISTA3D's encoder branches)."""
    value = (torch.zeros(2, 3), None, [torch.zeros(4, dtype=torch.bfloat16)], {"a": MetaTensor(torch.zeros(5))}, "x")
    assert tensor_bytes(value) == 2 * 3 * 4 + 4 * 2 + 5 * 4


# --- file identity --------------------------------------------------------------------------------------------------


def test_file_identity_is_stable_for_an_unchanged_file(tmp_path):
    f = tmp_path / "image.nii.gz"
    f.write_bytes(b"abc")
    assert file_identity(str(f)) == file_identity(str(f))
    path, size, _mtime = file_identity(str(f))
    assert path == os.path.realpath(f)
    assert size == 3


def test_file_identity_changes_when_the_file_is_rewritten(tmp_path):
    f = tmp_path / "image.nii.gz"
    f.write_bytes(b"first version")
    before = file_identity(str(f))
    f.write_bytes(b"the second, longer version")
    after = file_identity(str(f))
    assert before != after
    assert before[0] == after[0]
    assert after[1] == len(b"the second, longer version")


def test_file_identity_of_a_symlink_is_the_target(tmp_path):
    target = tmp_path / "real.nii.gz"
    target.write_bytes(np.arange(10, dtype=np.uint8).tobytes())
    link = tmp_path / "link.nii.gz"
    try:
        link.symlink_to(target)
    except OSError as e:
        pytest.skip(f"cannot make a symlink here: {e}")
    assert file_identity(str(link)) == file_identity(str(target))


def test_file_identity_of_a_missing_file_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        file_identity(str(tmp_path / "missing.nii.gz"))
