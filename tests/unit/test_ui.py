"""The catalogue page (gateway/ui/) on a generated catalogue of 10,000 checkpoints under one run:
pages, filters, order, the one checkpoint's tables, read-only by construction, the token."""

from __future__ import annotations

import functools
import os
import re
import urllib.error
import urllib.request
from typing import Any

import pytest
import trio

from ckptfs.ui import view
from ckptfs.httpserver import serve
from ckptfs.metrics import Metrics
from ckptfs.ui.app import COOKIE, CatalogueApp
from ckptfs.ui.serve import UiError, check_bind, read_token
from ckptfs.ui.snapshot import AskError, Snapshots, read_only

N = 10_000
RUN = "runs/big"
SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"


def entry(step: int) -> dict[str, Any]:
    state = "protected" if step % 1000 == 0 else ("expiring" if step < 100 else "committed")
    cls = "GLACIER" if step < 2000 else "STANDARD"
    return {"path": f"{RUN}/step_{step:05d}", "step": step, "state": state, "files": 3, "bytes": step * 1024,
            "stored_bytes": step * 1024, "protected": state == "protected",
            "protection": {"reason": "paper"} if state == "protected" else None, "committed": True,
            "committed_at": 1.7e9 + step, "generation": 1, "changed": False, "node": "n1",
            "metadata": {"lr": 0.001, "git": {"commit": "abc123"}, "aws_secret_access_key": SECRET},
            "last_verify": {"outcome": "whole", "at": 1.7e9 + step, "generation": 1} if step % 2 else None,
            "storage_class": cls, "storage_classes": {cls: step * 1024}, "retention": None, "moved": None,
            "monthly_cost": step * 1e-6, "retention_plan": {"action": "keep", "rules": ["last"], "reason": "newest"}}


CATALOGUE = {"ok": True, "path": "", "checkpoints": [entry(s) for s in range(N)] + [{**entry(1), "path": "runs/small/step_1"}],
             "retention_policy": True, "drills": {"last": {"path": f"{RUN}/step_09999", "outcome": "ok", "verify": "whole", "at": 1.8e9}}}
asked: list[dict[str, Any]] = []


async def fake_ask(request: dict[str, Any]) -> dict[str, Any]:
    asked.append(request)
    if request["cmd"] == "catalogue" and request.get("files"):
        return {"ok": True, "path": request["path"], "files": [{"path": f"shard_{i}.bin", "size": 10, "xxh3": "ab"} for i in range(450)]}
    if request["cmd"] == "catalogue":
        return CATALOGUE
    if request["cmd"] == "audit":
        return {"ok": True, "events": [{"at_iso": "2026-01-01T00:00:00Z", "action": "protect", "who": {"user": "ann"},
                                        "node": "n1", "reason": "paper"}]}
    return {"ok": False, "error": "no replica targets configured: add [replica.NAME] tables"}


def get(app: CatalogueApp, url: str, method: str = "GET", headers: list[tuple[bytes, bytes]] | None = None) -> tuple[int, dict[bytes, bytes], str]:
    path, _, query = url.partition("?")

    async def main() -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        async with trio.open_nursery() as nursery:
            await nursery.start(app.snapshots.run)
            out = await app.answer({"type": "http", "method": method, "path": path, "query_string": query.encode(),
                                    "headers": headers or []})
            nursery.cancel_scope.cancel()
        return out

    status, hdrs, body = trio.run(main)
    return status, dict(hdrs), body.decode()


def rows(html: str) -> list[str]:
    return re.findall(r'<tr data-path="([^"]+)"', html)


@pytest.fixture
def app() -> CatalogueApp:
    return CatalogueApp(Snapshots(fake_ask, ""), "/mnt/ckpt")


def test_runs_page_counts_every_checkpoint_of_each_run(app: CatalogueApp) -> None:
    status, _, html = get(app, "/")
    assert status == 200
    assert f"?run={RUN}" in html and "runs/small" in html
    assert f'<td class="n">{N}</td>' in html  # checkpoints of runs/big


def test_a_run_of_10000_checkpoints_is_paged_newest_first(app: CatalogueApp) -> None:
    status, _, html = get(app, f"/run?run={RUN}")
    assert status == 200
    assert len(rows(html)) == view.PER_PAGE
    assert rows(html)[0] == f"{RUN}/step_09999"
    assert f"{N} checkpoints, page 1 of {N // view.PER_PAGE}" in html
    _, _, last = get(app, f"/run?run={RUN}&page={N // view.PER_PAGE}")
    assert rows(last)[-1] == f"{RUN}/step_00000"


def test_filters_narrow_the_checkpoints(app: CatalogueApp) -> None:
    _, _, html = get(app, f"/run?run={RUN}&state=protected&per=500")
    assert sorted(rows(html)) == [f"{RUN}/step_{s:05d}" for s in range(0, N, 1000)]
    _, _, html = get(app, f"/run?run={RUN}&step_min=10&step_max=19&order=asc")
    assert rows(html) == [f"{RUN}/step_{s:05d}" for s in range(10, 20)]
    _, _, html = get(app, f"/run?run={RUN}&tier=GLACIER&protected=yes")
    assert rows(html) == [f"{RUN}/step_01000", f"{RUN}/step_00000"]
    _, _, html = get(app, f"/run?run={RUN}&sort=bytes&order=asc&state=expiring")
    assert rows(html)[:3] == [f"{RUN}/step_{s:05d}" for s in (1, 2, 3)]


def test_one_checkpoint_shows_its_metadata_history_commands_and_files_but_no_secret(app: CatalogueApp) -> None:
    status, _, html = get(app, f"/checkpoint?path={RUN}/step_09999")
    assert status == 200
    assert "<td>git.commit</td><td>abc123</td>" in html and "<td>lr</td><td>0.001</td>" in html
    assert SECRET not in html and view.HIDDEN in html
    assert "ckptfs warmup /mnt/ckpt/runs/big/step_09999" in html
    assert "ckptfs drill /mnt/ckpt/runs/big/step_09999" in html
    assert "ckptfs protect /mnt/ckpt/runs/big/step_09999" in html
    assert "drill (last): ok" in html and "protect by ann" in html
    assert "kept by last" in html
    assert "450 files, page 1 of 3" in html and "shard_0.bin" in html
    assert "no replica targets configured" in html
    assert get(app, "/checkpoint?path=runs/none")[0] == 404


def test_a_run_that_does_not_exist_is_a_404_like_a_checkpoint(app: CatalogueApp) -> None:
    status, _, body = get(app, "/run?run=nope")
    assert status == 404 and "no such run" in body
    assert get(app, "/run?run=runs/small")[0] == 200 and get(app, "/run")[0] == 200


def test_history_is_one_time_format_sorted_by_time() -> None:
    """Issue 35: a drill at 12:35:11 listed before a protect at 12:35:05, in two formats; now one list, oldest first."""
    e = {"last_verify": {"outcome": "whole", "at": 1795782920.0, "deep": True}}
    drills = {"last": {"path": "r/step_1", "outcome": "ok", "verify": "whole", "at": 1795782911.2}}
    events = [{"at": 1795782905.360255, "at_iso": "2026-11-27T12:35:05.360255Z", "action": "protect", "who": {"user": "ann"},
               "node": "n1", "reason": "paper"},
              {"at_iso": "2026-11-27T12:35:30.5Z", "action": "unprotect", "who": {"user": "bob"}, "node": "n2", "reason": "done"}]
    rows = [(view.when(at), what) for at, what in view.history(e, drills, events)]
    assert rows == [("2026-11-27 12:35:05 UTC", "protect by ann on n1: paper"),
                    ("2026-11-27 12:35:11 UTC", "drill (last): ok, verify whole"),
                    ("2026-11-27 12:35:20 UTC", "verify (deep): whole"),
                    ("2026-11-27 12:35:30 UTC", "unprotect by bob on n2: done")]


def test_the_checkpoint_page_shows_history_in_one_format(app: CatalogueApp) -> None:
    _, _, html = get(app, f"/checkpoint?path={RUN}/step_09999")
    table = html[html.index('id="history"'):html.index("</table>", html.index('id="history"'))]
    stamps = re.findall(r"<tr><td>([^<]*)</td>", table)
    assert stamps and all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", s) for s in stamps), stamps
    assert stamps == sorted(stamps)


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_every_method_but_get_and_head_is_refused(app: CatalogueApp, method: str) -> None:
    status, headers, _ = get(app, f"/run?run={RUN}", method=method)
    assert status == 405 and headers[b"allow"] == b"GET, HEAD"


def test_the_page_asks_the_daemon_only_reads() -> None:
    ask = read_only(fake_ask)
    for cmd in ("protect", "unprotect", "retention_apply", "checkpoint_commit", "unmount", "evict", "drill"):
        with pytest.raises(AskError, match="only reads"):
            trio.run(ask, {"cmd": cmd, "path": "x"})
    assert {r["cmd"] for r in asked} <= {"catalogue", "audit", "replicate_status"}


def test_a_token_is_required_when_set() -> None:
    token = "0123456789abcdef0123"
    app = CatalogueApp(Snapshots(fake_ask, ""), "/mnt/ckpt", token=token)
    assert get(app, "/")[0] == 401
    assert get(app, "/", headers=[(b"authorization", b"Bearer wrong-token-wrong")])[0] == 401
    assert get(app, "/", headers=[(b"authorization", f"Bearer {token}".encode())])[0] == 200
    status, headers, _ = get(app, f"/run?run=x&token={token}")
    assert status == 303 and headers[b"location"] == b"/run?run=x" and token.encode() in headers[b"set-cookie"]
    assert get(app, "/", headers=[(b"cookie", f"a=b; {COOKIE}={token}".encode())])[0] == 200


def test_non_loopback_without_a_token_is_refused(tmp_path: Any) -> None:
    check_bind("127.0.0.1", None)
    check_bind("::1", None)
    with pytest.raises(UiError, match="not a loopback address"):
        check_bind("0.0.0.0", None)
    check_bind("0.0.0.0", "0123456789abcdef")
    f = tmp_path / "token"
    f.write_text("0123456789abcdef\n")
    os.chmod(f, 0o644)
    with pytest.raises(UiError, match="chmod 600"):
        read_token(str(f))
    os.chmod(f, 0o600)
    assert read_token(str(f)) == "0123456789abcdef"


def test_served_over_http_by_hypercorn_with_the_metrics() -> None:
    page = CatalogueApp(Snapshots(fake_ask, ""), "/mnt/ckpt", prefix="/ui")
    app = Metrics(lambda: {"dirty_files": 7}).app(page)

    def fetch(url: str, method: str = "GET") -> tuple[int, str]:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method=method, data=b"x" if method != "GET" else None)) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    async def main() -> list[tuple[int, str]]:
        async with trio.open_nursery() as nursery:
            await nursery.start(page.snapshots.run)
            port = await nursery.start(functools.partial(serve, app, "127.0.0.1", 0, read_timeout=10))
            base = f"http://127.0.0.1:{port}"
            out = [await trio.to_thread.run_sync(fetch, base + u, m)
                   for u, m in (("/metrics", "GET"), ("/ui/", "GET"), ("/ui/run?run=runs/small", "POST"), ("/metrics", "DELETE"))]
            nursery.cancel_scope.cancel()
        return out

    (s1, metrics), (s2, runs), (s3, _), (s4, _) = trio.run(main)
    assert s1 == 200 and "ckptfs_dirty_files 7.0\n" in metrics
    assert s2 == 200 and 'href="/ui/run?run=runs/big"' in runs
    assert (s3, s4) == (405, 405)


def test_a_busy_address_is_one_oserror() -> None:
    import socket

    async def main(port: int) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(functools.partial(serve, CatalogueApp(Snapshots(fake_ask, ""), "/mnt/ckpt"), "127.0.0.1", port, read_timeout=10))

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(BaseExceptionGroup) as caught:  # the bare OSError, in the test's own nursery's group
            trio.run(main, busy.getsockname()[1])
    assert [type(e) for e in caught.value.exceptions] == [OSError]


def test_ui_enabled_needs_metrics_addr() -> None:
    from ckptfs.config import Config, ConfigError

    with pytest.raises(ConfigError, match="ui_enabled = true needs metrics_addr"):
        Config(bucket="ckpt-bucket", mountpoint="/m", cache_dir="/c", ui_enabled=True).validate()


def test_a_slow_first_catalogue_gives_a_page_that_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from ckptfs.ui import snapshot

    monkeypatch.setattr(snapshot, "FIRST_WAIT", 0.05)
    release = trio.Event()

    async def slow(request: dict[str, Any]) -> dict[str, Any]:
        await release.wait()
        return await fake_ask(request)

    app = CatalogueApp(Snapshots(slow, ""), "/mnt/ckpt")

    async def main() -> tuple[bytes, bytes]:
        async with trio.open_nursery() as nursery:
            await nursery.start(app.snapshots.run)
            first = await app.answer({"type": "http", "method": "GET", "path": "/", "query_string": b"", "headers": []})
            release.set()
            while app.snapshots.current is None:  # the refresh the first page asked for
                await trio.sleep(0.01)
            second = await app.answer({"type": "http", "method": "GET", "path": "/", "query_string": b"", "headers": []})
            nursery.cancel_scope.cancel()
        return first[2], second[2]

    first, second = trio.run(main)
    assert b"still reading the catalogue" in first and b"runs/big" not in first
    assert b"runs/big" in second


def test_a_checkpoint_on_peers_disks_shows_replicated_and_filters_so() -> None:
    """durability = peer: a checkpoint whose files not yet durable are all on peers' disks is `replicated` in the
    catalogue; the page shows it so, and the state filter offers it."""
    states = {1: "committed", 2: "replicated", 3: "draining", 4: "writing"}
    catalogue = {"ok": True, "path": "", "retention_policy": False, "drills": {},
                 "checkpoints": [{**entry(step), "path": f"runs/p/step_{step}", "state": state, "committed": state == "committed",
                                  "protected": False, "protection": None} for step, state in states.items()]}

    async def ask(request: dict[str, Any]) -> dict[str, Any]:
        return catalogue if request["cmd"] == "catalogue" and not request.get("files") else {"ok": False, "error": "no"}

    page = CatalogueApp(Snapshots(ask, ""), "/mnt/ckpt")
    _, _, html = get(page, "/run?run=runs/p&state=replicated")
    assert rows(html) == ["runs/p/step_2"]
    assert '<span class="state s-replicated">replicated</span>' in html
    assert "<option selected>replicated</option>" in html  # a state the filter offers
    assert ".s-replicated" in html  # and has a colour of its own
