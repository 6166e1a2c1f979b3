"""How the command line ends a command early: one line on stderr and an exit code, no traceback."""


class UserError(Exception):
    """Bad input from the user: the message says what was wrong and what would be valid (exit 2)."""


class DataError(ValueError):
    """The data file cannot feed training; the message names the file and the problem (exit 2)."""


class StopRun(Exception):
    """Not a failure: the command ends early with this message and `code` (0: nothing to do;
    130: interrupted by the user)."""

    def __init__(self, message: str, *, code: int) -> None:
        super().__init__(message)
        self.code = code
