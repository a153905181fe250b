"""The one exception type for a user's mistake."""


class HarnessError(Exception):
    """A mistake the user can fix: a bad file, an unknown name, settings that cannot work.

    The message says what to change. The CLI prints it on one line and exits with 2,
    before anything is started.
    """

    exit_code = 2


def one_line(text: str) -> str:
    """Control characters (from a user's file) shown escaped, so an error stays one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
