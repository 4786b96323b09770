"""Request bodies for the store's uploads, read in place instead of copied into memory.

botocore reads a body as a file and seeks back to the start to retry a request or to
checksum it, so each is a seekable, read-only file of a known length: `RangeReader` over a
range of a cache file (a part is never held whole in memory), `ViewReader` over a part
buffer of a streamed copy (no copy of the whole).
"""

from __future__ import annotations

import io
import os
from typing import Any


class _SeekableBody(io.RawIOBase):
    """A seekable, read-only request body of `length` bytes (botocore seeks back to retry or to checksum)."""

    length: int
    pos: int

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.length}[whence]
        self.pos = max(0, min(self.length, base + pos))
        return self.pos


class RangeReader(_SeekableBody):
    """`length` bytes of `fd` at `offset` (pread, no shared file position)."""

    def __init__(self, fd: int, offset: int, length: int) -> None:
        super().__init__()
        self.fd, self.offset, self.length, self.pos = fd, offset, length, 0

    def read(self, n: int = -1) -> bytes:
        left = self.length - self.pos
        if n is None or n < 0 or n > left:
            n = left
        if n <= 0:
            return b""
        data = os.pread(self.fd, n, self.offset + self.pos)
        if len(data) < n:
            raise OSError(f"cache file shrank while uploading (wanted {n} bytes, got {len(data)})")
        self.pos += len(data)
        return data

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


class ViewReader(_SeekableBody):
    """A memoryview (a part buffer of a streamed copy) as a body: no copy of the whole."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self.view, self.length, self.pos = view, len(view), 0

    def read(self, n: int = -1) -> bytes:
        end = len(self.view) if n is None or n < 0 else min(len(self.view), self.pos + n)
        data = self.view[self.pos:end].tobytes()
        self.pos = end
        return data

    def readinto(self, b: Any) -> int:
        n = min(len(b), len(self.view) - self.pos)
        b[:n] = self.view[self.pos:self.pos + n]
        self.pos += n
        return n
