"""Errors the harness reports as one clear line (exit code 2) instead of a traceback. Bottom layer:
methods, tasks and runners all raise them."""


class HarnessError(Exception):
    """A problem with the user's input or environment, reported as one line."""

    exit_code = 2


class ConfigError(HarnessError):
    """A configuration that cannot run: unknown name or key, budget or layer out of range, ..."""
