"""The cold tier's codec (lifecycle/codec.py, floats.py, layout.py): every path gives back the exact bytes.

Float data here is made with numpy from normal distributions (trained weights are tested end to end in
tests/integration/test_coldcompress.py); what is asserted is losslessness on every path, the edges
(odd lengths, values and tensors cut by chunk boundaries, empty, incompressible), that damage is found,
and that the layout finds the tensors where they are.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import zipfile

import numpy as np
import pytest

from ckptfs.lifecycle import codec, floats, layout

RNG = np.random.default_rng(7)


def weights(n: int, dtype: str) -> bytes:
    x = RNG.standard_normal(n).astype(np.float32) * 0.02
    if dtype == "bf16":
        return (x.view(np.uint32) >> 16).astype("<u2").tobytes()
    return x.astype({"fp16": "<f2", "fp32": "<f4", "fp64": "<f8"}[dtype]).tobytes()


def roundtrip(data: bytes, segments: list[tuple[int, str]]) -> bytes:
    pieces, used = codec.encode(data, segments)
    frame = b"".join(pieces)
    assert sum(used.values()) == len(data)
    tag, length, size, digest = codec.FRAME.unpack_from(frame)
    assert (tag, length, size) == (codec.FRAME_TAG, len(data), len(frame) - codec.FRAME.size)
    out = codec.decode_body(frame[codec.FRAME.size:], length, digest, 0)
    assert out.tobytes() == data
    return frame


def stored(data: bytes, policy: str = "auto", chunk: int = codec.CHUNK) -> bytes:
    """A whole file as the mover stores it (planned chunk by chunk), checked to decode back."""
    planner = layout.Planner(policy)
    parts = [codec.MAGIC]
    for at in range(0, len(data), chunk):
        piece = data[at:at + chunk]
        parts += codec.encode(piece, planner.plan(at, piece))[0]
    blob = b"".join(parts)
    reader = codec.FrameReader()
    back = []
    for i in range(0, len(blob), 1000003):  # fed in pieces that cut frames anywhere
        back += [codec.decode_body(body, n, d, off).tobytes() for body, n, d, off in reader.feed(blob[i:i + 1000003])]
    reader.close()
    assert b"".join(back) == data
    return blob


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32", "fp64"])
def test_every_float_width_round_trips_and_packs(dtype: str) -> None:
    data = weights(300_000, dtype)
    frame = roundtrip(data, [(len(data), dtype)])
    assert len(frame) < {"bf16": 0.75, "fp16": 0.9, "fp32": 0.9, "fp64": 0.95}[dtype] * len(data)


def test_split_and_join_are_inverse_for_any_bytes() -> None:
    data = os.urandom(8 * 1000)
    for width in (2, 4, 8):
        planes = floats.split(data, width)
        assert planes.shape == (width, len(data) // width)
        out = np.empty(len(data), np.uint8)
        floats.join(list(planes), width, out)
        assert out.tobytes() == data
    bf16 = np.array([0x3F80, 0xBF80, 0x0001, 0x8000], "<u2").tobytes()  # 1.0, -1.0, a subnormal, -0.0
    exponent, rest = floats.split(bf16, 2)
    assert list(exponent) == [0x7F, 0x7F, 0x00, 0x00]  # the exponent alone in its plane, the sign in the other
    assert list(rest) == [0x00, 0x01, 0x02, 0x01]


@pytest.mark.parametrize("kind", ["zstd", "raw", "try", "bf16", "fp32", "fp64"])
@pytest.mark.parametrize("length", [0, 1, 3, 7, 63, 64, 4097, 65537])
def test_odd_lengths_on_every_path(kind: str, length: int) -> None:
    data = weights(length, "fp32")[:length] + bytes(max(0, length - len(weights(length, "fp32"))))
    roundtrip(data, [(length, kind)] if length else [])


def test_segments_of_several_kinds_in_one_chunk() -> None:
    parts = [b'{"a": 1}' * 100, weights(5000, "bf16"), b"\x00" * 999, weights(3001, "fp32")[1:], os.urandom(5000)]
    data = b"".join(parts)
    kinds = ["zstd", "bf16", "raw", "fp32", "try"]
    roundtrip(data, [(len(p), k) for p, k in zip(parts, kinds)])
    with pytest.raises(ValueError):
        codec.encode(data, [(len(data) - 1, "zstd")])


def test_incompressible_bytes_are_stored_as_they_are() -> None:
    data = os.urandom(1 << 20)
    frame = roundtrip(data, [(len(data), "try")])
    assert len(frame) <= len(data) + codec.FRAME.size + 5
    assert codec.encode(data, [(len(data), "bf16")])[1] == {"raw": len(data)}


def test_an_empty_file_is_the_magic_alone() -> None:
    assert stored(b"") == codec.MAGIC
    reader = codec.FrameReader()
    assert list(reader.feed(codec.MAGIC)) == []
    reader.close()
    with pytest.raises(codec.CodecError):
        codec.FrameReader().close()


def test_damage_is_found_and_named() -> None:
    data = weights(200_000, "bf16")
    frame = b"".join(codec.encode(data, [(len(data), "bf16")])[0])
    _, length, _, digest = codec.FRAME.unpack_from(frame)
    body = bytearray(frame[codec.FRAME.size:])
    for at in (10, len(body) // 4, len(body) - 10):  # in the exponent's zstd stream, in the raw plane
        bad = bytearray(body)
        bad[at] ^= 0x40
        with pytest.raises(codec.CodecError, match="chunk at byte 4096"):
            codec.decode_body(bytes(bad), length, digest, 4096)
    with pytest.raises(codec.CodecError):
        codec.decode_body(bytes(body[:-1]), length, digest, 0)
    with pytest.raises(codec.CodecError):
        list(codec.FrameReader().feed(b"PK\x03\x04 not ours"))
    reader = codec.FrameReader()
    list(reader.feed(codec.MAGIC + frame[:-1]))
    with pytest.raises(codec.CodecError, match="truncated"):
        reader.close()
    reader = codec.FrameReader()
    with pytest.raises(codec.CodecError, match="not a frame header"):
        list(reader.feed(codec.MAGIC + b"XXXX" + frame[4:]))


def safetensors(tensors: dict[str, tuple[str, bytes]], pad: int = 0) -> bytes:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    at = 0
    for name, (dtype, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": [len(data)], "data_offsets": [at, at + len(data)]}
        at += len(data)
    text = json.dumps(header).encode() + b" " * pad
    return struct.pack("<Q", len(text)) + text + b"".join(d for _, d in tensors.values())


def kinds_of(data: bytes, chunk: int) -> list[str]:
    """The kind the planner gives each byte when the file is fed in pieces of `chunk` bytes."""
    planner = layout.Planner()
    out: list[str] = []
    for at in range(0, len(data), chunk):
        for n, kind in planner.plan(at, data[at:at + chunk]):
            out += [kind] * n
    assert len(out) == len(data)
    return out


@pytest.mark.parametrize("pad", [0, 1, 3])  # a header of odd length: the values are not aligned to the chunks
def test_safetensors_tensors_found_across_chunk_boundaries(pad: int) -> None:
    big = weights(700_000, "bf16")  # crosses a chunk boundary (chunks of 1 MiB here)
    data = safetensors({"a": ("BF16", big), "b": ("F32", weights(100_000, "fp32")), "ids": ("I64", bytes(8000)),
                        "small": ("F16", weights(100, "fp16"))}, pad)
    start = 8 + struct.unpack_from("<Q", data)[0]
    kinds = kinds_of(data, 1 << 20)
    assert kinds[start:start + len(big)].count("bf16") >= len(big) - 2  # all but a value the chunk boundary cuts
    assert kinds[start + len(big) + 4] == "fp32" and kinds[:start] == ["zstd"] * start
    assert kinds[-50] == "zstd"  # a float tensor too small for the float codec
    # every float segment starts on a value: one cut by the chunk boundary before it is left to zstd
    planner = layout.Planner()
    for at in range(0, len(data), 1 << 20):
        pos = at
        for n, kind in planner.plan(at, data[at:at + (1 << 20)]):
            if kind == "bf16":
                assert (pos - start) % 2 == 0  # (one cut at the end is stored as it is by the codec)
            pos += n
    blob = stored(data, chunk=1 << 20)
    assert len(blob) < 0.8 * len(data)
    assert len(stored(data, "zstd")) > len(blob)


def test_a_header_longer_than_a_chunk() -> None:
    tensors = {f"layer{i}.weight": ("BF16", weights(64, "bf16")) for i in range(3000)}
    tensors["big"] = ("BF16", weights(200_000, "bf16"))
    data = safetensors(tensors)
    assert 8 + struct.unpack_from("<Q", data)[0] > 65536
    kinds = kinds_of(data, 65536)
    assert kinds[-1000] == "bf16"
    stored(data, chunk=65536)


def test_other_files_are_tried() -> None:
    raw = weights(400_000, "fp32")
    assert set(kinds_of(raw, 1 << 20)) == {"try"}
    assert len(stored(raw)) < 0.9 * len(raw)
    text = json.dumps({"step": 1, "lr": [0.1] * 10000}).encode()
    assert len(stored(text)) < 0.2 * len(text)


class _Unseekable(io.RawIOBase):
    """zipfile writes data descriptors (bit 3), as torch does, when it cannot seek back."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b: bytes) -> int:  # type: ignore[override]
        self.buf += b
        return len(b)


def torch_like(storages: dict[str, tuple[str, bytes]]) -> bytes:
    """An archive laid out as torch.save writes one (data.pkl first, naming each storage's torch.<Type>Storage in its
    persistent id; then archive/data/<key>, stored, with data descriptors), without importing torch."""

    class StorageType:
        def __init__(self, name: str) -> None:
            self.name = name

    class Pickler(pickle._Pickler):  # the Python pickler, to write the GLOBAL torch's would
        def persistent_id(self, obj: object) -> object:
            if isinstance(obj, tuple) and obj and obj[0] == "S":
                return ("storage", StorageType(obj[1]), obj[2], "cpu", len(storages[obj[2]][1]) // layout.STORAGE_ITEM[obj[1]])
            return None

        def save(self, obj: object, save_persistent_id: bool = True) -> None:
            if isinstance(obj, StorageType):
                self.write(pickle.GLOBAL + f"torch\n{obj.name}\n".encode())
                self.memoize(obj)
                return
            super().save(obj, save_persistent_id)

    pkl = io.BytesIO()
    Pickler(pkl, protocol=2).dump({key: ("S", kind, key) for key, (kind, _) in storages.items()})
    out = _Unseekable()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl.getvalue())
        z.writestr("archive/byteorder", "little")
        for key, (_, data) in storages.items():
            z.writestr(f"archive/data/{key}", data)
    return bytes(out.buf)


def test_torch_archives_storages_get_their_dtypes() -> None:
    storages = {"0": ("FloatStorage", weights(12000, "fp32")), "1": ("BFloat16Storage", weights(10000, "bf16")),
                "2": ("DoubleStorage", weights(2500, "fp64")), "3": ("LongStorage", np.arange(2000, dtype="<i8").tobytes()),
                "4": ("FloatStorage", weights(1, "fp32"))}
    one = torch_like(storages)
    assert zipfile.ZipFile(io.BytesIO(one)).infolist()[0].flag_bits & 8  # sizes after the data, as torch writes them
    data = one + b"raw bytes between archives" + one  # archives back to back, as a DCP shard holds them
    sizes = {k: len(v) for k, (_, v) in storages.items()}
    whole = kinds_of(data, 1 << 20)
    counts = {k: whole.count(k) for k in set(whole)}
    for key, kind in (("0", "fp32"), ("1", "bf16"), ("2", "fp64")):  # learnt from each archive's data.pkl
        assert counts[kind] == 2 * sizes[key], counts
    assert counts["try"] == 2 * sizes["3"]  # int64: not a float dtype, so tried
    for chunk in (65543, 4099, 97):  # headers and data descriptors cut by chunk boundaries: the same entries found
        kinds = kinds_of(data, chunk)
        assert abs(kinds.count("try") - counts["try"]) <= 15, chunk
        for i, (k, w) in enumerate(zip(kinds, whole)):
            # where they differ: a float's bytes near a chunk boundary left to zstd by one of them, or a data descriptor
            # cut by the chunk's end, seen (in the next chunk) after its first bytes went with the entry's data
            assert k == w or {k, w} - set(codec.WIDTH) == {"zstd"} or i % chunk >= chunk - 15, (chunk, i, k, w)
    blob = stored(data, chunk=65536)
    assert len(blob) < 0.9 * len(data)
    assert layout.storage_dtypes(b"not a pickle") == {}
    pkl = zipfile.ZipFile(io.BytesIO(one)).read("archive/data.pkl")
    assert layout.storage_dtypes(pkl) == {"0": ("fp32", 48000), "1": ("bf16", 20000), "2": ("fp64", 20000), "3": ("try", 16000),
                                          "4": ("fp32", 4)}


def test_an_object_decodes_without_the_daemon(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    import xxhash

    data = weights(3 * (1 << 20) // 2 + 5, "bf16")
    src = tmp_path / "model.safetensors.ckptfs-z"
    src.write_bytes(stored(data, chunk=1 << 20))
    proc = subprocess.run([sys.executable, "-m", "ckptfs.lifecycle.codec", str(src), str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out").read_bytes() == data and proc.stdout.strip() == xxhash.xxh3_128_hexdigest(data)
    src.write_bytes(src.read_bytes()[:-3])
    proc = subprocess.run([sys.executable, "-m", "ckptfs.lifecycle.codec", str(src), str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode == 1 and "truncated" in proc.stderr and "\n" not in proc.stderr.strip()
