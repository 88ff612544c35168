"""One exception type for every mistake a user can make; the CLI prints it as one line."""


class HeadwiseError(ValueError):
    """Bad input or an unsupported request. The message says what was wrong and what to do.

    A ``ValueError``, so code that already guards against bad values catches it too.
    """


class HeadwiseNote(UserWarning):
    """What headwise did in place of what was asked (e.g. more calibration data than ``--calibration-limit``, to
    meet a method's need), said once when it happens; the command line prints it as one ``headwise: note:`` line."""
