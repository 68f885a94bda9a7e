"""What every command may raise for bad input."""

EXIT_BAD_INPUT = 2


class CommandError(Exception):
    """Bad input to a command: printed as one line, exit status 2."""
