"""PolicyChooser: the file in force per request, and the self-setting cookie unit."""

from __future__ import annotations

import textwrap
from pathlib import Path

from mitmproxy.test import tflow

from reshape.policy.chooser import (
    UNIT_COOKIE,
    PolicyChooser,
    selection_of,
    take_unit_cookie,
    unit_cookie_header,
)
from reshape.policy.loader import parse_policy_text
from reshape.policy.reload import PolicyHolder

COOKIE_POLICY = parse_policy_text(
    textwrap.dedent(
        """
        version: 1
        default: baseline
        policies: {baseline: {}, capped: {}, office: {}}
        rules:
          - match: {destination: "office.test"}
            policy: office
        experiments:
          - name: trial
            unit: cookie
            salt: s
            arms:
              control: {policy: baseline, weight: 50}
              treatment: {policy: capped, weight: 50}
        """
    ),
    Path("cookie.yaml"),
)


def flow(cookie: str | None = None, host: str = "a.test"):
    f = tflow.tflow(resp=True)
    f.request.host = host
    f.request.headers.pop("cookie", None)
    if cookie is not None:
        f.request.headers["cookie"] = cookie
    return f


def test_take_unit_cookie_finds_it_and_leaves_the_others() -> None:
    assert take_unit_cookie([f"a=1; {UNIT_COOKIE}=xyz; b=2"]) == ("xyz", ["a=1; b=2"])
    assert take_unit_cookie([f"{UNIT_COOKIE}=xyz"]) == ("xyz", [])
    assert take_unit_cookie(["a=1", "b"]) == (None, ["a=1", "b"])
    assert take_unit_cookie([f"{UNIT_COOKIE}="]) == (None, [])


def test_a_request_without_the_cookie_gets_an_id_and_the_response_sets_it() -> None:
    chooser = PolicyChooser(COOKIE_POLICY)
    first = flow()
    chooser.requestheaders(first)
    chooser.responseheaders(first)
    set_cookie = first.response.headers.get_all("set-cookie")
    assert len(set_cookie) == 1
    value = set_cookie[0]
    assert "Path=/" in value and "SameSite=Lax" in value and "Max-Age=31536000" in value
    unit_id = value.split(";")[0].split("=", 1)[1]
    arm = selection_of(first).arm
    assert arm.startswith("trial:")
    # The next requests carry the cookie: same arm every time, no new cookie, cookie not forwarded.
    for _ in range(5):
        later = flow(f"session=1; {UNIT_COOKIE}={unit_id}")
        chooser.requestheaders(later)
        chooser.responseheaders(later)
        chooser.response(later)
        assert selection_of(later).arm == arm
        assert later.response.headers.get_all("set-cookie") == []
        assert later.request.headers["cookie"] == "session=1"


def test_fresh_ids_spread_over_the_arms() -> None:
    chooser = PolicyChooser(COOKIE_POLICY)
    arms = set()
    for _ in range(64):
        f = flow()
        chooser.requestheaders(f)
        arms.add(selection_of(f).arm)
    assert arms == {"trial:control", "trial:treatment"}


def test_no_cookie_when_a_rule_decides() -> None:
    chooser = PolicyChooser(COOKIE_POLICY)
    f = flow(host="office.test")
    chooser.requestheaders(f)
    chooser.response(f)
    assert selection_of(f).policy_name == "office"
    assert f.response.headers.get_all("set-cookie") == []


def test_each_request_reads_the_file_in_force(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\ndefault: a\npolicies: {a: {}}\n")
    holder = PolicyHolder(path, parse_policy_text(path.read_text(), path))
    chooser = PolicyChooser(holder)
    before = flow()
    chooser.requestheaders(before)
    path.write_text("version: 1\ndefault: b\npolicies: {b: {}}\n")
    assert holder.reload("test").ok
    after = flow()
    chooser.requestheaders(after)
    assert selection_of(before).policy_name == "a"  # in flight: keeps its selection
    assert selection_of(after).policy_name == "b"


def test_the_cookie_header_value() -> None:
    assert unit_cookie_header("abc").startswith(f"{UNIT_COOKIE}=abc; Path=/;")
