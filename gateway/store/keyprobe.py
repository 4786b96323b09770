"""Which characters a store does not keep in keys as written, learnt once at mount.

SeaweedFS, for one, stores '\\' as '/': a file named with it would become a directory in the bucket,
so the namespace refuses such names (EINVAL) instead. Apart from the client because it is a small
protocol of its own over three calls (put an empty object, list, delete), given as functions so it
needs nothing of the client's internals.
"""

from __future__ import annotations

from typing import Callable

from ..objects import AUTH, NETWORK, NO_BUCKET, SERVER, StoreError

# the characters tried
PROBE_CHARS = "\\\t\r\n\x01\x1f\x7f:*?\"<>|%+~#&{}[]^` \u00e9\u00a0"


def probe_key_chars(base: str, put_empty: Callable[[str], None], list_names: Callable[[str], list[str]],
                    delete: Callable[[str], None]) -> dict[str, str]:
    """{char: what the store kept instead} for the characters of PROBE_CHARS the store changes.

    Puts one empty object whose name holds every candidate character under the reserved `base`
    ('.ckptfs-probe-<random>/'), lists it back and deletes it (and what the store kept of its
    directories). Only if that listing cannot be matched up character by character (a character
    dropped, the put refused) is each character tried on its own.
    """
    changed: dict[str, str] = {}
    whole = _probe(base, PROBE_CHARS, put_empty, list_names, delete)
    if whole is not None and len(whole) == len(PROBE_CHARS):
        return {c: k for c, k in zip(PROBE_CHARS, whole) if c != k}
    for c in PROBE_CHARS:
        got = _probe(base, c, put_empty, list_names, delete)
        if got != c:
            changed[c] = got if got else "(refused)"
    return changed


def _probe(base: str, chars: str, put_empty: Callable[[str], None], list_names: Callable[[str], list[str]],
           delete: Callable[[str], None]) -> str | None:
    """Put `base + 'a' + chars + 'z'`; the chars part of the key the store lists back (None: put refused)."""
    key = base + "a" + chars + "z"
    stored: list[str] = []
    try:
        try:
            put_empty(key)
        except StoreError as e:
            if e.kind in (NETWORK, SERVER, AUTH, NO_BUCKET):
                raise
            return None
        stored = list_names(base)
    finally:
        dirs = {base}
        for name in stored:
            parts = name.split("/")[:-1]
            dirs.update(base + "/".join(parts[:i]) + "/" for i in range(1, len(parts) + 1))
        for k in [key, *(base + n for n in stored), *sorted(dirs, key=len, reverse=True)]:
            try:
                delete(k)
            except StoreError:
                pass
    if len(stored) != 1 or not stored[0].startswith("a") or not stored[0].endswith("z"):
        return ""
    return stored[0][1:-1]
