"""The client side of the control socket, for the commands: the shared client in `ckptfs.client`.

Finding the mount a path is in, its daemon and its socket, `request`, `one_reply`, `until_done` and
`flush` live below the CLI in gateway/client.py, since the Python API (`import ckptfs`) speaks the same
protocol with the same one-line errors; the commands import them from here as before.
"""

from __future__ import annotations

from ckptfs.client import (  # noqa: F401 - the names the commands use
    CONTROL_XATTR,
    MOUNT_ANSWER_SECONDS,
    control_socket,
    dead_mount,
    find_mount_root,
    until_durable,
    get_status,
    locate,
    locate_on_replica,
    not_answering,
    one_reply,
    process_state,
    rel_path,
    request,
    requester,
    stopped_daemon,
    until_done,
)
