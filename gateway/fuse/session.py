"""What the daemon needs of a FUSE transport: mount, serve until unmounted, stop.

Why: the daemon picks a transport (`kernel.choose_transport`) and runs whichever it picked
the same way, through this shape, which `kernel.KernelSession` and `libfuse.LibfuseSession`
both have; how each talks to the kernel stays inside fuse/.
"""

from __future__ import annotations

from typing import Any, Protocol


class FuseSession(Protocol):
    """One mount of one filesystem (`ops.Operations`)."""

    @property
    def passthrough(self) -> bool:
        """Whether the kernel reads and writes cache files itself (granted at INIT)."""
        ...

    passthrough_error: str | None  # why there is no passthrough, when there is none
    workers: int  # request workers moving data (status: fuse_workers)

    @property
    def protocol(self) -> str | None:
        """The FUSE protocol version spoken with the kernel ("7.38"), None where unknown."""
        ...

    def mount(self) -> None:
        """Mount at the mount point; requests are answered once `serve` runs."""
        ...

    async def serve(self, *, task_status: Any = ...) -> None:
        """Report started once answering, then serve until unmounted or `stop()`."""
        ...

    async def invalidate_entry(self, parent: int, name: bytes) -> None:
        """Make the kernel forget the name `name` in directory `parent` (OSError ENOENT: it had none).
        May wait for a request on that directory: never from within one (`invalidations.py`)."""
        ...

    async def invalidate_inode(self, ino: int) -> None:
        """Make the kernel forget the attributes and pages it caches of `ino` (OSError ENOENT: none)."""
        ...

    async def stop(self) -> None:
        """Unmount, stop serving, release the connection."""
        ...
