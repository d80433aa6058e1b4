"""Load generation, reports and capacity planning (`headrace bench`, `headrace plan`)."""


class BenchError(Exception):
    """A problem the user must fix (bad URL, bad flag, server answering errors); the commands
    print it on one line and exit non-zero."""
