"""Where the tensors are in a checkpoint file, learnt from its bytes as they stream past: the codec for each range.

The mover reads a file once, in order, and compresses it chunk by chunk; `Planner.plan` is told
each chunk in turn and cuts it into segments (length, kind) for codec.encode. The kinds: a float
dtype (`bf16`, `fp16`, `fp32`, `fp64`: the float codec of that width), `zstd`, `raw`, and `try`
(dtype unknown: the codec packs a sample with each candidate and keeps the smallest). It reads:

* **safetensors** (an 8-byte little-endian header length, then a JSON header): every tensor's
  dtype and `data_offsets`; the header and other dtypes are zstd.
* **zip archives**, one or several back to back: `torch.save` writes one (`<name>/data.pkl`, then
  each storage as a stored entry `<name>/data/<key>`, aligned to 64 bytes), a torch DCP shard
  (`.distcp`) one per tensor. Local file headers are found as they pass; an entry written with a
  data descriptor (bit 3, torch's way) ends where a descriptor whose size field matches is found.
  Each archive's `data.pkl` is read without torch and without running anything of it (every global
  it names becomes an inert placeholder): its persistent ids ('storage', torch.<Type>Storage, key,
  location, numel) give each storage's dtype and size (so its data is not scanned for where it
  ends). A storage whose dtype is not learnt so is `try`; everything between entries is zstd.
* anything else: `try` (policy `auto`), so a tensor format this module does not know still gets
  the float codec where it packs smaller.

Under the policy `zstd` every byte is zstd. A wrong guess costs ratio, never data: the codec is
lossless for any bytes. Float ranges shorter than `MIN_FLOAT` are left to zstd with their neighbours.
"""

from __future__ import annotations

import io
import json
import pickle
import pickletools
import re
import struct
from dataclasses import dataclass

from .codec import WIDTH

MIN_FLOAT = 4096
MAX_HEADER = 100 << 20  # safetensors' own limit on its header
MAX_PICKLE = 64 << 20  # a data.pkl larger than this is not read (its storages are tried instead)
SAFETENSORS_DTYPES = {"BF16": "bf16", "F16": "fp16", "F32": "fp32", "F64": "fp64"}
STORAGE_DTYPES = {"BFloat16Storage": "bf16", "HalfStorage": "fp16", "FloatStorage": "fp32", "DoubleStorage": "fp64"}
STORAGE_ITEM = {"BFloat16Storage": 2, "HalfStorage": 2, "FloatStorage": 4, "DoubleStorage": 8, "LongStorage": 8, "IntStorage": 4,
                "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1, "BoolStorage": 1, "UntypedStorage": 1}
LOCAL = b"PK\x03\x04"
DESCRIPTOR = b"PK\x07\x08"
_LOCAL = struct.Struct("<4sHHHHHIIIHH")
TAIL = 30 + 4096 + 65535  # the longest local header (name and extra field at their limits)
_STORAGE_ENTRY = re.compile(r"(.*)/data/([^/]+)$")


@dataclass
class Entry:
    """A zip entry's data: from `start`, to `end` (None: until its data descriptor), packed as `kind`."""

    start: int
    end: int | None
    kind: str
    pickle: bytes | None = None  # a data.pkl being collected
    archive: str = ""


class _Placeholder:
    """What every global in a scanned pickle becomes: callable, fillable, inert (no real class is ever imported)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.name = ""

    def __call__(self, *args: object, **kwargs: object) -> "_Placeholder":
        return _Placeholder()

    def __setitem__(self, key: object, value: object) -> None:
        pass

    def __setstate__(self, state: object) -> None:
        pass

    def append(self, item: object) -> None:
        pass

    def extend(self, items: object) -> None:
        pass


class _StorageScan(pickle.Unpickler):
    """Reads a torch pickle for its storages' types only: globals are placeholders, storages their type's name."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.found: dict[str, tuple[str, int | None]] = {}

    def find_class(self, module: str, name: str) -> object:
        p = _Placeholder()
        p.name = name if module == "torch" else ""
        return p

    def persistent_load(self, pid: object) -> object:
        if isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage" and isinstance(pid[1], _Placeholder):
            name = pid[1].name
            item, numel = STORAGE_ITEM.get(name), pid[4] if len(pid) >= 5 else None
            if name.endswith("Storage"):
                self.found[str(pid[2])] = (STORAGE_DTYPES.get(name, "try"),
                                           item * numel if item is not None and isinstance(numel, int) else None)
        return _Placeholder()


def storage_dtypes(pkl: bytes) -> dict[str, tuple[str, int | None]]:
    """Storage key -> (dtype kind, or "try" for a type without a float codec; its size in bytes, if known), from the
    persistent ids of a torch pickle ('storage', torch.<Type>Storage, key, location, numel).

    The pickle is read by the C unpickler with every global replaced by an inert placeholder (no class is
    imported, nothing of the file's runs); one it cannot read so is walked opcode by opcode instead (dtypes only)."""
    scan = _StorageScan(pkl)
    try:
        scan.load()
        return scan.found
    except Exception:  # noqa: BLE001 - a pickle built another way: the slow walk, which needs no objects
        return {**{k: (kind, None) for k, kind in _storage_dtypes_by_opcode(pkl).items()}, **scan.found}


def _storage_dtypes_by_opcode(pkl: bytes) -> dict[str, str]:
    memo: dict[int, object] = {}
    recent: list[object] = []
    found: dict[str, str] = {}
    try:
        for op, arg, _ in pickletools.genops(pkl):
            name = op.name
            if name in ("BINPUT", "LONG_BINPUT", "PUT"):
                memo[int(arg)] = recent[-1] if recent else None  # type: ignore[arg-type]
                continue
            if name == "MEMOIZE":
                memo[len(memo)] = recent[-1] if recent else None
                continue
            if name == "MARK":
                continue
            if name == "GLOBAL":
                value: object = ("global", str(arg))
            elif name in ("BINGET", "LONG_BINGET", "GET"):
                value = memo.get(int(arg))  # type: ignore[arg-type]
            elif isinstance(arg, str) and ("UNICODE" in name or "STRING" in name):
                value = arg
            else:
                value = None
            recent = recent[-2:] + [value]
            if len(recent) == 3 and recent[0] == "storage" and isinstance(recent[1], tuple) and isinstance(recent[2], str):
                kind = STORAGE_DTYPES.get(recent[1][1].rsplit(" ", 1)[-1])
                if kind is not None:
                    found[recent[2]] = kind
    except Exception:  # noqa: BLE001 - a damaged or foreign pickle: what was learnt so far
        pass
    return found


class Planner:
    """Cuts a file fed in order, chunk by chunk, into (length, kind) segments."""

    def __init__(self, policy: str = "auto") -> None:
        self.policy = policy
        self.format: str | None = None  # safetensors | zip | other, known at the first chunk
        self.regions: list[tuple[int, int, str]] = []  # safetensors: (start, end, kind), sorted
        self.header = bytearray()  # safetensors: the header while it is incomplete
        self.entry: Entry | None = None  # zip: the entry whose data is streaming past
        self.tail = b""  # zip: the last bytes of the chunk before (the longest local header)
        self.scan_from = 0  # zip: where a local header may begin that was not whole in the chunk before
        self.dtypes: dict[str, dict[str, tuple[str, int | None]]] = {}  # zip: archive -> storage key -> (kind, size)
        self.out: list[tuple[int, str]] = []

    # --------------------------------------------------------------- output
    def _emit(self, length: int, kind: str) -> None:
        if length <= 0:
            return
        if self.out and self.out[-1][1] == kind:
            self.out[-1] = (self.out[-1][0] + length, kind)
        else:
            self.out.append((length, kind))

    def _emit_values(self, p: int, stop: int, kind: str, origin: int) -> None:
        """[p, stop) of a float range that began at `origin`: a value cut by the chunk's start is left to zstd. (A short
        range joins the same kind's next to it, small biases between weights; what stays short goes to zstd: _done.)"""
        width = WIDTH.get(kind)
        if width is None:
            self._emit(stop - p, kind)
            return
        lead = (origin - p) % width
        self._emit(lead, "zstd")
        self._emit(stop - p - lead, kind)

    def _done(self) -> list[tuple[int, str]]:
        out = [(n, "zstd" if k in WIDTH and n < MIN_FLOAT else k) for n, k in self.out]
        self.out = []
        merged: list[tuple[int, str]] = []
        for n, k in out:
            if merged and merged[-1][1] == k:
                merged[-1] = (merged[-1][0] + n, k)
            else:
                merged.append((n, k))
        return merged

    # ----------------------------------------------------------------- plan
    def plan(self, offset: int, data: bytes | memoryview) -> list[tuple[int, str]]:
        """Segments (length, kind) covering `data`, the file's bytes at `offset` (chunks are fed in order, from 0)."""
        raw = data if isinstance(data, bytes) else bytes(data)
        data = memoryview(raw)
        if self.policy != "auto":
            return [(len(data), "zstd")] if len(data) else []
        if self.format is None:
            self.format = _sniff(data)
        if self.format == "safetensors":
            self._safetensors(offset, data)
        elif self.format == "zip":
            self._zip(offset, raw)
        else:
            self._emit(len(data), "try")
        return self._done()

    # ----------------------------------------------------------- safetensors
    def _safetensors(self, offset: int, data: memoryview) -> None:
        if not self.regions and self.header is not None:
            self.header += data[:max(0, MAX_HEADER + 8 - offset)]
            n = struct.unpack_from("<Q", self.header)[0]
            if len(self.header) >= 8 + n:
                self.regions = _tensor_regions(bytes(self.header[8:8 + n]), 8 + n)
                self.header = None  # type: ignore[assignment]
            elif len(self.header) >= MAX_HEADER + 8:
                self.header = None  # type: ignore[assignment]
        p, end = offset, offset + len(data)
        for start, stop, kind in self.regions:
            if stop <= p or start >= end:
                continue
            self._emit(start - p, "zstd")
            p = max(p, start)
            self._emit_values(p, min(stop, end), kind, start)
            p = min(stop, end)
        self._emit(end - p, "zstd")

    # ------------------------------------------------------------------- zip
    def _zip(self, offset: int, raw: bytes) -> None:
        # the seam: the end of the chunk before and the start of this one, where a local header or data descriptor cut by
        # the boundary is whole (searched apart, so the chunk itself is never copied)
        seam, seam_at = self.tail + raw[:TAIL], offset - len(self.tail)
        self.tail = raw[-TAIL:]
        end = offset + len(raw)
        p = offset
        while p < end:
            e = self.entry
            if e is not None:
                if p < e.start:  # the rest of its local header
                    stop = min(e.start, end)
                    self._emit(stop - p, "zstd")
                    p = stop
                    continue
                if e.end is None and p == offset:
                    e.end = _descriptor(seam, seam_at, max(offset - 16, e.start), e.start, before=offset)
                if e.end is None:
                    e.end = _descriptor(raw, offset, max(p, e.start), e.start)
                stop = end if e.end is None else max(p, min(e.end, end))
                if e.pickle is not None:
                    e.pickle = e.pickle + raw[p - offset:stop - offset] if len(e.pickle) + stop - p <= MAX_PICKLE else None
                self._emit_values(p, stop, e.kind, e.start)
                p = stop
                if e.end is not None and p >= e.end:
                    if e.pickle is not None:
                        self.dtypes[e.archive] = storage_dtypes(e.pickle)
                    self.entry = None
                continue
            # between entries: the next local header; one cut by the last chunk's end is looked for in the seam
            found = None
            if self.scan_from < offset:
                found = _next_header(seam, seam_at, self.scan_from, before=offset)
            if found is None:
                found = _next_header(raw, offset, p)
            if found is None or found[1] is None:
                self.scan_from = found[0] if found is not None else end  # a header cut by the end: looked for again
                self._emit(end - p, "zstd")
                p = end
                continue
            q, (name, start, size) = found  # type: ignore[misc]
            self.scan_from = end
            self._emit(q - p, "zstd")
            p = max(p, q)
            self.entry = self._entry(name, start, size)

    def _entry(self, name: str, start: int, size: int | None) -> Entry:
        end = start + size if size is not None else None
        if name.endswith("data.pkl"):
            return Entry(start, end, "zstd", b"", name[: -len("data.pkl")].rstrip("/"))
        m = _STORAGE_ENTRY.match(name)
        if m is not None:
            kind, nbytes = self.dtypes.get(m.group(1), {}).get(m.group(2), ("try", None))
            if end is None and nbytes is not None:
                end = start + nbytes  # its size from the pickle: no scanning the data for where it ends
            return Entry(start, end, kind)
        return Entry(start, end, "zstd")


def _sniff(data: memoryview) -> str:
    if bytes(data[:4]) == LOCAL:
        return "zip"
    if len(data) >= 9:
        n = struct.unpack_from("<Q", data)[0]
        if 2 <= n <= MAX_HEADER and data[8] == ord("{"):
            return "safetensors"
    return "other"


def _tensor_regions(header: bytes, base: int) -> list[tuple[int, int, str]]:
    """(start, end, kind) of every tensor a safetensors header lists (its data begins at `base`); [] if unreadable."""
    try:
        doc = json.loads(header)
        out = []
        for name, t in doc.items():
            if name == "__metadata__" or not isinstance(t, dict):
                continue
            b, e = (int(x) for x in t["data_offsets"])
            out.append((base + b, base + e, SAFETENSORS_DTYPES.get(str(t.get("dtype")), "zstd")))
        out.sort()
        return out
    except (ValueError, KeyError, TypeError):
        return []


def _local_header(buf: bytes, q: int) -> tuple[str, int, int | None] | str | None:
    """(name, data start, data size or None) of a plausible local file header at buf[q]; "short" if cut off; None if not one."""
    if len(buf) - q < _LOCAL.size:
        return "short"
    _, version, flags, method, _, _, _, csize, _, nlen, xlen = _LOCAL.unpack_from(buf, q)
    if nlen == 0 or nlen > 4096 or version > 63:
        return None
    if len(buf) - q < _LOCAL.size + nlen + xlen:
        return "short"
    try:
        name = buf[q + _LOCAL.size:q + _LOCAL.size + nlen].decode()
    except UnicodeDecodeError:
        return None
    start = q + _LOCAL.size + nlen + xlen
    if flags & 8 or csize == 0xFFFFFFFF:
        return name, start, None  # sizes in the data descriptor after the data (or in a zip64 extra field)
    if method != 0:
        name += "?compressed"  # a deflated entry: zstd over it all the same
    return name, start, csize


def _next_header(buf: bytes, at: int, frm: int, before: int | None = None) -> tuple[int, tuple[str, int, int | None] | None] | None:
    """The first plausible local file header in buf (at file offset `at`) from file offset `frm` (and, with `before`,
    starting before it): (its file offset, (name, data start, data size or None)), (its offset, None) if it is cut
    off by the end of buf, or None if there is none."""
    q = buf.find(LOCAL, max(0, frm - at))
    while q >= 0 and (before is None or at + q < before):
        header = _local_header(buf, q)
        if header == "short":
            return (at + q, None) if before is None else None
        if header is not None:
            name, start, size = header  # type: ignore[misc]
            return at + q, (name, at + start, size)
        q = buf.find(LOCAL, q + 1)
    return None


def _descriptor(buf: bytes, at: int, frm: int, start: int, before: int | None = None) -> int | None:
    """The file offset of the data descriptor of the entry whose data began at `start`, looking in buf (at file
    offset `at`) from `frm` (and, with `before`, starting before it); None if not in it. A descriptor counts only if
    its size field is the data's size."""
    i = buf.find(DESCRIPTOR, max(0, frm - at))
    while i >= 0 and len(buf) - i >= 12 and (before is None or at + i < before):
        size = at + i - start
        (csize32,) = struct.unpack_from("<I", buf, i + 8)
        csize64 = struct.unpack_from("<Q", buf, i + 8)[0] if len(buf) - i >= 16 else None
        if size >= 0 and (csize32 == size & 0xFFFFFFFF or csize64 == size):
            return at + i
        i = buf.find(DESCRIPTOR, i + 1)
    return None
