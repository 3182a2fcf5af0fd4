from __future__ import annotations

import collections
import textwrap
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from reshape.policy.loader import parse_policy_text
from reshape.policy.selection import NO_ARM, RequestFacts, assign_arm, label_values, select

POLICY = parse_policy_text(
    textwrap.dedent(
        """
        version: 1
        default: baseline
        policies: {baseline: {}, capped: {}, office: {}, firefox: {}}
        rules:
          - match: {client: 10.0.0.0/8, destination: "*.example.com"}
            policy: office
          - match: {user_agent: "*Firefox/*"}
            policy: firefox
        experiments:
          - name: cap
            unit: header:X-User
            arms:
              control: {policy: baseline, weight: 50}
              treatment: {policy: capped, weight: 50}
        """
    ),
    Path("p.yaml"),
)


def facts(client: str = "192.0.2.1", ua: str = "curl/8", dest: str = "a.test", **headers: str):
    return RequestFacts(client, ua, dest, headers)


def test_default_when_nothing_applies() -> None:
    selection = select(POLICY, facts())
    assert (selection.policy_name, selection.arm) == ("baseline", NO_ARM)


def test_all_keys_of_a_rule_must_match() -> None:
    assert select(POLICY, facts("10.1.2.3", dest="www.example.com")).policy_name == "office"
    assert select(POLICY, facts("10.1.2.3", dest="www.example.org")).policy_name == "baseline"
    assert select(POLICY, facts("11.1.2.3", dest="www.example.com")).policy_name == "baseline"


def test_destination_glob_ignores_case_and_user_agent_glob_applies() -> None:
    assert select(POLICY, facts("10.0.0.1", dest="WWW.Example.COM")).policy_name == "office"
    ua = "Mozilla/5.0 (X11; Linux x86_64; rv:140.0) Gecko/20100101 Firefox/140.0"
    assert select(POLICY, facts(ua=ua)).policy_name == "firefox"


def test_first_matching_rule_wins_over_later_rules_and_experiments() -> None:
    selection = select(
        POLICY, facts("10.0.0.1", ua="x Firefox/1", dest="a.example.com", **{"X-User": "u"})
    )
    assert (selection.policy_name, selection.arm) == ("office", NO_ARM)


def test_experiment_assigns_an_arm_when_its_unit_is_present() -> None:
    selection = select(POLICY, facts(**{"x-user": "alice"}))
    assert selection.arm in ("cap:control", "cap:treatment")
    assert (
        selection.policy_name
        == {"cap:control": "baseline", "cap:treatment": "capped"}[selection.arm]
    )


@given(st.text(min_size=1, max_size=40))
def test_assignment_is_sticky(unit: str) -> None:
    experiment = POLICY.experiments[0]
    assert assign_arm(experiment, unit) == assign_arm(experiment, unit)


def test_assignment_follows_weights() -> None:
    experiment = POLICY.experiments[0]
    counts = collections.Counter(assign_arm(experiment, f"user-{i}") for i in range(4000))
    assert abs(counts["control"] / 4000 - 0.5) < 0.05


def test_label_values_cover_every_policy_and_arm() -> None:
    pairs = set(label_values(POLICY))
    assert ("baseline", NO_ARM) in pairs and ("office", NO_ARM) in pairs
    assert ("capped", "cap:treatment") in pairs and ("baseline", "cap:control") in pairs
