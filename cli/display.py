"""What the `ckptfs` command prints: the status screen and flush progress.

Plain text when stdout is not a terminal (logs, pipes, scripts); colour and a
live progress bar on a terminal, unless NO_COLOR is set (rich honours it).
"""

from __future__ import annotations

import collections
import math
import time
from typing import Any, Callable, TextIO

from rich.console import Console, Group
from rich.text import Text

from ckptfs.config import fmt_bytes

LAST_ERROR_SHOWN_FOR = 3600.0  # seconds: an older last error is left out of the screen (the count stays)
LABEL_WIDTH = 9


def plural(n: float, word: str, words: str | None = None) -> str:
    """`1 file`, `2 files`, `0 files`."""
    return f"{n:g} {word if n == 1 else (words or word + 's')}"


def fmt_duration(seconds: float) -> str:
    """A short human duration: 0s, 42s, 3m 05s, 2h 03m, 1d 4h."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def fmt_rate(bytes_per_second: float) -> str:
    return f"{fmt_bytes(bytes_per_second)}/s"


def fmt_age(seconds: float | None) -> str:
    """An age in a table column: 42s, 3m 5s, 2h 3m, 1d 4h; `-` for none."""
    if seconds is None:
        return "-"
    s = int(max(0, seconds))
    for unit, size, sub, subsize in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if s >= size:
            return f"{s // size}{unit} {(s % size) // subsize}{sub}"
    return f"{s}s"


def make_console(file: TextIO | None = None) -> Console:
    """The console every command prints with: colour only on a terminal (and not with NO_COLOR); off a terminal
    (a pipe, a file) as wide as the text, so a table is never cut to 80 columns for the program reading it."""
    console = Console(file=file, highlight=False)
    if not console.is_terminal:
        console = Console(file=file, highlight=False, width=10_000, color_system=None)
    return console


# ------------------------------------------------------------------ status
def _line(label: str, *parts: Text | str | None) -> Text:
    text = Text()
    text.append(f"{label:<{LABEL_WIDTH}}", style="bold cyan")
    first = True
    for part in parts:
        if part is None or part == "":
            continue
        if not first:
            text.append(" · ", style="dim")
        text.append(part if isinstance(part, Text) else Text(part))
        first = False
    return text


def transport_text(st: dict[str, Any]) -> str:
    """How the kernel talks to the daemon: `kernel` (the protocol version settled at INIT, with
    or without passthrough; copy mode with its request workers) or `libfuse`."""
    transport = st.get("fuse_transport") or "-"
    if transport == "kernel":
        version = f" (FUSE {st['fuse_protocol']})" if st.get("fuse_protocol") else ""
        if st.get("passthrough"):
            return f"kernel{version}, passthrough ({plural(st.get('passthrough_handles') or 0, 'handle')} open)"
        return f"kernel{version}, copy mode (no passthrough, {plural(st.get('fuse_workers') or 1, 'worker')})"
    return transport


def status_lines(st: dict[str, Any]) -> list[Text]:
    """The one-screen status of a mount, from the daemon's status dict (missing fields count as 0)."""
    g = lambda key, default=0: st.get(key, default) if st.get(key) is not None else default  # noqa: E731
    lines: list[Text] = []

    head = Text(f"ckptfs {g('version', '?')}", style="bold")
    head.append(f"  {g('mountpoint', '?')} ← {g('source', '?')}")
    head.append(f"  pid {g('pid', '?')}, up {fmt_duration(g('uptime_seconds'))}", style="dim")
    lines.append(head)
    if st.get("fuse_transport"):
        lines.append(_line("fuse", transport_text(st)))

    # drain: what is not in the bucket yet
    dirty_files, dirty_bytes = g("dirty_files"), g("dirty_bytes")
    deletes, markers = g("pending_deletes"), g("pending_markers")
    writing = len(st.get("open_for_writing") or [])
    if dirty_files or deletes or markers:
        lag = g("oldest_dirty_age_seconds")
        lines.append(_line(
            "drain",
            Text(f"{plural(dirty_files, 'dirty file')} ({fmt_bytes(dirty_bytes)}) not in the bucket", style="yellow"),
            # durability = peer: what of it is on peers' disks too (`user.ckptfs.state` replicated): not single-copy
            Text(f"{fmt_bytes(dirty_bytes - g('single_copy_bytes'))} of it replicated on peers", style="green")
            if st.get("durability") == "peer" and dirty_bytes > g("single_copy_bytes") else None,
            f"{g('uploading_files')} uploading" if dirty_files else None,
            f"{g('temporary_held_files')} held in temporary directories" if g("temporary_held_files") else None,
            f"lag {fmt_duration(lag)}" if dirty_files else None,
            f"{writing} open for writing" if writing else None,
            plural(deletes, "deletion") + " queued" if deletes else None,
            plural(markers, "directory marker") + " queued" if markers else None,
        ))
    else:
        lines.append(_line("drain", Text("nothing dirty: everything is in the bucket", style="green")))

    if st.get("durability") == "peer":
        lines.append(peers_line(st))
    elif st.get("peer_nodes_elsewhere"):  # durability = local among nodes that replicate
        lines.append(_line("peers", Text(f"durability = local here, while {', '.join(st['peer_nodes_elsewhere'])} run durability = "
                                         "peer on this prefix: this node's files are not replicated", style="yellow")))

    # upload: how fast, how long until the dirty bytes are in
    rate = g("upload_bytes_per_second")
    window = g("upload_rate_window_seconds", 30)
    eta = st.get("drain_eta_seconds")
    if dirty_bytes:
        left = max(0, dirty_bytes - g("dirty_bytes_in_bucket"))
        eta_text = Text(f"ETA {fmt_duration(eta)} for {fmt_bytes(left)}") if eta is not None else Text(
            f"ETA unknown (no upload finished in the last {window:g}s)", style="yellow")
    else:
        eta_text = None
    lines.append(_line(
        "upload",
        fmt_rate(rate),
        eta_text,
        plural(g("parts_in_flight"), "part") + " in flight" if g("parts_in_flight") else None,
    ))

    # cache and backpressure
    stalled = g("stalled_writers")
    lines.append(_line(
        "cache",
        f"{fmt_bytes(g('cache_used_bytes'))} of {fmt_bytes(g('cache_capacity_bytes'))}",
        f"{fmt_bytes(g('cache_dirty_bytes') + g('cache_uploading_bytes'))} not uploaded",
        Text(f"{plural(stalled, 'writer')} stalled waiting for space", style="bold red") if stalled
        else Text("no writer stalled"),
        f"{plural(g('evicted_files_total'), 'file')} evicted" if g("evicted_files_total") else None,
    ))

    # since the daemon started
    lines.append(_line(
        "totals",
        f"uploaded {fmt_bytes(g('uploaded_bytes_total'))} ({plural(g('uploaded_files_total'), 'file')})",
        f"read {fmt_bytes(g('fetched_bytes_total'))} ({plural(g('fetched_files_total'), 'file')})",
        plural(g("listings_total"), "listing"),
    ))

    # how the bucket is written: the mode only, never a key
    enc = st.get("encryption") or {}
    if enc.get("mode") and enc.get("mode") != "none":
        lines.append(_line("encryption", " ".join(str(v) if k == "mode" else f"{k}={v}" for k, v in enc.items())))

    # errors, totals since start; stale directories are listings not refreshed since a failure
    counts = [
        (g("upload_errors_total"), "upload error", None),
        (g("read_errors_total"), "read error", None),
        (g("listing_errors_total"), "listing error", None),
        (g("checksum_mismatches_total"), "checksum mismatch", "checksum mismatches"),
        (g("enospc_total"), "write refused (cache full)", "writes refused (cache full)"),
        (g("stale_directories"), "stale directory", "stale directories"),
        (g("checkpoint_commit_errors_total"), "checkpoint commit error", None),
        (g("deletes_not_permitted_total"), "deletion not permitted", "deletions not permitted"),
        (g("peer_refused_writes_total"), "write refused for want of a peer (on_no_peer = fail)",
         "writes refused for want of a peer (on_no_peer = fail)"),
        ((st.get("tier_move") or {}).get("errors_total", 0), "move to the cold target failed", "moves to the cold target failed"),
    ]
    shown = [Text(plural(n, one, many), style="bold red") for n, one, many in counts if n]
    lines.append(_line("errors", *shown) if shown else _line("errors", Text("none", style="green")))
    services = st.get("services") or {}
    if services:
        lines.append(services_line(services))
    age = st.get("last_error_age_seconds")
    if st.get("last_error") and age is not None and age < LAST_ERROR_SHOWN_FOR:
        lines.append(_line("last", Text(f"{fmt_duration(age)} ago: {st['last_error']}", style="red")))
    move = st.get("tier_move") or {}
    if move.get("target"):  # tier_move_target: the daemon moves old checkpoints to a cold target
        at = move.get("last_error_at")
        stored = move.get("moved_stored_bytes_total", move.get("moved_bytes_total", 0))
        saved = f", stored in {fmt_bytes(stored)}" if stored != move.get("moved_bytes_total", 0) else ""  # compressed there
        lines.append(_line("cold tier", f"to {move['target']}: {plural(move.get('moved_total', 0), 'checkpoint')} moved "
                           f"({fmt_bytes(move.get('moved_bytes_total', 0))}{saved}) by this node",
                           f"moving {move['moving']}" if move.get("moving") else None,
                           Text(f"last error {fmt_duration(max(0.0, time.time() - at))} ago: {move['last_error']}", style="red")
                           if move.get("last_error") and at else None))
    return lines


PEERS_SHOWN = 12  # peers named one by one on the status line; the rest are counted by state


def peers_shown(peers: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the peers to name, the rest to count by state): in a large cluster most records are known only from the LIST
    (`known_from` listing): those are counted, and of the others the ones that matter most are named (not live,
    connected, then the rest), at most PEERS_SHOWN, in name order; any past that are counted too."""
    read = [p for p in peers if p.get("known_from") != "listing"]
    rank = sorted(read, key=lambda p: (p.get("state") == "live", not p.get("connected"), str(p.get("node"))))
    shown = sorted(rank[:PEERS_SHOWN], key=lambda p: str(p.get("node")))
    names = {p.get("node") for p in shown}
    return shown, [p for p in peers if p.get("node") not in names]


def peers_line(st: dict[str, Any]) -> Text:
    """Peer durability (durability = peer): this node's own state, each peer's, and the single-copy window (bytes
    acknowledged that only this node holds: losing it now would lose them)."""
    state = st.get("peer_state") or "?"
    own = Text(f"{st.get('node') or 'this node'} {state}", style="green" if state == "live" else "bold red")
    parts: list[Text | str] = [own]
    if st.get("peer_copies_uncounted"):
        parts.append(Text(f"peer copies not counted: {st['peer_copies_uncounted']}", style="bold red"))
    membership = st.get("membership") or {}
    if membership.get("error"):
        parts.append(Text(f"node records ({membership.get('backend') or 'bucket'}): {membership['error']}", style="bold red"))
    shown, listed = peers_shown(st.get("peers") or [])
    for p in shown:
        lag = p.get("lag_seconds")
        detail = f" (lag {fmt_duration(lag)})" if p.get("state") == "live" and lag else ""
        if p.get("state") == "refusing" and p.get("error"):
            detail = f" ({p['error']})"
        style = "" if p.get("state") == "live" else "dim" if p.get("state") == "left" else "bold red"
        parts.append(Text(f"{p.get('node')} {p.get('state')}{detail}", style=style))
    if listed:
        states = collections.Counter(str(p.get("state")) for p in listed)
        parts.append(Text(f"and {len(listed)} more: "
                          + ", ".join(f"{n} {state}" for state, n in sorted(states.items())), style="dim"))
    if not [p for p in st.get("peers") or [] if p.get("state") != "left"]:
        parts.append(Text("no peer known", style="bold red"))
    single = st.get("single_copy_bytes") or 0
    if single:
        parts.append(Text(f"{fmt_bytes(single)} single-copy for {fmt_duration(st.get('single_copy_oldest_age_seconds') or 0)}", style="yellow"))
    else:
        parts.append(Text("nothing single-copy", style="green"))
    if st.get("peer_degraded_writes_total"):
        parts.append(Text(plural(st["peer_degraded_writes_total"], "write") + " acknowledged without a peer", style="bold red"))
    if st.get("peer_replica_bytes"):
        parts.append(f"holding {fmt_bytes(st['peer_replica_bytes'])} for others")
    if st.get("peer_replicas_refused_total"):
        parts.append(Text(f"refused {plural(st['peer_replicas_refused_total'], 'replica')} (peer_capacity or disk full)", style="yellow"))
    if st.get("peer_takeovers_total"):
        parts.append(plural(st["peer_takeovers_total"], "takeover"))
    return _line("peers", *parts)


def services_line(services: dict[str, dict[str, Any]]) -> Text:
    """The daemon's background services: all running, or which restarted (or are restarting) and their last error."""
    troubled = {name: s for name, s in sorted(services.items()) if s.get("restarts") or s.get("state") != "running"}
    if not troubled:
        return _line("services", Text(f"all {len(services)} running, none restarted", style="green"))
    parts: list[Text | str] = []
    for name, s in troubled.items():
        state = "restarting" if s.get("state") == "restarting" else "running again"
        restarts = plural(s.get("restarts") or 0, "restart")
        error = f": {s['last_error']}" if s.get("last_error") else ""
        parts.append(Text(f"{name} {state} ({restarts}){error}", style="bold red" if state == "restarting" else "yellow"))
    others = len(services) - len(troubled)
    if others:
        parts.append(f"{others} other{'s' if others != 1 else ''} running")
    return _line("services", *parts)


def status_screen(st: dict[str, Any], footer: str | None = None) -> Group:
    lines: list[Text] = status_lines(st)
    if footer:
        lines.append(Text(footer, style="dim"))
    return Group(*lines)


def watch(console: Console, first: dict[str, Any], fetch: Callable[[], dict[str, Any]], interval: float, as_json: bool,
          dump: Callable[[dict[str, Any]], str]) -> None:
    """Show `first`, then a fresh status every `interval` seconds until Ctrl-C (which returns normally).

    On a terminal the screen is redrawn in place; otherwise (or with JSON) each
    refresh is appended: a timestamped block, or one JSON object per line.
    """
    st = first
    try:
        if as_json:
            while True:
                console.file.write(dump(st) + "\n")
                console.file.flush()
                time.sleep(interval)
                st = fetch()
        if not console.is_terminal:
            while True:
                console.print(Text(time.strftime("%Y-%m-%d %H:%M:%S"), style="dim"))
                console.print(status_screen(st), soft_wrap=True)
                console.print()
                console.file.flush()
                time.sleep(interval)
                st = fetch()
        from rich.live import Live

        footer = lambda: f"{time.strftime('%H:%M:%S')}, every {interval:g}s; Ctrl-C to stop"  # noqa: E731
        with Live(status_screen(st, footer()), console=console, auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                live.update(status_screen(fetch(), footer()), refresh=True)
    except KeyboardInterrupt:
        return


# ------------------------------------------------------------------- flush
class FlushProgress:
    """Progress of a flush by bytes, with throughput and ETA.

    The daemon sends what is not yet durable under the path (`bytes`, of which
    `uploaded_bytes` are parts already in the bucket) and the drain's current
    throughput; what is left is the difference. `total` grows if files are
    added meanwhile, so the durable part only ever grows. On a terminal: a
    progress bar. Otherwise one line on stdout each time another tenth is
    durable, or every `quiet_interval` seconds while nothing moves, so a log
    shows a stuck flush too.
    """

    def __init__(self, label: str, console: Console, quiet_interval: float = 30.0, clock: Callable[[], float] = time.monotonic,
                 level: str = "durable") -> None:
        self.label = label
        self.level = level  # durable, or replicated (`flush --level replicated`: no upload rate, so no ETA)
        self.console = console
        self.quiet_interval = quiet_interval
        self.clock = clock
        self.total = 0
        self.completed = 0
        self.started = False
        self.printed_tenth = -1
        self.printed_at = clock()
        self.progress: Any = None
        if console.is_terminal:
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

            self.progress = Progress(TextColumn("flush {task.description}"), BarColumn(), DownloadColumn(binary_units=True),
                                     TextColumn("{task.fields[speed]}  ETA {task.fields[eta]}  {task.fields[left]}"),
                                     console=console)
            self.progress.start()
            self.task = self.progress.add_task(label, total=None, speed="", eta="?", left="")

    def update(self, msg: dict[str, Any]) -> None:
        left = max(0, int(msg["bytes"]) - int(msg.get("uploaded_bytes", 0)))
        if not self.started and not (msg["bytes"] or msg["files"] or msg.get("deletes")):
            return  # nothing was left to do: "0 B of 0 B (100%)" would say nothing (the caller says it is done)
        if not self.started:
            self.started = True
            self.total, self.completed = int(msg["bytes"]), int(msg["bytes"]) - left
        self.total = max(self.total, self.completed + left)
        self.completed = self.total - left
        rate = float(msg.get("upload_bytes_per_second", 0))
        eta = fmt_duration(left / rate) if rate else "unknown"
        pace = f", {fmt_rate(rate)}, ETA {eta}" if self.level == "durable" else ""
        what = plural(int(msg["files"]), "file") + " left"
        if msg.get("deletes"):
            what += f", {plural(msg['deletes'], 'deletion')}"
        if self.progress is not None:
            durable = self.level == "durable"  # replicated: no rate of its own to show
            self.progress.update(self.task, total=max(self.total, 1), completed=self.completed, speed=fmt_rate(rate) if durable else "",
                                 eta=eta if durable else "-", left=what)
            return
        now = self.clock()
        tenth = math.floor(10 * self.completed / self.total) if self.total else 10
        if tenth > self.printed_tenth or now - self.printed_at >= self.quiet_interval:
            self.printed_tenth = max(self.printed_tenth, tenth)
            self.printed_at = now
            pct = 100 * self.completed / self.total if self.total else 100.0
            self.console.print(f"ckptfs: flush {self.label}: {fmt_bytes(self.completed)} of {fmt_bytes(self.total)} {self.level} "
                               f"({pct:.0f}%){pace}, {what}", soft_wrap=True)

    def finish(self) -> None:
        if self.progress is not None:
            self.progress.update(self.task, total=max(self.total, 1), completed=max(self.total, 1), eta="0s", left="done")

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


# ---------------------------------------------------------- reading back
class TransferProgress:
    """A progress bar by bytes for a command that reads files from the bucket (warmup, verify --deep, drill).

    Only when `show` (the caller decides: stdout is a terminal, and no --json); otherwise nothing. Each
    progress line of the daemon carries `files`, `bytes` (the total) and `done_bytes`.
    """

    def __init__(self, label: str, show: bool) -> None:
        self.progress: Any = None
        if show:
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn, TransferSpeedColumn

            self.progress = Progress(TextColumn(label + " {task.fields[files]} files"), BarColumn(), DownloadColumn(binary_units=True),
                                     TransferSpeedColumn(), TimeElapsedColumn())
            self.progress.start()
            self.task = self.progress.add_task(label, total=None, files="?")

    def update(self, msg: dict[str, Any]) -> None:
        if self.progress is not None:
            self.progress.update(self.task, total=msg["bytes"], completed=msg["done_bytes"], files=msg["files"])

    def __enter__(self) -> TransferProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()
