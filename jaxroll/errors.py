"""The one error type of jaxroll's input checks."""


class ConfigError(ValueError):
    """Bad input: names the field, the value given and what is allowed.

    A subclass of `ValueError`, so ``except ValueError`` also catches it. The
    message is always one line, fit for a command line's stderr.
    """
