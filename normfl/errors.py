"""The error every refused input raises, wherever it is detected, and the one a release beyond its bound raises."""


class ConfigError(ValueError):
    """A bad config value, refused before any training: names the key, the value and what is allowed."""

    def __init__(self, key: str, value, allowed: str, message: str | None = None):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(message or f"invalid config: {key}={value!r}; allowed: {allowed}")


class PrivacyError(RuntimeError):
    """A private run's algorithm handed its privatizer a message beyond the sensitivity the noise is calibrated
    to: its release would not be as private as the run reports, so the run stops before releasing it."""


class DataError(ConfigError):
    """A bad data file (``dataset=npz``): names the file, the array, the problem and what is allowed."""

    def __init__(self, path, array: str, problem: str, allowed: str):
        super().__init__("dataset.path", str(path), allowed,
                         f"invalid data: {path}: {array}: {problem}; allowed: {allowed}")
