"""Write handles bypass the kernel page cache by default (`direct_io_writes`); shared mmap needs it off.

What a user checks: the bytes a writer sees through other handles and in the
bucket, and the error (or success) of mmap(MAP_SHARED) on a file open for writing.
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os

import pytest

from tests.conftest import Mount

MiB = 1 << 20


def test_writes_seen_by_open_readers_and_in_bucket(mount: Mount) -> None:
    path = mount.path / "weights.bin"
    data = bytearray(os.urandom(3 * MiB))
    with open(path, "wb") as f:
        f.write(data)
    with open(path, "rb") as reader:
        assert reader.read() == data  # pages cached by this reader...
        with open(path, "r+b") as writer:
            writer.seek(MiB + 5)
            writer.write(b"changed")
            writer.flush()
            os.fsync(writer.fileno())
        data[MiB + 5:MiB + 12] = b"changed"
        reader.seek(0)
        assert reader.read() == data  # ...do not hide what a write handle wrote since
    with open(path, "rb") as f:
        assert f.read() == data
    mount.flush()
    assert mount.object_sha256("weights.bin") == hashlib.sha256(data).hexdigest()


def test_shared_mmap_of_a_write_handle_is_refused_by_default(mount: Mount) -> None:
    path = mount.path / "mapped.bin"
    path.write_bytes(b"\0" * 8192)
    if mount.status()["passthrough"]:
        # under FUSE passthrough the kernel maps the cache file itself: shared maps just work
        with open(path, "r+b") as f, mmap.mmap(f.fileno(), 8192) as m:
            m[:5] = b"hello"
        assert path.read_bytes()[:5] == b"hello"
        return
    with open(path, "r+b") as f:
        with pytest.raises(OSError) as exc:
            mmap.mmap(f.fileno(), 8192)
    assert exc.value.errno == errno.ENODEV
    with open(path, "rb") as f:  # read-only maps still work
        with mmap.mmap(f.fileno(), 8192, prot=mmap.PROT_READ) as m:
            assert m[:4] == b"\0\0\0\0"


def test_shared_mmap_writes_with_direct_io_writes_off(make_mount) -> None:  # type: ignore[no-untyped-def]
    mount = make_mount(direct_io_writes="false")
    path = mount.path / "mapped.bin"
    path.write_bytes(b"\0" * 8192)
    with open(path, "r+b") as f:
        with mmap.mmap(f.fileno(), 8192) as m:
            m[:5] = b"hello"
            m.flush()
    expected = b"hello" + b"\0" * (8192 - 5)
    assert path.read_bytes() == expected
    mount.flush()
    assert mount.object_sha256("mapped.bin") == hashlib.sha256(expected).hexdigest()
