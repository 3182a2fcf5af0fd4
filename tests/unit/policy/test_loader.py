from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from reshape.policy.loader import PolicyFileError, load_policy_file, parse_policy_text
from reshape.policy.schema import PolicyFile

REPO = Path(__file__).resolve().parents[3]


def parse(text: str) -> PolicyFile:
    return parse_policy_text(textwrap.dedent(text), Path("p.yaml"))


def problems(text: str) -> list[str]:
    with pytest.raises(PolicyFileError) as info:
        parse(text)
    return [str(p) for p in info.value.problems]


def test_default_file_is_valid_and_plain() -> None:
    policy_file = load_policy_file(REPO / "reshape" / "policy" / "default.yaml")
    assert policy_file.version == 1
    assert policy_file.default == "baseline"
    assert set(policy_file.policies) == {"baseline"}
    assert policy_file.rules == () and policy_file.experiments == ()


def test_minimal_file() -> None:
    policy_file = parse(
        """
        version: 1
        default: a
        policies: {a: {}}
        """
    )
    assert policy_file.rules == ()


def test_rules_and_experiments_decode() -> None:
    policy_file = parse(
        """
        version: 1
        default: baseline
        policies:
          baseline: {}
          capped: {}
        rules:
          - match: {client: 10.0.0.0/8, destination: "*.example.com"}
            policy: capped
        experiments:
          - name: cap
            unit: header:X-User
            salt: "2026-11"
            arms:
              control: {policy: baseline, weight: 50}
              treatment: {policy: capped, weight: 50}
        """
    )
    assert policy_file.rules[0].match.client == "10.0.0.0/8"
    assert policy_file.rules[0].policy == "capped"
    assert policy_file.experiments[0].arms["treatment"].weight == 50


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("version: 1\ndefault: a\npolicies: {a: {}}\nextra: 1\n", "line 4: extra: unknown key"),
        (
            "version: 1\ndefault: a\npolcies: {a: {}}\n",
            "line 3: polcies: unknown key (did you mean 'policies'?)",
        ),
        ("version: 2\ndefault: a\npolicies: {a: {}}\n", "line 1: version: expected one of 1"),
        (
            "version: 1\ndefault: b\npolicies: {a: {}}\n",
            "line 2: default: no policy named 'b' (policies: a)",
        ),
        ("version: 1\npolicies: {a: {}}\n", "default: missing (required)"),
        (
            "version: 1\ndefault: a\npolicies: {a: {}}\nrules: {}\n",
            "line 4: rules: expected a list, got a mapping",
        ),
        (
            "version: 1\ndefault: a\npolicies: {a: {}}\nrules:\n  - match: {client: 10.0.0.0/33}\n"
            "    policy: a\n",
            "line 5: rules[0].match.client: expected a CIDR network",
        ),
        (
            "version: 1\ndefault: a\npolicies: {a: {}}\nrules:\n  - match: {destinaton: x}\n"
            "    policy: a\n",
            "line 5: rules[0].match.destinaton: unknown key (did you mean 'destination'?)",
        ),
        (
            "version: 1\ndefault: a\npolicies: {a: {}}\nrules:\n  - match: {}\n    policy: zz\n",
            "line 5: rules[0].policy: no policy named 'zz'",
        ),
        (
            "version: 1\ndefault: a\npolicies: {a: {}}\nexperiments:\n  - name: e\n"
            "    unit: cookies\n    arms: {x: {policy: a, weight: 1}}\n",
            "line 6: experiments[0].unit: expected client_ip, header:NAME or cookie, got 'cookies'",
        ),
        (
            "version: 1\ndefault: a\npolicies: {a: {}}\nexperiments:\n  - name: e\n"
            "    unit: client_ip\n    arms: {x: {policy: a, weight: true}}\n",
            "line 7: experiments[0].arms.x.weight: expected an integer, got bool True",
        ),
        (
            "version: 1\ndefault: a\npolicies: {a: {}}\nexperiments:\n  - name: e\n"
            "    unit: client_ip\n    arms: {x: {policy: a, weight: 0}}\n",
            "experiments[0].arms: weights must not all be 0",
        ),
        (
            "version: 1\ndefault: a\npolicies: {a: {}}\nexperiments:\n  - name: e\n"
            "    unit: client_ip\n    arms: {x: {policy: a, weight: -1}}\n",
            "experiments[0].arms.x.weight: must be at least 0, got -1",
        ),
        (
            "version: 1\ndefault: a\npolicies: {a: {}}\nexperiments:\n  - name: e\n"
            "    unit: client_ip\n    arms: {x: {policy: a, weight: 18446744073709551616}}\n",
            "experiments[0].arms.x.weight: must be at most 1000000, got 18446744073709551616",
        ),
        # The arm label is experiment:arm: with a colon, experiments 'a' and 'a:b' mixed.
        (
            "version: 1\ndefault: a\npolicies: {a: {}}\nexperiments:\n  - name: 'a:b'\n"
            "    unit: client_ip\n    arms: {x: {policy: a, weight: 1}}\n",
            "experiments[0].name: must not contain ':' (the arm label is experiment:arm), "
            "got 'a:b'",
        ),
        (
            "version: 1\ndefault: a\npolicies: {a: {}}\nexperiments:\n  - name: a\n"
            "    unit: client_ip\n    arms: {'b:x': {policy: a, weight: 1}}\n",
            "experiments[0].arms.b:x: must not contain ':'",
        ),
        (
            "version: 1\ndefault: a\npolicies: {a: {}}\nexperiments:\n  - name: ''\n"
            "    unit: client_ip\n    arms: {x: {policy: a, weight: 1}}\n",
            "experiments[0].name: expected a non-empty name",
        ),
        ("version: 1\ndefault: a\npolicies:\n  a: {}\n  a: {}\n", "YAML syntax"),
        ("version: 1\ndefault: [a\n", "line 3: (top level): YAML syntax"),
        ("- just\n- a list\n", "(top level): expected a mapping, got a list"),
    ],
)
def test_problems_name_line_and_key_path(text: str, expected: str) -> None:
    found = problems(text)
    assert any(expected in p for p in found), found


def test_every_problem_is_reported_at_once_in_line_order() -> None:
    found = problems("version: 3\ndefault: 5\npolicies: {a: {}}\nbogus: 1\n")
    assert [p.split(":")[0] for p in found] == ["line 1", "line 2", "line 4"]


def test_error_message_has_one_line_per_problem_prefixed_with_the_file() -> None:
    with pytest.raises(PolicyFileError) as info:
        parse_policy_text("version: 3\nbogus: 1\ndefault: a\npolicies: {a: {}}\n", Path("x.yaml"))
    lines = str(info.value).splitlines()
    assert len(lines) == 2
    assert all(line.startswith("x.yaml: line ") for line in lines)


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(PolicyFileError, match="no such file"):
        load_policy_file(tmp_path / "absent.yaml")
    with pytest.raises(PolicyFileError, match="cannot read"):
        load_policy_file(tmp_path)  # a directory
    binary = tmp_path / "b.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(PolicyFileError, match="cannot read"):
        load_policy_file(binary)


def test_sections_with_defaults_are_present_even_when_absent() -> None:
    policy = parse("version: 1\ndefault: a\npolicies: {a: {}}\n").policies["a"]
    assert policy.trailers.mode == "auto"
    assert policy.preconnect.mode == "off"
    assert policy.destinations.link_local == "deny"


def test_preconnect_needs_the_shared_pool() -> None:
    found = problems(
        "version: 1\ndefault: a\npolicies:\n"
        "  a: {upstream: {share: false}, preconnect: {mode: learned}}\n"
    )
    assert found == [
        "line 4: policies.a.preconnect: warm connections live in the shared pool, which "
        "`upstream: {share: false}` turns off"
    ]
    parse("version: 1\ndefault: a\npolicies:\n  a: {preconnect: {mode: learned}}\n")
    parse("version: 1\ndefault: a\npolicies:\n  a: {upstream: {}, preconnect: {mode: learned}}\n")


def test_framing_fields_cannot_be_promoted_from_trailers() -> None:
    found = problems(
        "version: 1\ndefault: a\npolicies:\n"
        "  a: {trailers: {mode: promote, promote_fields: [Set-Cookie, Content-Length]}}\n"
    )
    assert len(found) == 1 and "Content-Length frames, routes or authenticates" in found[0]
