"""Object key = path under the mount, below the configured prefix; which names a key can hold."""

from __future__ import annotations

import errno
import logging

from ..sizes import S3_MAX_KEY_BYTES

log = logging.getLogger(__name__)

# objects the mount puts for a moment to learn what the store does to keys (see Store.probe_key_chars)
PROBE_NAME_PREFIX = ".ckptfs-probe-"

RESERVED_PREFIX = ".ckptfs"  # names ckptfs keeps for itself (manifests, audit log): hidden from the mount


def is_reserved(name: str) -> bool:
    """True for a name that belongs to ckptfs (`.ckptfs*`): never shown in the mount, never created through it."""
    return name.startswith(RESERVED_PREFIX)


class Keys:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        # characters the store does not keep as written (found at mount): names with them are refused
        self.refused: dict[str, str] = {}

    def of(self, path: str) -> str:
        """The object key of mount-relative `path`."""
        return self.prefix + path

    def path(self, key: str) -> str:
        """The mount-relative path of object `key` (which must be under the prefix)."""
        return key[len(self.prefix):]

    def check_new(self, parent_path: str, name: str, below: int = 0) -> None:
        """Refuse a name about to appear at `parent_path/name` that the bucket could not hold as written.

        `below`: bytes the longest key under it adds (a directory's `dir/` marker, the files of a moved tree).
        """
        bad = [c for c in dict.fromkeys(name) if c in self.refused]
        if bad:
            shown = ", ".join(f"{c!r} (stored as {self.refused[c]!r})" for c in bad)
            log.warning("refused the name %r: the object store does not keep %s in keys as written", name, shown)
            raise OSError(errno.EINVAL, f"the object store cannot keep {shown} in a name")
        if name.startswith(PROBE_NAME_PREFIX):
            log.warning("refused the name %r: names starting with %s are reserved by ckptfs", name, PROBE_NAME_PREFIX)
            raise OSError(errno.EINVAL, "reserved name")
        path = f"{parent_path}/{name}" if parent_path else name
        size = len(self.of(path).encode()) + below
        if size > S3_MAX_KEY_BYTES:
            raise OSError(errno.ENAMETOOLONG, f"object key would be {size} bytes, more than the store's {S3_MAX_KEY_BYTES}")
