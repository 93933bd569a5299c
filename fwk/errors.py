"""Errors that are the user's to fix: the CLI prints them as one line and exits 2."""


class UserError(Exception):
    """A mistake in the user's input: its config, paths or data. Its one line says what, and how to fix it."""

    exit_code = 2
