"""Errors the command line reports as one line (exit code 2) instead of a traceback."""


class UserError(Exception):
    """Bad input from the user: the message says what was wrong and what would be valid."""
