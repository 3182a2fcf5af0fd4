"""Turn parsed YAML into typed, frozen dataclasses, collecting every error with line and key path.

The schema is the dataclasses themselves (reshape/policy/schema.py): their type hints say what a key
holds and `knob()` metadata says what it means and which values are allowed. Nothing else defines
the schema, so the documentation test can check policies/README.md against the same classes.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin, get_type_hints

_MISSING = dataclasses.MISSING


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a policy file."""

    line: int | None  # 1-based
    path: str  # dotted key path, e.g. policies.fast.upstream.max_queue
    message: str

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        return f"{where}{self.path or '(top level)'}: {self.message}"


def knob(
    default: Any = _MISSING,
    *,
    doc: str,
    minimum: float | None = None,
    maximum: float | None = None,
    check: Callable[[Any], str | None] | None = None,
    default_factory: Callable[[], Any] | None = None,
) -> Any:
    """A schema field. `check` returns an error message for a bad value, or None."""
    metadata = {"doc": doc, "minimum": minimum, "maximum": maximum, "check": check}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _line_of(container: Any, key: Any) -> int | None:
    """1-based line of `key` inside a ruamel mapping/sequence, when ruamel recorded it."""
    lc = getattr(container, "lc", None)
    if lc is None:
        return None
    try:
        pos = lc.key(key) if isinstance(container, Mapping) else lc.item(key)
    except (KeyError, IndexError, TypeError, AttributeError):
        return None
    return pos[0] + 1 if pos else None


def _describe(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return f"{type(value).__name__} {value!r}"


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (types.UnionType, typing.Union):
        return " or ".join(_type_name(a) for a in get_args(tp) if a is not type(None))
    if origin in (list, tuple):
        return "a list"
    if origin in (dict, Mapping) or dataclasses.is_dataclass(tp):
        return "a mapping"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
        tp, str(tp)
    )


class Decoder:
    """Decodes one document; `problems` collects everything wrong with it."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def fail(self, line: int | None, path: str, message: str) -> None:
        self.problems.append(Problem(line, path, message))

    def decode(self, tp: Any, value: Any, path: str, line: int | None) -> Any:
        """Value of type `tp`, or None after recording a problem."""
        origin = get_origin(tp)
        if origin in (types.UnionType, typing.Union):
            options = [a for a in get_args(tp) if a is not type(None)]
            if value is None and type(None) in get_args(tp):
                return None
            if len(options) == 1:
                return self.decode(options[0], value, path, line)
            raise TypeError(f"schema: unions of several types are not supported ({tp})")
        if origin is Literal:
            if value in get_args(tp) and type(value) in {type(a) for a in get_args(tp)}:
                return value
            self.fail(line, path, f"expected {_type_name(tp)}, got {_describe(value)}")
            return None
        if origin in (list, tuple):
            return self._decode_list(get_args(tp)[0], value, path, line)
        if origin in (dict, Mapping):
            return self._decode_dict(get_args(tp)[1], value, path, line)
        if dataclasses.is_dataclass(tp):
            return self.decode_dataclass(typing.cast(type, tp), value, path, line)
        return self._decode_scalar(tp, value, path, line)

    def _decode_scalar(self, tp: Any, value: Any, path: str, line: int | None) -> Any:
        # bool is an int in Python; YAML's `true` must not pass as a number or vice versa.
        if tp is bool:
            ok = isinstance(value, bool)
        elif tp is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif tp is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            value = float(value) if ok else value
        elif tp is str:
            ok = isinstance(value, str)
        else:
            raise TypeError(f"schema: unsupported type {tp}")
        if not ok:
            self.fail(line, path, f"expected {_type_name(tp)}, got {_describe(value)}")
            return None
        return value

    def _decode_list(self, item_tp: Any, value: Any, path: str, line: int | None) -> Any:
        if not isinstance(value, Sequence) or isinstance(value, str):
            self.fail(line, path, f"expected a list, got {_describe(value)}")
            return None
        items = tuple(
            self.decode(item_tp, item, f"{path}[{i}]", _line_of(value, i) or line)
            for i, item in enumerate(value)
        )
        # A failed item was reported already; a half-decoded list is no value at all.
        return None if any(item is None for item in items) else items

    def _decode_dict(self, item_tp: Any, value: Any, path: str, line: int | None) -> Any:
        if not isinstance(value, Mapping):
            self.fail(line, path, f"expected a mapping, got {_describe(value)}")
            return None
        out = {}
        for key, item in value.items():
            key_line = _line_of(value, key) or line
            if not isinstance(key, str) or not key:
                self.fail(key_line, path, f"names must be non-empty strings, got {key!r}")
                continue
            out[key] = self.decode(item_tp, item, f"{path}.{key}" if path else key, key_line)
        if any(item is None for item in out.values()):
            return None
        return types.MappingProxyType(out)

    def decode_dataclass(self, cls: type, value: Any, path: str, line: int | None) -> Any:
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            self.fail(line, path, f"expected a mapping, got {_describe(value)}")
            return None
        fields = {f.name: f for f in dataclasses.fields(cls)}
        hints = get_type_hints(cls)
        for key in value:
            if key not in fields:
                self.fail(
                    _line_of(value, key) or line,
                    f"{path}.{key}" if path else str(key),
                    "unknown key" + _suggestion(str(key), fields),
                )
        kwargs = {}
        for name, field in fields.items():
            sub = f"{path}.{name}" if path else name
            if name not in value:
                if field.default is _MISSING and field.default_factory is _MISSING:
                    self.fail(line, sub, "missing (required)")
                continue
            key_line = _line_of(value, name) or line
            decoded = self.decode(hints[name], value[name], sub, key_line)
            if decoded is None and value[name] is not None:
                continue
            if decoded is not None and self._check_field(field, decoded, sub, key_line):
                kwargs[name] = decoded
        try:
            return cls(**kwargs)
        except TypeError:
            return None  # a required field failed; already reported

    def _check_field(
        self, field: dataclasses.Field, value: Any, path: str, line: int | None
    ) -> bool:
        meta = field.metadata
        minimum, maximum = meta.get("minimum"), meta.get("maximum")
        if minimum is not None and isinstance(value, (int, float)) and value < minimum:
            self.fail(line, path, f"must be at least {minimum}, got {value}")
            return False
        if maximum is not None and isinstance(value, (int, float)) and value > maximum:
            self.fail(line, path, f"must be at most {maximum}, got {value}")
            return False
        check = meta.get("check")
        if check is not None and (message := check(value)):
            self.fail(line, path, message)
            return False
        return True


def _suggestion(key: str, valid: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.6)
    if close:
        return f" (did you mean {close[0]!r}?)"
    if valid:
        return " (valid keys: " + ", ".join(sorted(valid)) + ")"
    return " (no keys are defined here)"


def schema_keys(cls: type, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field]]:
    """Every key path of a schema dataclass (for documentation checks)."""
    hints = get_type_hints(cls)
    for field in dataclasses.fields(cls):
        path = f"{prefix}.{field.name}" if prefix else field.name
        yield path, field
        tp = hints[field.name]
        for arg in (tp, *get_args(tp)):
            if dataclasses.is_dataclass(arg):
                yield from schema_keys(typing.cast(type, arg), path)
