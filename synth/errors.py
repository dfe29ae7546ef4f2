"""The one exception type for bad user input; the CLI turns it into exit code 2."""


class SynthError(Exception):
    """A user-facing error: the message names what is wrong and how to fix it."""
