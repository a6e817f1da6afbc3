"""One base for every error mimo-jobs raises for a person to read.

The CLI catches `MimoJobsError` once and prints it as `error: <where>: <what>` with the error's exit code
(2: bad input, nothing written; 1: something ran and failed). Errors keep their historical built-in base too
(`ValueError`, `RuntimeError`), so code that caught those still does.
"""

from __future__ import annotations


class MimoJobsError(Exception):
    """An error a user can act on. `where` names the file, field or object; the message says what and why."""

    exit_code = 2

    def __init__(self, message: str = "", where: str | None = None):
        super().__init__(message)
        self.where = where

    def describe(self) -> str:
        """`<where>: <what>` (or just `<what>` when the message already starts with its place)."""
        msg = str(self)
        return f"{self.where}: {msg}" if self.where and not msg.startswith(f"{self.where}:") else msg
