"""h2's validation of a received header block, in one pass instead of seven generators.

Why a patch: h2 4.3.0 validates every header block it receives (`h2.stream` calls
`h2.utilities.validate_headers` from `H2Stream._process_received_headers`) through a chain of
seven generators, and its first link walks every byte of every name and value in a Python loop
(`_reject_illegal_characters`). mitmproxy's HTTP/2 layers (towards the browser) and the
engine's HTTP/2 connections (towards the origins) both receive through it: with a browser's
request heads (a dozen fields, a 100-byte user agent) through the pool, the chain was 6.7% of
the proxy's CPU (py-spy, bench/RESULTS.md). No hook or h2 setting changes it short of turning
validation off, and it is a security boundary (RFC 9113 §8.2.1: no CR, LF or NUL may reach an
HTTP/1.1 origin).

The replacement asks the same questions of each field with C-speed tests (a regular expression
for the name's characters, `holds_line_break_or_nul` for the value's) and, at the end of the
block, the same pseudo-header and Host/`:authority` questions. It only ever answers "valid":
whenever any test fails, the block goes through h2's own chain, which raises exactly the error
h2 raises (the same message, for the first field at fault). So the fast path must only be sound
— every block it passes h2 passes too (tests/unit/mitm/patches/test_h2_header_validation.py
compares the two on generated blocks) — and returns the same field objects, in order.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import h2.stream
import h2.utilities
from h2.exceptions import ProtocolError

from reshape.mitm.patches.base import Patch, Replacement
from reshape.upstream.types import holds_line_break_or_nul

# The h2 releases whose `validate_headers` this was read against.
H2_CHECKED_ON = ("4.3.0",)

# A field name h2 accepts character by character (RFC 9113 §8.2.1): no controls, space, upper
# case, DEL or non-ASCII, and a colon only as a pseudo-header's first character. Not empty.
_VALID_NAME = re.compile(rb":?[\x21-\x39\x3b-\x40\x5b-\x7e]+")
_WHITESPACE = (0x20, 0x09)
_COLON = 0x3A
_PSEUDO = h2.utilities._ALLOWED_PSEUDO_HEADER_FIELDS
_CONNECTION_SPECIFIC = h2.utilities.CONNECTION_HEADERS

# Regular field names already found valid: a browser sends the same dozen on every request, so
# most names are a set lookup instead of a match. Bounded in count and in each name's length (a
# peer cannot make it hold much: 4,096 names of up to 64 bytes); other names are matched each time.
_KNOWN_GOOD_NAMES: set[bytes] = set()
KNOWN_GOOD_NAMES_KEPT = 4096
KNOWN_GOOD_NAME_BYTES = 64


def _passes(headers: list[Any], flags: h2.utilities.HeaderValidationFlags) -> bool:
    """Whether h2's `validate_headers` accepts the block (False: let h2 decide and explain)."""
    is_request = not flags.is_response_header and not flags.is_trailer
    seen_pseudo: set[bytes] = set()
    seen_regular = False
    method = authority = host = None
    known = _KNOWN_GOOD_NAMES
    try:
        for name, value in headers:
            if value:
                if holds_line_break_or_nul(value):
                    return False
                if value[0] in _WHITESPACE or value[-1] in _WHITESPACE:
                    return False
            elif type(value) is not bytes:
                return False
            if name not in known:
                if type(name) is not bytes or _VALID_NAME.fullmatch(name) is None:
                    return False
                if name[0] == _COLON:
                    if seen_regular or name in seen_pseudo or name not in _PSEUDO:
                        return False
                    seen_pseudo.add(name)
                    if name == b":method":
                        method = value
                    elif name == b":path":
                        if is_request and not value:
                            return False
                    elif name == b":authority":
                        authority = value
                    continue
                if name in _CONNECTION_SPECIFIC:
                    return False
                if len(known) < KNOWN_GOOD_NAMES_KEPT and len(name) <= KNOWN_GOOD_NAME_BYTES:
                    known.add(name)
            # A regular field, its name valid (and known from now on, within the bounds).
            seen_regular = True
            if name == b"host":
                host = value
            elif name == b"te" and value.lower() != b"trailers":
                return False
        h2.utilities._check_pseudo_header_field_acceptability(seen_pseudo, method, flags)
    except (ProtocolError, TypeError, ValueError):
        return False  # h2's chain says which, with its own message (or raises as before)
    if is_request:
        if authority is None and host is None:
            return False
        if authority is not None and host is not None and authority != host:
            return False
    return True


def validate_headers(
    headers: Iterable[Any], hdr_validation_flags: h2.utilities.HeaderValidationFlags
) -> Iterable[Any]:
    """h2's `validate_headers`, answered in one pass when the block is valid."""
    block = list(headers)
    if _passes(block, hdr_validation_flags):
        return block
    return h2.utilities.validate_headers(block, hdr_validation_flags)


class ValidateH2HeadersInOnePass(Patch):
    """Replace the `validate_headers` h2's streams call (see the module docstring)."""

    libraries_checked_on = {"h2": H2_CHECKED_ON}

    def replacements(self) -> Iterable[Replacement]:
        yield h2.stream, "validate_headers", validate_headers
