"""Read a policy file: YAML → typed PolicyFile, with every problem reported by line and key path."""

from __future__ import annotations

from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from reshape.base.errors import UsageError
from reshape.policy.decode import Decoder, Problem, _line_of
from reshape.policy.schema import PolicyFile, label_problem


class PolicyFileError(UsageError):
    """An invalid policy file; carries every problem found."""

    def __init__(self, path: Path, problems: list[Problem]) -> None:
        self.path = path
        self.problems = sorted(problems, key=lambda p: p.line or 0)
        lines = [f"{path}: {problem}" for problem in self.problems]
        super().__init__("\n".join(lines))


def parse_policy_text(text: str, path: Path) -> PolicyFile:
    """Validate policy YAML; raise PolicyFileError listing every problem."""
    yaml = YAML(typ="rt")
    try:
        document = yaml.load(text)
    except MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else None
        what = e.problem or e.context or "invalid YAML"
        raise PolicyFileError(path, [Problem(line, "", f"YAML syntax: {what}")]) from None
    except YAMLError as e:
        raise PolicyFileError(path, [Problem(None, "", f"YAML syntax: {e}")]) from None
    decoder = Decoder()
    result = decoder.decode_dataclass(PolicyFile, document, "", 1)
    if isinstance(result, PolicyFile):
        _check_references(result, document, decoder)
    if decoder.problems or not isinstance(result, PolicyFile):
        raise PolicyFileError(path, decoder.problems)
    return result


def load_policy_file(path: Path) -> PolicyFile:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PolicyFileError(path, [Problem(None, "", "no such file")]) from None
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise PolicyFileError(path, [Problem(None, "", f"cannot read: {reason}")]) from None
    return parse_policy_text(text, path)


def _check_references(policy_file: PolicyFile, document: object, decoder: Decoder) -> None:
    """Names that must refer to a defined policy, and experiment-wide constraints."""
    names = set(policy_file.policies)

    def known(name: str, path: str, line: int | None) -> None:
        if name not in names:
            listed = ", ".join(sorted(names)) or "none defined"
            decoder.fail(line, path, f"no policy named {name!r} (policies: {listed})")

    known(policy_file.default, "default", _line_of(document, "default"))
    policies_node = document.get("policies") if isinstance(document, dict) else None
    for name, policy in policy_file.policies.items():
        unshared = policy.upstream is not None and not policy.upstream.share
        if policy.preconnect.mode != "off" and unshared:
            decoder.fail(
                _line_of(policies_node, name),
                f"policies.{name}.preconnect",
                "warm connections live in the shared pool, which `upstream: {share: false}` "
                "turns off",
            )
    rules_node = document.get("rules") if isinstance(document, dict) else None
    for i, rule in enumerate(policy_file.rules):
        known(rule.policy, f"rules[{i}].policy", _line_of(rules_node, i))
    experiments_node = document.get("experiments") if isinstance(document, dict) else None
    seen: set[str] = set()
    for i, experiment in enumerate(policy_file.experiments):
        line = _line_of(experiments_node, i)
        if experiment.name in seen:
            decoder.fail(line, f"experiments[{i}].name", f"duplicate name {experiment.name!r}")
        seen.add(experiment.name)
        if not experiment.arms:
            decoder.fail(line, f"experiments[{i}].arms", "needs at least one arm")
        elif sum(arm.weight for arm in experiment.arms.values()) == 0:
            decoder.fail(line, f"experiments[{i}].arms", "weights must not all be 0")
        for arm_name, arm in experiment.arms.items():
            problem = label_problem(arm_name)
            if problem is not None:
                decoder.fail(line, f"experiments[{i}].arms.{arm_name}", problem)
            known(arm.policy, f"experiments[{i}].arms.{arm_name}.policy", line)
