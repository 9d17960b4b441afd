"""The error every refused input raises, wherever it is detected, and those of a run that stops for a cause its user
can mend (``RunStopped``: a release beyond its bound, a round's state left undeclared)."""


class ConfigError(ValueError):
    """A bad config value, refused before any training: names the key, the value and what is allowed."""

    def __init__(self, key: str, value, allowed: str, message: str | None = None):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(message or f"invalid config: {key}={value!r}; allowed: {allowed}")


class RunStopped(RuntimeError):
    """A run stopped by something its user can mend, in their algorithm or its setting: the message says the cause
    and the mend, and ``train.py`` says it in one line (the traceback goes to the run's log; ``hydra.verbose=true``
    or ``NORMFL_TRACEBACK=1`` shows it on the console too)."""


class PrivacyError(RunStopped):
    """A private run's algorithm handed its privatizer a message beyond the sensitivity the noise is calibrated
    to: its release would not be as private as the run reports, so the run stops before releasing it."""


class DataError(ConfigError):
    """A bad data file (``dataset=npz``): names the file, the array, the problem and what is allowed."""

    def __init__(self, path, array: str, problem: str, allowed: str):
        super().__init__("dataset.path", str(path), allowed,
                         f"invalid data: {path}: {array}: {problem}; allowed: {allowed}")
