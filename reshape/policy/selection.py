"""Choose the policy for one request: first matching rule, else an experiment arm, else default."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from reshape.policy.schema import Experiment, Policy, PolicyFile

NO_ARM = "none"


@dataclass(frozen=True)
class Selection:
    """The policy a request runs under, and the labels its metrics carry."""

    policy_name: str
    policy: Policy
    arm: str  # "<experiment>:<arm>", or NO_ARM


@dataclass(frozen=True)
class RequestFacts:
    """What a policy may be chosen on."""

    client_ip: str
    user_agent: str
    destination: str
    headers: Mapping[str, str]
    # The client's `reshape_unit` cookie (unit `cookie`), or the fresh id the chooser minted for a
    # request without one; None: no cookie experiment needs it.
    unit_cookie: str | None = None


def assign_arm(experiment: Experiment, unit_value: str) -> str:
    """Deterministic, sticky arm for a unit: every worker and every proxy instance agrees."""
    digest = hashlib.sha256(f"{experiment.salt}\0{experiment.name}\0{unit_value}".encode()).digest()
    total = sum(arm.weight for arm in experiment.arms.values())
    point = int.from_bytes(digest[:8], "big") % total
    for name, arm in experiment.arms.items():
        if point < arm.weight:
            return name
        point -= arm.weight
    raise AssertionError("weights exhausted")  # unreachable: point < total


def _unit_value(experiment: Experiment, facts: RequestFacts) -> str | None:
    if experiment.unit == "client_ip":
        return facts.client_ip
    if experiment.unit == "cookie":
        return facts.unit_cookie
    header = experiment.unit.removeprefix("header:").lower()
    for name, value in facts.headers.items():
        if name.lower() == header:
            return value
    return None


def select(policy_file: PolicyFile, facts: RequestFacts) -> Selection:
    for rule in policy_file.rules:
        if rule.match.matches(facts.client_ip, facts.user_agent, facts.destination):
            return Selection(rule.policy, policy_file.policies[rule.policy], NO_ARM)
    for experiment in policy_file.experiments:
        if experiment.match is not None and not experiment.match.matches(
            facts.client_ip, facts.user_agent, facts.destination
        ):
            continue
        unit = _unit_value(experiment, facts)
        if unit is None:
            continue  # e.g. the header is absent: this request is not in the experiment
        arm_name = assign_arm(experiment, unit)
        policy_name = experiment.arms[arm_name].policy
        return Selection(
            policy_name, policy_file.policies[policy_name], f"{experiment.name}:{arm_name}"
        )
    return Selection(policy_file.default, policy_file.policies[policy_file.default], NO_ARM)


def uses_cookie_unit(policy_file: PolicyFile) -> bool:
    return any(experiment.unit == "cookie" for experiment in policy_file.experiments)


def label_values(policy_file: PolicyFile) -> list[tuple[str, str]]:
    """Every (policy, arm) pair a request can be labelled with, for pre-created metrics."""
    pairs = {(name, NO_ARM) for name in policy_file.policies}
    for experiment in policy_file.experiments:
        for arm_name, arm in experiment.arms.items():
            pairs.add((arm.policy, f"{experiment.name}:{arm_name}"))
    return sorted(pairs)
