"""Errors that end a command with a one-line message and an exit status, never a traceback."""

from __future__ import annotations


class ReshapeError(Exception):
    """A failure the user can act on. `str(error)` is the whole message."""

    exit_status = 1


class UsageError(ReshapeError):
    """Bad command-line or configuration input (exit status 2, like argparse)."""

    exit_status = 2
