"""One exception type for every mistake a user can make; the CLI prints it as one line."""


class HeadwiseError(Exception):
    """Bad input or an unsupported request. The message says what was wrong and what to do."""
