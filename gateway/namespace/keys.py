"""Object key = path under the mount, below the configured prefix."""

from __future__ import annotations


class Keys:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def of(self, path: str) -> str:
        """The object key of mount-relative `path`."""
        return self.prefix + path

    def path(self, key: str) -> str:
        """The mount-relative path of object `key` (which must be under the prefix)."""
        return key[len(self.prefix):]
