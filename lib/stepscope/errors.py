"""One exception type for every error a user can fix.

The CLI and the runner print a `StepscopeError` as its message alone (it names the file, key or URL and the
fix); its texts pass through `redaction.scrub` when made, so no secret is shown or recorded.
"""

from __future__ import annotations

from stepscope.redaction import scrub


class StepscopeError(Exception):
    """An error caused by input, environment or a server: `where` names what is at fault, `hint` the fix."""

    def __init__(self, message: str, *, where: str | None = None, hint: str | None = None):
        self.message = scrub(message)
        self.where = scrub(where) if where else where
        self.hint = scrub(hint) if hint else hint
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
