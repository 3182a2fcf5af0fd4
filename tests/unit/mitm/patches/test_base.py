"""reshape/mitm/patches/base.py: install, uninstall in reverse order, the version guard."""

from __future__ import annotations

from collections.abc import Iterable

import mitmproxy.version
import pytest

from reshape.mitm.patches import Patch, PatchError, Patches
from reshape.mitm.patches.base import Replacement


class Target:
    def greet(self) -> str:
        return "hello"


class Child(Target):
    pass


class Shout(Patch):
    def __init__(self, owner: type = Target) -> None:
        super().__init__()
        self.owner = owner

    def replacements(self) -> Iterable[Replacement]:
        original = self.owner.greet

        def greet(self: Target) -> str:
            return original(self).upper()

        yield self.owner, "greet", greet


class Exclaim(Patch):
    def replacements(self) -> Iterable[Replacement]:
        original = Target.greet

        def greet(self: Target) -> str:
            return original(self) + "!"

        yield Target, "greet", greet


def test_install_replaces_and_uninstall_restores() -> None:
    patch = Shout()
    patch.install()
    assert Target().greet() == "HELLO" and patch.installed
    patch.uninstall()
    assert Target().greet() == "hello" and not patch.installed


def test_an_inherited_attribute_is_deleted_again_not_copied_down() -> None:
    with Patches([Shout(Child)]):
        assert Child().greet() == "HELLO" and Target().greet() == "hello"
    assert "greet" not in vars(Child)


def test_patches_of_one_method_stack_and_come_off_in_reverse_order() -> None:
    patches = Patches([Shout(), Exclaim()])
    with patches:
        assert Target().greet() == "HELLO!"
    assert Target().greet() == "hello"


def test_a_failed_install_takes_back_what_it_did() -> None:
    first = Shout()
    first.install()
    try:
        with pytest.raises(PatchError, match="already installed"):
            Patches([Exclaim(), first]).install()
        assert Target().greet() == "HELLO"  # Exclaim came off again; `first` is untouched
    finally:
        first.uninstall()


def test_an_unchecked_mitmproxy_version_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(mitmproxy.version, "VERSION", "13.0.0")
    with pytest.raises(PatchError) as refused:
        Shout().install()
    message = str(refused.value)
    assert "\n" not in message
    assert "Shout" in message and "12.2.3" in message and "13.0.0" in message
    assert Target().greet() == "hello"


class ShoutOnH2(Shout):
    libraries_checked_on = {"h2": ("4.3.0",)}


def test_an_unchecked_release_of_another_library_is_refused_and_changes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.metadata

    patch = ShoutOnH2()
    patch.install()  # the pinned h2 passes
    assert Target().greet() == "HELLO"
    patch.uninstall()
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "9.9.9")
    with pytest.raises(PatchError, match="checked on h2 4.3.0, not 9.9.9: pin h2"):
        ShoutOnH2().install()
    assert Target().greet() == "hello"
