"""The plugin's exit codes and its one error for bad input (the codes are listed in cli.py's docstring)."""

EXIT_OK, EXIT_BAD, EXIT_INPUT, EXIT_CLUSTER = 0, 1, 2, 3


class InputError(Exception):
    """Bad input; the message names the fix (exit 2)."""
