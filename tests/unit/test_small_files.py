"""What one small file costs the daemon, counted (requests, SQL statements), never timed.

bench/small_files.py measures the time; these pin down the counts it depends on: the kernel
is told once that FLUSH is not needed, and the drainer's bookkeeping per upload is a fixed
number of statements whatever the number of files waiting.
"""

from __future__ import annotations

import errno
import struct

import trio

from ckptfs.fs import CkptFS
from ckptfs.fuse import abi
from ckptfs.fuse import messages as P
from ckptfs.fuse.handlers import RequestHandlers
from ckptfs.fuse.iomode import IoModes
from ckptfs.fuse.ops import Operations
from tests.unit.test_fuse_protocol import request


def _error_of(parts: list[object]) -> int:
    """The errno of an encoded reply (0 for success)."""
    header = bytes(parts[0])[: abi.OUT_HEADER.size]
    return -abi.OUT_HEADER.unpack(header)[1]


def test_flush_is_answered_enosys_so_the_kernel_stops_sending_it() -> None:
    # fs.py has nothing to do at close(2): ENOSYS sets the kernel's no_flush, one request less per close
    assert CkptFS.flush is Operations.flush
    handlers = RequestHandlers(Operations(), IoModes(lambda fd: 0, lambda i: None, enabled=False))
    req = P.parse_request(request(abi.Op.FLUSH, struct.pack("<QIIQ", 5, 0, 0, 77)))

    async def flush() -> int:
        try:
            parts, _ = await handlers.handle(req)
        except OSError as e:
            return e.errno or 0
        return _error_of(parts)
    assert trio.run(flush) == errno.ENOSYS
