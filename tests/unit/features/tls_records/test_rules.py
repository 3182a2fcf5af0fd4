from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reshape.features.tls_records.rules import MAX_RECORD_BYTES, RecordSizer, sizer_for, slices
from reshape.policy.schema import TlsRecordKnobs

sizers = st.builds(
    lambda small, extra, warmup, idle: RecordSizer(
        small_bytes=small,
        warmup_bytes=warmup,
        idle_reset=idle,
        large_bytes=min(MAX_RECORD_BYTES, small + extra),
    ),
    st.integers(256, MAX_RECORD_BYTES),  # bytes per record: the schema allows 512 and up
    st.integers(0, MAX_RECORD_BYTES),
    st.integers(0, 200_000),
    st.floats(0.01, 5.0),
)
# (bytes to send, seconds since the previous send)
sends = st.lists(st.tuples(st.integers(0, 100_000), st.floats(0.0, 10.0)), max_size=30)


def model(sizer: RecordSizer, plan: list[tuple[int, float]]) -> list[list[tuple[int, int]]]:
    """The rule written out byte by byte: per send, each record as (offset since the warm-up
    began, maximum size for a record starting there)."""
    expected = []
    offset, last = 0, None
    now = 0.0
    for n_bytes, gap in plan:
        now += gap
        if n_bytes == 0:
            expected.append([])
            continue
        if last is not None and now - last >= sizer.idle_reset:
            offset = 0
        last = now
        records = []
        end = offset + n_bytes
        while offset < end:
            limit = sizer.small_bytes if offset < sizer.warmup_bytes else sizer.large_bytes
            records.append((offset, limit))
            offset += min(limit, end - offset)
        expected.append(records)
    return expected


@given(sizers, sends)
def test_sizes_follow_the_warmup_and_idle_rule(
    sizer: RecordSizer, plan: list[tuple[int, float]]
) -> None:
    expected = model(sizer.fresh(), plan)
    now = 0.0
    for (n_bytes, gap), records in zip(plan, expected, strict=True):
        now += gap
        sizes = sizer.next_sizes(n_bytes, now)
        assert sum(sizes) == n_bytes
        assert len(sizes) == len(records)
        for index, (size, (_, limit)) in enumerate(zip(sizes, records, strict=True)):
            assert 0 < size <= limit
            if index < len(sizes) - 1:
                assert size == limit  # only the last record of a send may be short


@given(sizers, st.integers(1, 3_000_000))
def test_the_first_warmup_bytes_go_out_small(sizer: RecordSizer, n_bytes: int) -> None:
    offset = 0
    for size in sizer.next_sizes(n_bytes, 0.0):
        if offset < sizer.warmup_bytes:
            assert size <= sizer.small_bytes
        else:
            assert size <= sizer.large_bytes
        offset += size


def test_after_warmup_records_are_full_until_the_connection_idles() -> None:
    sizer = RecordSizer(small_bytes=1400, warmup_bytes=14_000, idle_reset=1.0)
    assert sizer.next_sizes(14_000, 10.0) == [1400] * 10
    assert sizer.next_sizes(40_000, 10.9) == [16_384, 16_384, 7232]
    # Each gap is under a second: still warm, however long the whole exchange takes.
    assert sizer.next_sizes(20_000, 11.8) == [16_384, 3616]
    assert sizer.next_sizes(3000, 12.8) == [1400, 1400, 200]


def test_warmup_ends_at_the_record_that_crosses_it() -> None:
    sizer = RecordSizer(small_bytes=1000, warmup_bytes=2500, idle_reset=1.0)
    assert sizer.next_sizes(20_000, 0.0) == [1000, 1000, 1000, 16_384, 616]


def test_fixed_records_never_change() -> None:
    sizer = RecordSizer.fixed(4096)
    assert sizer.next_sizes(10_000, 0.0) == [4096, 4096, 1808]
    assert sizer.next_sizes(5000, 1e9) == [4096, 904]


def test_sending_nothing_is_not_a_send() -> None:
    sizer = RecordSizer(small_bytes=1400, warmup_bytes=1400, idle_reset=1.0)
    sizer.next_sizes(1400, 0.0)
    assert sizer.next_sizes(0, 0.5) == []
    assert sizer.next_sizes(0, 2.0) == []
    assert sizer.next_sizes(5000, 0.9) == [5000]  # the previous send was at 0.0


@pytest.mark.parametrize(
    ("small", "warmup", "idle", "large"),
    [(0, 0, 1.0, 16_384), (2000, 0, 1.0, 1000), (1400, 0, 1.0, 16_385), (1400, -1, 1.0, 16_384)]
    + [(1400, 0, 0.0, 16_384), (1400, 0, math.nan, 16_384)],
)
def test_impossible_settings_are_refused(small: int, warmup: int, idle: float, large: int) -> None:
    with pytest.raises(ValueError):
        RecordSizer(small_bytes=small, warmup_bytes=warmup, idle_reset=idle, large_bytes=large)


def test_sizer_for_policy_knobs() -> None:
    assert sizer_for(None) is None
    assert sizer_for(TlsRecordKnobs(mode="off")) is None
    dynamic = sizer_for(TlsRecordKnobs())
    assert dynamic is not None
    assert (dynamic.small_bytes, dynamic.warmup_bytes, dynamic.idle_reset) == (1400, 1_048_576, 1.0)
    assert dynamic.large_bytes == MAX_RECORD_BYTES
    fixed = sizer_for(TlsRecordKnobs(mode="fixed", fixed_bytes=2048))
    assert fixed is not None
    assert fixed.next_sizes(5000, 0.0) == [2048, 2048, 904]


@given(st.binary(max_size=5000), st.data())
def test_slices_cut_data_in_order(data: bytes, draw: st.DataObject) -> None:
    sizes = []
    left = len(data)
    while left:
        size = draw.draw(st.integers(1, left))
        sizes.append(size)
        left -= size
    pieces = list(slices(data, sizes))
    assert [len(piece) for piece in pieces] == sizes
    assert b"".join(pieces) == data


def test_slices_refuse_sizes_that_do_not_add_up() -> None:
    with pytest.raises(ValueError):
        list(slices(b"abc", [1, 1]))
