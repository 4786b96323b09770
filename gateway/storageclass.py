"""Storage classes that need a restore before a read: what S3 tells and how ckptfs reads it. Pure functions.

* GLACIER (Flexible Retrieval) and DEEP_ARCHIVE: a GET answers 403 InvalidObjectState until the
  object is restored (RestoreObject); a listing shows the class (ListObjectsV2 `StorageClass`).
* INTELLIGENT_TIERING: only its opt-in archive tiers need a restore, and only HeadObject tells
  (`x-amz-archive-status: ARCHIVE_ACCESS | DEEP_ARCHIVE_ACCESS`): the listing says "maybe".
* GLACIER_IR and the other classes read at once.
* HeadObject's `x-amz-restore` says how a restore goes: `ongoing-request="true"` (in progress) or
  `ongoing-request="false", expiry-date="..."` (restored: readable until the expiry date; an
  intelligent-tiering object restored to its frequent tier has no expiry).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ARCHIVE_CLASSES = ("GLACIER", "DEEP_ARCHIVE")  # need a restore before a GET (GLACIER_IR does not)
MAYBE_ARCHIVED_CLASSES = ("INTELLIGENT_TIERING",)  # its archive tiers need one: only HeadObject tells
ARCHIVE_TIERS = ("ARCHIVE_ACCESS", "DEEP_ARCHIVE_ACCESS")  # x-amz-archive-status of intelligent tiering

# restore states ("" = never asked for, or the object needs none)
ONGOING = "ongoing"
RESTORED = "restored"


def may_need_restore(storage_class: str | None) -> bool:
    """True if an object a listing shows in this class may need a restore before it can be read."""
    return (storage_class or "STANDARD") in ARCHIVE_CLASSES + MAYBE_ARCHIVED_CLASSES


def parse_restore(header: str | None) -> tuple[str, str]:
    """(restore state, expiry date) from an `x-amz-restore` value: ("", "") without one."""
    if not header:
        return "", ""
    ongoing = re.search(r'ongoing-request\s*=\s*"?(true|false)"?', header, re.IGNORECASE)
    expiry = re.search(r'expiry-date\s*=\s*"([^"]*)"', header, re.IGNORECASE)
    if ongoing is None:
        return "", ""
    return (ONGOING if ongoing.group(1).lower() == "true" else RESTORED), (expiry.group(1) if expiry else "")


@dataclass(frozen=True)
class ArchiveState:
    """An object's class and restore state, as HeadObject shows them."""

    storage_class: str = "STANDARD"
    archive_status: str = ""  # intelligent tiering's archive tier, if any
    restore: str = ""  # "" | ONGOING | RESTORED
    expiry: str = ""
    refused: bool = False  # a GET was refused with InvalidObjectState (whatever the class said)

    @property
    def archived(self) -> bool:
        """In a class or tier whose objects need a restore (restored or not)."""
        return self.storage_class in ARCHIVE_CLASSES or self.archive_status in ARCHIVE_TIERS or self.refused

    @property
    def needs_restore(self) -> bool:
        """A GET would fail now (InvalidObjectState): archived and not (yet) restored."""
        return self.archived and self.restore != RESTORED

    @property
    def where(self) -> str:
        """What to name in a message: GLACIER, DEEP_ARCHIVE, or intelligent tiering's archive tier."""
        if self.archive_status in ARCHIVE_TIERS:
            return f"INTELLIGENT_TIERING {self.archive_status}"
        if self.storage_class not in ARCHIVE_CLASSES and self.refused:
            return f"an archive tier (the store refuses reads with InvalidObjectState; its class says {self.storage_class})"
        return self.storage_class

    @property
    def label(self) -> str:
        """`user.ckptfs.state` of a file in the bucket only: archived, restoring, or "" (readable)."""
        if not self.needs_restore:
            return ""
        return "restoring" if self.restore == ONGOING else "archived"


def from_head(response: dict[str, object]) -> ArchiveState:
    """The ArchiveState of a boto3 head_object answer."""
    restore, expiry = parse_restore(str(response.get("Restore") or ""))
    return ArchiveState(str(response.get("StorageClass") or "STANDARD"), str(response.get("ArchiveStatus") or ""), restore, expiry)


# ------------------------------------------------ tier settings (config.py checks them)
STORAGE_CLASSES = ("STANDARD", "REDUCED_REDUNDANCY", "STANDARD_IA", "ONEZONE_IA", "INTELLIGENT_TIERING", "GLACIER_IR",
                   "GLACIER", "DEEP_ARCHIVE", "EXPRESS_ONEZONE")
# AWS's minimum object age for a transition into these classes (other stores may accept less)
AWS_MIN_DAYS = {"STANDARD_IA": 30, "ONEZONE_IA": 30}


class TierError(ValueError):
    """A tier or price setting cannot be used; one line naming it and the fix."""


# -------------------------------------------------------------------- settings
def parse_transitions(entries: list[str]) -> list[tuple[int, str]]:
    """`["30:STANDARD_IA", "90:GLACIER_IR"]` -> [(30, "STANDARD_IA"), (90, "GLACIER_IR")], days strictly ascending."""
    out: list[tuple[int, str]] = []
    for e in entries:
        m = re.fullmatch(r"\s*(\d+)\s*[:=]\s*([A-Z_]+)\s*", e)
        if not m:
            raise TierError(f"tier_transitions entry {e!r} is not DAYS:CLASS (for example 30:STANDARD_IA)")
        days, cls = int(m.group(1)), m.group(2)
        if cls not in STORAGE_CLASSES or cls == "STANDARD":
            raise TierError(f"tier_transitions entry {e!r}: {cls} is not a storage class to move to; use one of "
                            f"{', '.join(c for c in STORAGE_CLASSES if c != 'STANDARD')}")
        if out and days <= out[-1][0]:
            raise TierError(f"tier_transitions entry {e!r}: days must grow from one entry to the next ({out[-1][0]} before it)")
        out.append((days, cls))
    return out


def parse_prices(entries: list[str]) -> dict[str, float]:
    """`["STANDARD:0.023", ...]` -> {"STANDARD": 0.023, ...} (per GiB-month)."""
    out: dict[str, float] = {}
    for e in entries:
        cls, sep, price = e.rpartition(":")  # the class may hold ':' itself (moved:NAME, coldmove.py)
        try:
            value = float(price)
        except ValueError:
            value = -1.0
        if not sep or not cls.strip() or value < 0:
            raise TierError(f"storage_prices entry {e!r} is not CLASS:PRICE (for example STANDARD:0.023)")
        out[cls.strip()] = value
    return out


CURRENCY = "$"  # storage_prices are read as US dollars per GiB-month (the defaults are AWS list prices)


def fmt_money(amount: float | None) -> str:
    """An estimate from `storage_prices`, with its currency: `$1,234.56`, `$0.0081` (below a cent, four places, so
    a small checkpoint's cost is not 0.00), `$0`. The one way `ckptfs usage` and the page show money."""
    if not amount:
        return f"{CURRENCY}0"
    return f"{CURRENCY}{amount:,.2f}" if abs(amount) >= 0.01 else f"{CURRENCY}{amount:.4f}"


def class_label(by_class: dict[str, int]) -> str:
    """The storage class of a checkpoint: its one class, or the classes it spans (most bytes first)."""
    if not by_class:
        return "-"
    return "+".join(c for c, _ in sorted(by_class.items(), key=lambda kv: (-kv[1], kv[0])))
