"""The on-disk validation cache: identical arrays back, LRU eviction under the cap, bad entries
recomputed and never served, concurrent writers of one key harmless."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import numpy as np
import pytest

from vramkit.core.io.checkpoint_io import partial_write_path
from vramkit.core.io.disk_cache import (
    ENTRY_SUFFIX,
    ValidationCache,
    content_key,
    main,
)


def _sample(seed: int, side: int = 32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "image": rng.integers(0, 256, (side, side, 3), dtype=np.uint8),
        "thresh_map": rng.uniform(0.3, 0.7, (side, side)).astype(np.float32),
        "shrink_map": (rng.uniform(size=(side, side)) > 0.5).astype(np.uint8),
        "original_size": np.array([720, 1280], dtype=np.int64),
        "flag": np.array(True),
        "nothing": np.zeros((0, 4, 2), dtype=np.float32),
    }


def _assert_same(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert list(got) == list(expected)
    for name, array in expected.items():
        assert got[name].dtype == array.dtype, name
        assert got[name].shape == array.shape, name
        assert np.array_equal(got[name], array), name


def _entry_size(tmp_path: Path) -> int:
    probe = ValidationCache(tmp_path / "probe", max_bytes=2**30)
    probe.put(content_key("probe"), _sample(0))
    return probe.report().size_bytes


def test_round_trip_serves_identical_memory_mapped_arrays(tmp_path: Path) -> None:
    cache = ValidationCache(tmp_path / "cache", max_bytes=2**30)
    key = content_key(b"image bytes", b"gt bytes", {"val_image_size": 640})
    assert cache.get(key) is None
    expected = _sample(1)
    assert cache.put(key, expected)
    got = cache.get(key)
    assert got is not None
    _assert_same(got, expected)
    image = got["image"]
    assert not image.flags.writeable  # served from the read-only mapping, not a private copy
    assert isinstance(image.base, np.memmap)
    assert image.ctypes.data % 64 == 0
    assert (cache.hits, cache.misses, cache.writes) == (1, 1, 1)


def test_get_or_compute_computes_once(tmp_path: Path) -> None:
    cache = ValidationCache(tmp_path, max_bytes=2**30)
    calls = []

    def compute() -> dict[str, np.ndarray]:
        calls.append(1)
        return _sample(2)

    key = content_key("sample", 2)
    first = cache.get_or_compute(key, compute)
    second = cache.get_or_compute(key, compute)
    assert len(calls) == 1
    _assert_same(second, first)


def test_content_key_depends_on_every_part_and_its_boundaries() -> None:
    base = content_key(b"img", b"gt", {"size": 640, "shrink_ratio": 0.4}, "v1")
    assert base == content_key(b"img", b"gt", {"shrink_ratio": 0.4, "size": 640}, "v1")
    assert base != content_key(b"img", b"gt", {"size": 736, "shrink_ratio": 0.4}, "v1")
    assert base != content_key(b"img!", b"gt", {"size": 640, "shrink_ratio": 0.4}, "v1")
    assert base != content_key(b"img", b"gt", {"size": 640, "shrink_ratio": 0.4}, "v2")
    assert content_key(b"ab", b"c") != content_key(b"a", b"bc")


@pytest.mark.parametrize("damage", ["flip_payload_byte", "truncate", "garbage", "empty"])
def test_damaged_entry_is_rejected_deleted_and_recomputed(tmp_path: Path, damage: str) -> None:
    cache = ValidationCache(tmp_path, max_bytes=2**30)
    key = content_key("damaged")
    expected = _sample(3)
    cache.put(key, expected)
    path = cache.path_for(key)
    data = bytearray(path.read_bytes())
    if damage == "flip_payload_byte":
        data[-200] ^= 0xFF  # inside the thresh/shrink maps, far from the header
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "garbage":
        data = bytearray(os.urandom(len(data)))
    else:
        data = bytearray()
    path.write_bytes(bytes(data))

    assert cache.get(key) is None
    assert cache.rejected == 1
    assert not path.exists()
    recomputed = cache.get_or_compute(key, lambda: expected)
    _assert_same(recomputed, expected)
    again = cache.get(key)
    assert again is not None
    _assert_same(again, expected)


def test_stale_entry_of_another_key_or_format_is_not_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = ValidationCache(tmp_path, max_bytes=2**30)
    old_key, new_key = content_key("params", 1), content_key("params", 2)
    cache.put(old_key, _sample(4))
    # An entry under the wrong name (copied by hand, or a renamed file) is stale.
    cache.path_for(old_key).rename(cache.path_for(new_key))
    assert cache.get(new_key) is None
    assert cache.rejected == 1

    cache.put(new_key, _sample(5))
    monkeypatch.setattr("vramkit.core.io.disk_cache.FORMAT_VERSION", 2)
    assert cache.get(new_key) is None  # written by an older format
    assert cache.rejected == 2


def test_least_recently_used_entries_are_evicted_under_the_cap(tmp_path: Path) -> None:
    size = _entry_size(tmp_path)
    cap = 3 * size + size // 2  # room for three entries, not four
    cache = ValidationCache(tmp_path / "cache", max_bytes=cap)
    keys = [content_key("entry", index) for index in range(5)]
    for index in range(3):
        cache.put(keys[index], _sample(index))
        os.utime(cache.path_for(keys[index]), (1000 + index, 1000 + index))
    assert cache.get(keys[0]) is not None  # now the most recently used

    cache.put(keys[3], _sample(3))  # evicts keys[1], the least recently used
    present = [index for index in range(4) if cache.path_for(keys[index]).exists()]
    assert present == [0, 2, 3]
    for stamp, index in enumerate((2, 0, 3)):
        os.utime(cache.path_for(keys[index]), (2000 + stamp, 2000 + stamp))
    cache.put(keys[4], _sample(4))  # evicts keys[2]
    present = [index for index in range(5) if cache.path_for(keys[index]).exists()]
    assert present == [0, 3, 4]
    report = cache.report()
    assert report.entries == 3
    assert report.size_bytes <= cap
    assert report.evictions == 2
    cache.put(keys[0], _sample(0))  # a rewrite of a stored key replaces it, evicting nothing
    assert cache.report().evictions == 2 and cache.report().entries == 3


def test_a_larger_rewrite_of_the_oldest_entry_still_respects_the_cap(tmp_path: Path) -> None:
    size = _entry_size(tmp_path)
    cap = 3 * size + size // 2
    cache = ValidationCache(tmp_path / "cache", max_bytes=cap)
    keys = [content_key("rewrite", index) for index in range(3)]
    for index, key in enumerate(keys):
        cache.put(key, _sample(index))
        os.utime(cache.path_for(key), (1000 + index, 1000 + index))
    cache.put(keys[0], _sample(0, side=44))  # its old file is not room: the next oldest goes
    assert [cache.path_for(key).exists() for key in keys] == [True, False, True]
    assert cache.report().size_bytes <= cap


def test_entry_larger_than_the_cap_is_not_stored(tmp_path: Path) -> None:
    cache = ValidationCache(tmp_path, max_bytes=_entry_size(tmp_path) - 1)
    key = content_key("too large")
    assert not cache.put(key, _sample(6))
    assert cache.get(key) is None
    assert cache.report().too_large == 1


def test_lowered_cap_is_enforced_and_reported(tmp_path: Path) -> None:
    cache = ValidationCache(tmp_path, max_bytes=2**30)
    for index in range(4):
        cache.put(content_key("lowered", index), _sample(index))
    size = cache.report().size_bytes // 4
    smaller = ValidationCache(tmp_path, max_bytes=2 * size)
    smaller.enforce_cap()
    report = smaller.report()
    assert report.entries == 2
    assert report.size_bytes <= 2 * size
    assert report.as_dict()["max_gib"] == round(2 * size / 2**30, 4)
    assert "2 entries" in report.describe() and "2 evicted" in report.describe()
    idle = ValidationCache(tmp_path, max_bytes=2**30).report()
    assert idle.entries == 2 and "this process" not in idle.describe()


def test_abandoned_partial_writes_are_removed_and_fresh_ones_counted(tmp_path: Path) -> None:
    cache = ValidationCache(tmp_path, max_bytes=2**30)
    cache.put(content_key("kept"), _sample(7))
    abandoned = partial_write_path(tmp_path / f"{'a' * 64}{ENTRY_SUFFIX}")
    abandoned.write_bytes(b"x" * 100)
    os.utime(abandoned, (0, 0))
    fresh = partial_write_path(tmp_path / f"{'b' * 64}{ENTRY_SUFFIX}")
    fresh.write_bytes(b"y" * 100)
    report = cache.report()
    assert not abandoned.exists()
    assert fresh.exists()
    assert report.partial_writes == 1
    assert report.entries == 1


def _write_repeatedly(directory: str, key: str, seed: int, rounds: int) -> None:
    cache = ValidationCache(directory, max_bytes=2**30)
    for _ in range(rounds):
        cache.put(key, _sample(seed, side=64))


def test_concurrent_writers_of_one_key_never_expose_a_partial_entry(tmp_path: Path) -> None:
    key = content_key("shared")
    expected = _sample(8, side=64)
    context = multiprocessing.get_context("fork")
    writers = [
        context.Process(target=_write_repeatedly, args=(str(tmp_path), key, 8, 40))
        for _ in range(3)
    ]
    for writer in writers:
        writer.start()
    reader = ValidationCache(tmp_path, max_bytes=2**30)
    served = 0
    while any(writer.is_alive() for writer in writers):
        got = reader.get(key)
        if got is not None:
            _assert_same(got, expected)
            served += 1
    for writer in writers:
        writer.join()
        assert writer.exitcode == 0
    assert reader.rejected == 0
    final = reader.get(key)
    assert final is not None
    _assert_same(final, expected)
    assert served + 1 == reader.hits
    assert [p.name for p in tmp_path.iterdir()] == [f"{key}{ENTRY_SUFFIX}"]


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        ValidationCache(tmp_path, max_bytes=0)
    with pytest.raises(ValueError, match="max_gib"):
        ValidationCache.with_max_gib(tmp_path, -1)
    cache = ValidationCache(tmp_path, max_bytes=2**30)
    with pytest.raises(ValueError, match="hex"):
        cache.get("../escape")
    with pytest.raises(ValueError, match="Python objects"):
        cache.put(content_key("objects"), {"names": np.array(["a", None], dtype=object)})


def test_command_line_prints_the_storage_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = ValidationCache(tmp_path, max_bytes=2**30)
    cache.put(content_key("cli"), _sample(9))
    assert main([str(tmp_path), "--max-gib", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["entries"] == 1
    assert report["max_gib"] == 1.0
    assert report["size_bytes"] == cache.report().size_bytes
    assert main([str(tmp_path / "missing")]) == 2


def test_unusable_folder_degrades_to_no_cache(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("a file where the cache folder should be")
    cache = ValidationCache(blocker, max_bytes=2**30)
    key = content_key("unusable")
    with caplog.at_level("WARNING", logger="vramkit.core.io.disk_cache"):
        assert not cache.put(key, _sample(10))
        assert cache.get(key) is None
        assert cache.get_or_compute(key, lambda: _sample(10))["image"].shape == (32, 32, 3)
    assert cache.io_errors == 4 and cache.writes == 0
    assert sum("cannot" in record.getMessage() for record in caplog.records) == 1
    assert cache.report().entries == 0
