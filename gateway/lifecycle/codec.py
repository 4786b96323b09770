"""The compressed cold tier's object format: independent chunks, each with its own xxh3-64.

A compressed object (key: the file's name + `SUFFIX`) is `MAGIC` followed by frames, one per chunk
of the original (`CHUNK`, 4 MiB; the last shorter). Frames are independent, so a restore or a deep
verify decodes several at once on several cores, in bounded memory, and a damaged one is named by
its offset. A frame is a header (`FRAME`: b"CKZF", the chunk's length, the body's length, the
chunk's xxh3-64) and a body of segments that cover the chunk in order, each:

    u8 method, u32 original length, then
      RAW    the bytes as they are
      ZSTD   u32 length, one zstd frame
      FLOAT  u8 width (2, 4, 8), then for each byte plane (floats.split; the exponent's first):
             u8 how (0 as is, 1 zstd), u32 length, the plane's bytes

`encode` compresses each segment as the layout says (layout.py: a float codec for tensor bytes of
a known width, zstd level 3 for the rest, "try" where the dtype is unknown: the smallest of the
candidates on a sample); a frame that saves nothing holds the chunk as it is. `decode_body` checks
every length against the header and the chunk's xxh3-64, and raises `CodecError` on any mismatch.
Nothing relies on a frame before it was decoded and checked so: the mover reads its copy back from
the target and decodes it before the hot copy goes (coldcopy.py), and a file whose copy does not
give back its bytes is copied again as it is; a codec bug costs ratio, never data.

Pure functions (numpy, zstandard, xxhash): the compressor contexts are per thread, since the
callers run `encode`/`decode` in worker threads (zstandard and numpy release the GIL). numpy and
zstandard are the 'cold' extra (pyproject.toml): every node imports this module for the helpers
(`is_compressed`, `stored_path`, ...), only encoding and decoding need them, and without them
`require` raises `CodecError` with the line to install them.
"""

from __future__ import annotations

import logging
import struct
import threading
from typing import Any, Iterator

import xxhash

try:  # the 'cold' extra
    import numpy as np
    import zstandard

    from . import floats
except ImportError as e:
    MISSING_EXTRA: str | None = e.name  # the module that is missing
else:
    MISSING_EXTRA = None

log = logging.getLogger(__name__)

NEEDS_EXTRA = "cold_compression needs the 'cold' extra (numpy, zstandard): pip install 'ckptfs[cold]'"

FORMAT = "ckptfs-z1"  # the codec named in manifests and in the object's metadata
SUFFIX = ".ckptfs-z"  # the compressed object's key: the file's + this, so no S3 reader takes it for the file
MAGIC = b"CKPTFSZ1"
FRAME = struct.Struct("<4sIIQ")
FRAME_TAG = b"CKZF"
CHUNK = 4 << 20
MAX_CHUNK = 64 << 20  # a header claiming more is damage, not a chunk
RAW, ZSTD, FLOAT = 0, 1, 2
AS_IS, PACKED = 0, 1
ZSTD_LEVEL = 3
SMALL, SMALL_LEVEL = 256 << 10, 9
SAMPLE = 64 << 10  # bytes of a plane or segment tried before compressing all of it
INCOMPRESSIBLE = 0.95  # a plane whose sample keeps more than this is stored as it is
WIDTH = {"bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8}  # the float kinds and their bytes (floats.py)
KINDS = ("raw", "zstd", "try", *WIDTH)  # what layout.py may call a segment

_SEG = struct.Struct("<BI")
_LEN = struct.Struct("<I")
_PLANE = struct.Struct("<BI")
_local = threading.local()


class CodecError(Exception):
    """A compressed object that does not decode (damaged, truncated, or not ours); the message names where.
    Or this node cannot code at all (`require`)."""


def require() -> None:
    """CodecError if numpy or zstandard (the 'cold' extra) is not installed: one line instead of an ImportError."""
    if MISSING_EXTRA is not None:
        raise CodecError(f"{NEEDS_EXTRA} ({MISSING_EXTRA} is not installed)")


def is_compressed(f: dict[str, Any]) -> bool:
    """Whether a manifest entry is stored in this format (a cold target's manifest says so per file)."""
    return f.get("codec") == FORMAT


def stored_path(f: dict[str, Any]) -> str:
    """The name a manifest entry's object has under its checkpoint (the file's own, or + SUFFIX)."""
    return str(f.get("stored_path") or f["path"])


def stored_size(f: dict[str, Any]) -> int:
    """The size of a manifest entry's object (its file's size, unless compressed)."""
    return int(f.get("stored_size", f["size"]))


def _contexts() -> tuple[zstandard.ZstdCompressor, zstandard.ZstdCompressor, zstandard.ZstdCompressor, zstandard.ZstdDecompressor]:
    """This thread's (general, small, plane, decompressor) zstd contexts (a context is not thread-safe)."""
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        # planes: an entropy coder more than a matcher; a small hash table and 7-byte matches keep the match finder,
        # which crawls through low-entropy bytes, out of the way (about twice as fast as level 1, and smaller)
        plane = zstandard.ZstdCompressionParameters(window_log=17, hash_log=6, chain_log=6, search_log=1, min_match=7,
                                                    target_length=0, strategy=zstandard.STRATEGY_FAST)
        ctx = _local.ctx = (zstandard.ZstdCompressor(level=ZSTD_LEVEL), zstandard.ZstdCompressor(level=SMALL_LEVEL),
                            zstandard.ZstdCompressor(compression_params=plane), zstandard.ZstdDecompressor())
    return ctx  # type: ignore[no-any-return]


# ------------------------------------------------------------------ encoding
def _zstd(data: bytes | memoryview | np.ndarray) -> bytes:
    """zstd at level 3; harder on a small segment (headers, pickles, small files), where it costs little."""
    return _contexts()[0 if len(data) >= SMALL else 1].compress(data)  # type: ignore[arg-type]


def _plane(p: np.ndarray, first: bool) -> tuple[int, bytes | np.ndarray]:
    """(how, bytes) of one byte plane: packed when that is smaller; a sign-and-mantissa plane is tried on a sample first."""
    cctx = _contexts()[2]
    if not first and len(p) > 2 * SAMPLE:
        mid = len(p) // 2
        if len(cctx.compress(p[mid:mid + SAMPLE])) > INCOMPRESSIBLE * SAMPLE:
            return AS_IS, p
    z = cctx.compress(p)
    return (PACKED, z) if len(z) < len(p) else (AS_IS, p)


def _float(data: memoryview, width: int) -> list[bytes | np.ndarray]:
    out: list[bytes | np.ndarray] = [bytes([width])]
    for i, p in enumerate(floats.split(data, width)):  # rows of one array: each contiguous
        how, body = _plane(p, i == 0)
        out += [_PLANE.pack(how, len(body)), body]
    return out


def _size(parts: list[bytes | np.ndarray]) -> int:
    return sum(len(p) for p in parts)


def _tried(data: memoryview) -> str:
    """The kind that packs a sample of `data` (dtype unknown) smallest: zstd, or 2-, 4- or 8-byte floats."""
    n = len(data)
    take = min(n, 2 * SAMPLE) // 8 * 8
    start = (n - take) // 2 // 8 * 8
    sample = data[start:start + take]
    best, best_size = "zstd", len(_zstd(sample))
    for kind in ("bf16", "fp32", "fp64"):
        size = _size(_float(sample, WIDTH[kind]))
        if size < best_size:
            best, best_size = kind, size
    return best


def _segment(data: memoryview, kind: str, used: dict[str, int]) -> list[bytes | np.ndarray]:
    """The encoded segment (header first); `used` counts its bytes under the codec that packed them."""
    if kind == "try":
        kind = _tried(data)
    width = WIDTH.get(kind)
    if width is not None and len(data) >= width:
        n = len(data) // width * width
        out: list[bytes | np.ndarray] = [_SEG.pack(FLOAT, n), *_float(data[:n], width)]
        used[f"float{8 * width}"] = used.get(f"float{8 * width}", 0) + n
        if n < len(data):  # a value cut by the chunk's end: its bytes as they are
            out += [_SEG.pack(RAW, len(data) - n), bytes(data[n:])]
            used["raw"] = used.get("raw", 0) + len(data) - n
        return out
    if kind == "raw" or len(data) < 64:
        used["raw"] = used.get("raw", 0) + len(data)
        return [_SEG.pack(RAW, len(data)), bytes(data)]
    z = _zstd(data)
    used["zstd"] = used.get("zstd", 0) + len(data)
    return [_SEG.pack(ZSTD, len(data)), _LEN.pack(len(z)), z]


def encode(chunk: bytes | memoryview, segments: list[tuple[int, str]]) -> tuple[list[Any], dict[str, int]]:
    """The frame of `chunk`, cut into `segments` ((length, kind) in order, covering it), as the buffers to write in turn
    (joined, they would copy the chunk once more), and the bytes each codec packed.

    A frame that saves nothing holds the chunk as it is. Not decoded again here (that would halve the
    speed): the mover decodes every frame of the copy on the target and checks each chunk's xxh3-64 and
    the file's xxh3-128 before anything relies on it (coldcopy.py)."""
    require()
    chunk = memoryview(chunk).cast("B")
    used: dict[str, int] = {}
    parts: list[bytes | np.ndarray] = []
    pos = 0
    for length, kind in segments:
        parts += _segment(chunk[pos:pos + length], kind, used)
        pos += length
    if pos != len(chunk):
        raise ValueError(f"segments cover {pos} bytes of a {len(chunk)}-byte chunk")
    digest = xxhash.xxh3_64_intdigest(chunk)
    size = _size(parts)
    if size >= len(chunk):
        parts, used = [_SEG.pack(RAW, len(chunk)), chunk], {"raw": len(chunk)}  # type: ignore[list-item]
        size = _size(parts)
    return [FRAME.pack(FRAME_TAG, len(chunk), size, digest), *parts], used


# ------------------------------------------------------------------ decoding
def decode_body(body: bytes | memoryview, length: int, digest: int, offset: int) -> np.ndarray:
    """The chunk a frame's body holds (`length` bytes, xxh3-64 `digest`); `offset` (the chunk's in the file) names it in errors."""
    require()
    body = memoryview(body)
    out = np.empty(length, dtype=np.uint8)
    dctx = _contexts()[3]
    pos = at = 0

    def take(n: int) -> memoryview:
        nonlocal pos
        if n < 0 or pos + n > len(body):
            raise CodecError(f"chunk at byte {offset}: truncated body")
        pos += n
        return body[pos - n:pos]

    def unzstd(data: memoryview, n: int) -> bytes:
        try:
            got = dctx.decompress(data, max_output_size=n)
        except zstandard.ZstdError as e:
            raise CodecError(f"chunk at byte {offset}: zstd: {e}") from None
        if len(got) != n:
            raise CodecError(f"chunk at byte {offset}: a zstd stream gave {len(got)} bytes, not {n}")
        return got

    while pos < len(body):
        method, n = _SEG.unpack(take(_SEG.size))
        if at + n > length:
            raise CodecError(f"chunk at byte {offset}: segments longer than the chunk")
        if method == RAW:
            out[at:at + n] = np.frombuffer(take(n), dtype=np.uint8)
        elif method == ZSTD:
            (stored,) = _LEN.unpack(take(_LEN.size))
            out[at:at + n] = np.frombuffer(unzstd(take(stored), n), dtype=np.uint8)
        elif method == FLOAT:
            width = take(1)[0]
            if width not in (2, 4, 8) or n % width:
                raise CodecError(f"chunk at byte {offset}: a float segment of width {width} and {n} bytes")
            planes = []
            for _ in range(width):
                how, stored = _PLANE.unpack(take(_PLANE.size))
                data = take(stored)
                planes.append(unzstd(data, n // width) if how == PACKED else data)
                if how == AS_IS and stored != n // width:
                    raise CodecError(f"chunk at byte {offset}: a plane of {stored} bytes, not {n // width}")
            floats.join(planes, width, out[at:at + n])
        else:
            raise CodecError(f"chunk at byte {offset}: unknown segment method {method}")
        at += n
    if at != length:
        raise CodecError(f"chunk at byte {offset}: segments give {at} bytes, the header says {length}")
    if xxhash.xxh3_64_intdigest(out) != digest:
        raise CodecError(f"chunk at byte {offset}: its bytes do not match the chunk's xxh3-64")
    return out


class FrameReader:
    """Cuts a compressed object, fed in order in pieces of any size, into its frames (bounded: a piece and a frame held).

    A frame inside one piece is handed out as a view of it (no copy); one cut by a piece's end is joined once."""

    def __init__(self) -> None:
        self.rest = b""  # what the last piece left: the start of a frame
        self.magic = False
        self.offset = 0  # of the next frame's chunk in the original
        self.stored = 0  # bytes of the object consumed

    def feed(self, data: bytes | memoryview) -> Iterator[tuple[memoryview, int, int, int]]:
        """The frames completed by `data`: (body, chunk length, xxh3-64, chunk offset)."""
        buf = self.rest + data if self.rest else bytes(data)
        view = memoryview(buf)
        pos = 0
        if not self.magic:
            if len(buf) < len(MAGIC):
                self.rest = buf
                return
            if buf[:len(MAGIC)] != MAGIC:
                raise CodecError("not a ckptfs compressed object (its first bytes are not the format's)")
            pos = len(MAGIC)
            self.magic = True
            self.stored = len(MAGIC)
        while len(buf) - pos >= FRAME.size:
            tag, length, size, digest = FRAME.unpack_from(buf, pos)
            if tag != FRAME_TAG or length > MAX_CHUNK or size > MAX_CHUNK + MAX_CHUNK // 8:
                raise CodecError(f"chunk at byte {self.offset} (stored at byte {self.stored}): not a frame header")
            if len(buf) - pos < FRAME.size + size:
                break
            yield view[pos + FRAME.size:pos + FRAME.size + size], length, digest, self.offset
            pos += FRAME.size + size
            self.offset += length
            self.stored += FRAME.size + size
        self.rest = buf[pos:]

    def close(self) -> None:
        """The end of the object: CodecError if it stopped inside a frame (truncated)."""
        if not self.magic or self.rest:
            raise CodecError(f"truncated after byte {self.stored} (chunk at byte {self.offset})")


def decode_file(src: str, dst: str) -> str:
    """Decode the compressed object saved at `src` into `dst` (no daemon needed: a cold copy fetched with any S3
    tool); the xxh3-128 of what was written, to compare with its `ckptfs-original-xxh3` metadata."""
    reader = FrameReader()
    h = xxhash.xxh3_128()
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while piece := fin.read(CHUNK):
            for body, length, digest, offset in reader.feed(piece):
                chunk = decode_body(body, length, digest, offset)
                h.update(chunk)
                fout.write(chunk)
    reader.close()
    return h.hexdigest()


if __name__ == "__main__":  # python -m ckptfs.lifecycle.codec FILE.ckptfs-z FILE
    import sys

    if len(sys.argv) != 3:
        sys.exit("usage: python -m ckptfs.lifecycle.codec FILE.ckptfs-z OUTPUT  (prints the output's xxh3-128)")
    try:
        print(decode_file(sys.argv[1], sys.argv[2]))
    except (CodecError, OSError) as e:
        sys.exit(f"ckptfs: {sys.argv[1]}: {e}")
