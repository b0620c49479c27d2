"""The one error type of jaxroll's input checks."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """Bad input: names the field, the value given and what is allowed.

    A subclass of `ValueError`, so ``except ValueError`` also catches it. The
    message is always one line, fit for a command line's stderr. Built with
    `ConfigError.of`, it carries its parts as data (`field`, `value`,
    `allowed`), so a caller that knows the user's spelling of the field (a
    command-line flag, a YAML path) renames it with `renamed` instead of
    cutting the message apart::

        ConfigError.of("kl_budget", -1.0, "a number >= 0").renamed("--kl-budget")
        # --kl-budget: got -1.0; allowed: a number >= 0

    A plain ``ConfigError("field: ...")`` (one line, field first) is read the
    same way: `field` is the text before the first ``": "``.
    """

    field: str | None
    value: object
    allowed: str | None

    def __init__(self, message: str, *, field: str | None = None, value: object = None,
                 allowed: str | None = None):
        super().__init__(message)
        if field is None:
            head, separator, _ = message.partition(": ")
            field = head if separator and head and "\n" not in head else None
        self.field, self.value, self.allowed = field, value, allowed

    @classmethod
    def of(cls, field: str, value: object, allowed: str) -> "ConfigError":
        """``"{field}: got {value!r}; allowed: {allowed}"``, with its parts kept as data."""
        return cls(f"{field}: got {_shown(value)}; allowed: {allowed}", field=field, value=value, allowed=allowed)

    @property
    def detail(self) -> str:
        """The message after its field: what was wrong and what is allowed."""
        message = str(self)
        if self.field is not None and message.startswith(f"{self.field}: "):
            return message[len(self.field) + 2:]
        return message

    def renamed(self, field: str) -> "ConfigError":
        """The same error under the name the user typed (``--kl-budget``, ``kernel.slopes[2]``)."""
        return ConfigError(f"{field}: {self.detail}", field=field, value=self.value, allowed=self.allowed)

    def within(self, prefix: str) -> "ConfigError":
        """The same error with its field placed inside `prefix` (``"layers[3]"`` -> ``"kernel.layers[3]"``)."""
        field = f"{prefix}.{self.field}" if self.field else prefix
        return self.renamed(field)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
