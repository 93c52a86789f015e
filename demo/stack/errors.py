"""The one error type the stack reports to its user."""


class StackError(Exception):
    """A problem the user can fix (missing binary, port taken, bad file); printed as is."""
