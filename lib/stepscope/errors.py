"""One exception type for every error a user can fix.

The CLI and the runner print a `StepscopeError` as its message alone (no
traceback): the message already names the file, key or URL and the fix.
"""

from __future__ import annotations


class StepscopeError(Exception):
    """An error caused by input, environment or a server, with a fix to suggest.

    `where` names the file, key path or URL at fault; `hint` says how to fix it.
    """

    def __init__(self, message: str, *, where: str | None = None, hint: str | None = None):
        self.message = message
        self.where = where
        self.hint = hint
        super().__init__(self.render())

    def __reduce__(self):
        # Keep where/hint when the error crosses a process boundary (loader workers).
        return (_rebuild, (type(self), self.message, self.where, self.hint))

    def render(self) -> str:
        parts = []
        if self.where:
            parts.append(f"{self.where}: {self.message}")
        else:
            parts.append(self.message)
        if self.hint:
            parts.append(f"  fix: {self.hint}")
        return "\n".join(parts)


def _rebuild(cls: type[StepscopeError], message: str, where: str | None, hint: str | None) -> StepscopeError:
    return cls(message, where=where, hint=hint)


class ParamsError(StepscopeError):
    """A params file that does not validate."""


class ServerError(StepscopeError):
    """A server that cannot be started, reached or profiled."""


class TraceError(StepscopeError):
    """A trace file that cannot be read or makes no sense."""


class StageInputMissing(StepscopeError):
    """A stage needs an artifact that an earlier stage did not write."""
