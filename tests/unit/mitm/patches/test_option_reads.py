"""reshape/mitm/patches/option_reads.py: option reads answer as mitmproxy's, atomic values
without a copy, the others still copied."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, Optional

import pytest
from mitmproxy import optmanager
from mitmproxy.options import Options

from reshape.mitm.patches import Patches
from reshape.mitm.patches.option_reads import ReadOptionsWithoutCopies


def _options() -> optmanager.OptManager:
    options = Options()
    options.add_option("reshape_list", Sequence[str], ["a", "b"], "a list")
    options.add_option("reshape_optional", Optional[str], None, "maybe a string")  # noqa: UP045 (mitmproxy's typespecs)
    options.add_option("reshape_flag", bool, True, "a flag")
    options.add_option("reshape_count", int, 3, "a number")
    return options


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("reshape_optional", "1m"),  # as body_size_limit: str, default None
        ("reshape_flag", False),  # as validate_inbound_headers: bool, default True
        ("reshape_count", 8443),
        ("listen_port", 8443),  # one of mitmproxy's own
        ("reshape_list", ["c"]),
    ],
)
def test_reads_answer_as_mitmproxy_does_unset_and_set(name: str, value: Any) -> None:
    options = _options()
    expected_default = getattr(options, name)
    with Patches([ReadOptionsWithoutCopies()]):
        assert getattr(options, name) == expected_default
        options.update(**{name: value})
        assert getattr(options, name) == value
        options.reset()
        assert getattr(options, name) == expected_default


def test_atomic_values_are_not_copied_and_others_are() -> None:
    options = _options()
    calls: list[Any] = []
    original = copy.deepcopy

    def counting(value: Any, memo: Any = None) -> Any:
        calls.append(value)
        return original(value, memo)

    with Patches([ReadOptionsWithoutCopies()]):
        copy.deepcopy = counting
        try:
            assert options.reshape_optional is None
            assert options.reshape_flag is True
            assert options.reshape_count == 3
            assert calls == []
            read = options.reshape_list
            assert calls == [["a", "b"]]
        finally:
            copy.deepcopy = original
        read.append("changed")  # a copy: the option is as it was
        assert options.reshape_list == ["a", "b"]


def test_uninstall_restores_mitmproxys_reads() -> None:
    original = optmanager._Option.current
    with Patches([ReadOptionsWithoutCopies()]):
        assert optmanager._Option.current is not original
    assert optmanager._Option.current is original
