"""The catalogue page as an ASGI application: GET and HEAD only, a token where one is set.

There is no endpoint that acts: every other method is answered 405, and the only requests the
page can make of the daemon are the reads `snapshot.READ_COMMANDS` lets through. With a token
(`--token-file`, `ui_token_file`) a request must carry it: `Authorization: Bearer TOKEN`, or the
cookie the first visit with `?token=TOKEN` sets (then redirected to the address without it, so it
stays out of the history). Pages: `PREFIX/` the runs, `PREFIX/run?run=DIR&...` its checkpoints
(filters, order, page), `PREFIX/checkpoint?path=P` one checkpoint and its files.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any, Awaitable, Callable
from urllib.parse import parse_qs, urlencode

import jinja2

from . import view
from .snapshot import AskError, Snapshots

log = logging.getLogger(__name__)

UI_PREFIX = "/ui"  # where the daemon serves the page on metrics_addr (ui_enabled)
COOKIE = "ckptfs_ui_token"
FILES_PER_PAGE = 200
REFRESH_SECONDS = 30  # the page reloads its content this often
HEADERS = [
    (b"cache-control", b"no-store"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    # everything is inline: nothing may be loaded from elsewhere (the page works offline)
    (b"content-security-policy", b"default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
                                 b"connect-src 'self'; img-src 'self' data:; form-action 'self'; base-uri 'none'"),
]

Send = Callable[[dict[str, Any]], Awaitable[None]]


def templates() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("ckptfs.ui", "templates"), autoescape=True,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(view.FILTERS)
    return env


class CatalogueApp:
    """The page for the checkpoints under `mount` (shown in the commands to paste), read through `snapshots`."""

    def __init__(self, snapshots: Snapshots, mount: str, token: str | None = None, prefix: str = "") -> None:
        self.snapshots, self.mount, self.token, self.prefix = snapshots, mount, token, prefix.rstrip("/")
        self.env = templates()

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]], send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        status, headers, body = await self.answer(scope)
        await send({"type": "http.response.start", "status": status, "headers": HEADERS + headers})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})

    async def answer(self, scope: dict[str, Any]) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """(status, headers, body) for one request."""
        text = [(b"content-type", b"text/plain; charset=utf-8")]
        if scope["method"] not in ("GET", "HEAD"):
            return 405, text + [(b"allow", b"GET, HEAD")], b"the catalogue page is read-only: only GET and HEAD\n"
        args = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if self.token is not None:
            given = (args.get("token") or [""])[-1]
            if given and hmac.compare_digest(given.encode(), self.token.encode()):
                rest = urlencode({k: v for k, v in args.items() if k != "token"}, doseq=True)
                return 303, [(b"location", (scope["path"] + (f"?{rest}" if rest else "")).encode()),
                             (b"set-cookie", f"{COOKIE}={self.token}; HttpOnly; SameSite=Strict; Path=/".encode())], b""
            if not self.authorized(scope):
                return 401, text, b"a token is required: open this address with ?token=TOKEN (the content of the token file)\n"
        path = scope["path"]
        if not path.startswith(self.prefix):
            return 404, text, b"not found\n"
        page = path[len(self.prefix):] or "/"
        html = [(b"content-type", b"text/html; charset=utf-8")]
        try:
            if page == "/":
                return 200, html, await self.runs_page()
            if page == "/run":
                found = await self.run_page(args)
                return (200, html, found) if found is not None else (404, text, b"no such run in the catalogue: no checkpoint in that directory\n")
            if page == "/checkpoint":
                found = await self.checkpoint_page(args)
                return (200, html, found) if found is not None else (404, text, b"no such checkpoint in the catalogue\n")
        except AskError as e:
            return 503, text, f"the daemon did not answer: {e}\n".encode()
        return 404, text, b"not found: the pages are /, /run?run=DIR and /checkpoint?path=PATH\n"

    def authorized(self, scope: dict[str, Any]) -> bool:
        assert self.token is not None
        want = self.token.encode()
        for name, value in scope.get("headers", []):
            if name == b"authorization" and value.startswith(b"Bearer ") and hmac.compare_digest(value[7:].strip(), want):
                return True
            if name == b"cookie":
                for part in value.split(b";"):
                    k, _, v = part.strip().partition(b"=")
                    if k == COOKIE.encode() and hmac.compare_digest(v, want):
                        return True
        return False

    def render(self, name: str, **context: Any) -> bytes:
        return self.env.get_template(name).render(prefix=self.prefix, mount=self.mount, refresh=REFRESH_SECONDS,
                                                  states=view.STATES, **context).encode()

    async def runs_page(self) -> bytes:
        snap = await self.snapshots.get()
        return self.render("runs.html", snap=snap, runs=view.runs(snap.checkpoints))

    async def run_page(self, args: dict[str, list[str]]) -> bytes | None:
        """A run's checkpoints; None for a run the catalogue does not have (a 404, as for a checkpoint)."""
        snap = await self.snapshots.get()
        q = view.Query.parse(args)
        under = [e for e in snap.checkpoints if q.run is None or view.run_of(e["path"]) == q.run]
        if q.run is not None and not under and snap.taken_at:  # read, and it has none there (not: still reading)
            return None
        page = view.select(under, q)

        def link(**change: Any) -> str:
            merged = {k: v for k, v in args.items() if k != "token"}
            merged.update({k: [str(v)] for k, v in change.items()})
            return f"{self.prefix}/run?{urlencode(merged, doseq=True)}"

        return self.render("run.html", snap=snap, q=q, page=page, link=link, verdict=view.verdict)

    async def checkpoint_page(self, args: dict[str, list[str]]) -> bytes | None:
        snap = await self.snapshots.get()
        path = (args.get("path") or [""])[-1].strip("/")
        e = snap.by_path.get(path)
        if e is None:
            return None
        ask = self.snapshots.ask
        files, files_error = [], None
        try:
            files = (await ask({"cmd": "catalogue", "path": path, "files": True}))["files"]
        except AskError as err:
            files_error = str(err)
        events: list[dict[str, Any]] = []
        try:
            events = (await ask({"cmd": "audit", "path": path}))["events"]
        except AskError:
            pass  # the page says there are none; `ckptfs audit` gives the reason
        try:
            replicas: list[dict[str, Any]] | str = (await ask({"cmd": "replicate_status", "path": path}))["targets"]
        except AskError as err:
            replicas = str(err)
        fpage = max(1, view.to_int((args.get("fpage") or ["1"])[-1]) or 1)
        fpages = max(1, -(-len(files) // FILES_PER_PAGE))
        fpage = min(fpage, fpages)
        drills = {k: v for k, v in (snap.drills or {}).items() if isinstance(v, dict) and v.get("path") == path}
        return self.render("checkpoint.html", snap=snap, e=view.redact(e), meta=view.metadata_rows(e.get("metadata") or {}),
                           verdict=view.verdict(e, snap.retention_policy), commands=view.next_commands(self.mount, e),
                           files=files[(fpage - 1) * FILES_PER_PAGE: fpage * FILES_PER_PAGE], nfiles=len(files),
                           fpage=fpage, fpages=fpages, files_error=files_error,
                           replicas=view.redact(replicas), history=view.history(e, view.redact(drills), view.redact(events)),
                           run=view.run_of(path))

