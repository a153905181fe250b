"""The one exception type for a user's mistake."""


class HarnessError(Exception):
    """A mistake the user can fix: a bad file, an unknown name, settings that cannot work.

    The message says what to change. The CLI prints it on one line and exits with 2,
    before anything is started.
    """

    exit_code = 2
