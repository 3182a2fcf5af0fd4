"""policies/README.md documents every key of the schema, and its examples are valid files."""

from __future__ import annotations

import re
from pathlib import Path

from reshape.policy.decode import schema_keys
from reshape.policy.loader import parse_policy_text
from reshape.policy.schema import PolicyFile

README = Path(__file__).resolve().parents[2] / "policies" / "README.md"


def test_every_schema_key_is_documented() -> None:
    text = README.read_text()
    missing = [path for path, _ in schema_keys(PolicyFile) if f"`{path}`" not in text]
    assert not missing, f"policies/README.md does not document: {missing}"


def test_yaml_examples_are_valid() -> None:
    examples = re.findall(r"```yaml\n(.*?)```", README.read_text(), re.S)
    assert examples
    for example in examples:
        parse_policy_text(example, README)


def test_shipped_policy_files_are_valid() -> None:
    from reshape.policy.loader import load_policy_file

    for path in sorted(README.parent.glob("*.yaml")):
        load_policy_file(path)
