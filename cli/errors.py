"""The errors a `ckptfs` command reports to its user, and their exit codes.

A leaf: the control-socket client raises them and the typer app turns them into one line on
stderr, so both import them from here rather than from each other.
"""

from __future__ import annotations

from pathlib import Path

EXIT_ERROR = 1
EXIT_USAGE = 2


class CliError(Exception):
    """Something the user can fix: printed as one line (`ckptfs: error: ...`), exit `code`."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


class DaemonRefused(CliError):
    """The daemon of `mount_root` answered a request with an error: its message names paths relative to that root."""

    def __init__(self, message: str, mount_root: Path) -> None:
        super().__init__(message)
        self.mount_root = mount_root


class NotAllowed(CliError):
    """This user may not use the mount or its control socket (FUSE without allow_other, the 0600 socket)."""


class StoppedEarly(CliError):
    """The daemon closed a streamed request before its final reply (it is shutting down, or died)."""
