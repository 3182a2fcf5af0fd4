"""reshape/features/split_requests/addon.py on requests alone: which split POSTs count, by client
family. Raw clients through reshape: tests/system/features/split_requests/test_addon.py."""

from __future__ import annotations

import pytest
from mitmproxy.test import tutils
from prometheus_client import REGISTRY

from reshape.features.split_requests.addon import SplitRequests

CURL = "curl/8.5.0"
CHROME = (
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/131.0.0.0 Safari/537.36"
)
METRIC = "reshape_client_split_requests_total"


def counted(family: str) -> float:
    return REGISTRY.get_sample_value(METRIC, {"client_family": family}) or 0.0


@pytest.mark.parametrize(
    ("headers", "family", "counts"),
    [
        ({"user-agent": CHROME}, "chromium", 1),
        ({"user-agent": "Wget/1.21"}, "other", 1),
        ({}, "other", 1),
        # The client waits for "100 Continue" before it sends the body: not its choice to split.
        ({"user-agent": CURL, "expect": "100-continue"}, "curl", 0),
    ],
)
def test_split_is_counted_by_client_family(
    headers: dict[str, str], family: str, counts: int
) -> None:
    before = counted(family)
    request = tutils.treq(method=b"POST")
    request.headers.clear()
    request.headers.update(headers)
    SplitRequests().request_split(request)
    assert counted(family) == before + counts
