"""The peer secret file's checks (peering.read_secret; issue 43 item 4): made on the descriptor actually read, a
symbolic link followed only when it is the user's or root's, a FIFO refused at once, each refusal one line."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from ckptfs import peering
from ckptfs.peering import PeerOptionError, read_secret

SECRET = os.urandom(24).hex().encode()  # 48 bytes


def key_file(path: Path, data: bytes = SECRET, mode: int = 0o600) -> Path:
    path.write_bytes(data)
    path.chmod(mode)
    return path


def test_a_good_file_and_a_kubernetes_style_link_are_read(tmp_path: Path) -> None:
    assert read_secret(str(key_file(tmp_path / "secret"))) == SECRET
    (tmp_path / "..data").mkdir()
    key_file(tmp_path / "..data" / "peer-secret")
    (tmp_path / "peer-secret").symlink_to("..data/peer-secret")  # what a secret volume mounts
    assert read_secret(str(tmp_path / "peer-secret")) == SECRET


@pytest.mark.parametrize("mode, words", [(0o644, "can be read by others"), (0o640, "can be read by others")])
def test_a_file_others_can_read_is_refused_in_one_line(tmp_path: Path, mode: int, words: str) -> None:
    with pytest.raises(PeerOptionError, match=words) as e:
        read_secret(str(key_file(tmp_path / "secret", mode=mode)))
    assert "\n" not in str(e.value) and "chmod 600" in str(e.value)


def test_short_missing_and_not_regular_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(PeerOptionError, match="holds 5 bytes"):
        read_secret(str(key_file(tmp_path / "short", b"12345")))
    with pytest.raises(PeerOptionError, match="cannot be read"):
        read_secret(str(tmp_path / "absent"))
    with pytest.raises(PeerOptionError, match="not a regular file"):
        read_secret(str(tmp_path))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    done = threading.Event()

    def read_fifo() -> None:
        with pytest.raises(PeerOptionError, match="not a regular file"):
            read_secret(str(fifo))  # opened without blocking for a writer that never comes
        done.set()

    t = threading.Thread(target=read_fifo, daemon=True)
    t.start()
    t.join(30)
    assert done.is_set(), "reading a FIFO as the secret hung"


def test_the_checks_are_of_the_file_read_not_of_the_name_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file swapped in after a check of the name would be read unchecked: the checks are fstat's, so a world-readable
    file is refused even when a stat of the name (made before, as the old code did) saw a good one."""
    good, loose = key_file(tmp_path / "good"), key_file(tmp_path / "loose", mode=0o644)
    real_open = os.open

    def swapping_open(path: str, flags: int, *args: int) -> int:
        return real_open(str(loose) if path == str(good) else path, flags, *args)  # the name now names another file

    monkeypatch.setattr(peering.os, "open", swapping_open)
    with pytest.raises(PeerOptionError, match="can be read by others"):
        read_secret(str(good))


def test_a_link_of_another_user_is_not_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key_file(tmp_path / "target")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    real_lstat = os.lstat

    def other_owner(path: str) -> os.stat_result:
        st = real_lstat(path)
        return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, 4242, st.st_gid, st.st_size, 0, 0, 0))

    monkeypatch.setattr(peering.os, "lstat", other_owner)
    with pytest.raises(PeerOptionError, match="symbolic link owned by uid 4242"):
        read_secret(str(tmp_path / "link"))
