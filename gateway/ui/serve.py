"""Serving the catalogue page: where it may listen, and with which token (httpserver.py serves it).

Loopback by default. A non-loopback address serves the catalogue to the network, so it needs a
token (`--token-file`, `ui_token_file`): without one the page refuses to start, in one line.
The token file must be the user's own and unreadable by others, like the SSE-C key file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..peering import is_loopback


class UiError(Exception):
    """The page cannot be served as asked: one line naming the problem and the fix."""


def require_extra() -> None:
    """The page's templates need jinja2, the 'ui' extra (pyproject.toml): one line if it is not installed."""
    try:
        import jinja2  # noqa: F401
    except ImportError:
        raise UiError("the catalogue page needs the 'ui' extra (jinja2): pip install 'ckptfs[ui]'") from None


def parse_addr(value: str) -> tuple[str, int]:
    """`HOST:PORT` (an IPv6 host in brackets) -> (host, port)."""
    host, sep, port = value.strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UiError(f"--addr {value!r} is not HOST:PORT (for example 127.0.0.1:8464)")
    return host.strip("[]") or "127.0.0.1", int(port)


def read_token(path: str) -> str:
    """The token in `path`: the file's first line; the file must not be readable by group or others."""
    p = Path(path)
    try:
        st = p.stat()
        text = p.read_text().strip()
    except OSError as e:
        raise UiError(f"token file {path}: {e.strerror}: give a readable file holding the token") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UiError(f"token file {path} is readable by others (mode {stat.S_IMODE(st.st_mode):o}): chmod 600 {path}")
    if st.st_uid != os.getuid() and os.getuid() != 0:
        raise UiError(f"token file {path} belongs to another user: use a file of your own")
    token = text.splitlines()[0].strip() if text else ""
    if len(token) < 16:
        raise UiError(f"token file {path}: the token must be at least 16 characters (e.g. `openssl rand -hex 16 > {path}`)")
    return token


def check_bind(host: str, token: str | None, what: str = "--addr") -> None:
    """Refuse to serve the catalogue beyond this machine without a token."""
    if token is None and not is_loopback(host):
        raise UiError(f"{what} {host} is not a loopback address: the catalogue page would be open to the network; "
                      "give a token file (--token-file FILE, ui_token_file) or listen on 127.0.0.1")
