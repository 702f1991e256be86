"""The error every check raises for a configuration that cannot run (re-exported by runner.config)."""


class ConfigError(ValueError):
    """A configuration that cannot run; its message is one line meant for the user."""
