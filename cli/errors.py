"""The errors a `ckptfs` command reports to its user, and their exit codes.

The control-socket client raises them and the typer app turns them into one line on stderr. They are
the Python API's errors too (`ckptfs.CkptfsError`), so they live below both in gateway/client.py;
`CliError` is the commands' name for `CkptfsError`.
"""

from __future__ import annotations

from ckptfs.client import EXIT_ERROR, EXIT_USAGE, DaemonRefused, NotAllowed, StoppedEarly  # noqa: F401 - re-exported
from ckptfs.client import CkptfsError as CliError  # noqa: F401 - re-exported
