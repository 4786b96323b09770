"""The control socket: how the `ckptfs` CLI talks to a running daemon.

A Unix stream socket in the cache directory, mode 0600 (only the mounting
user may ask it anything), found by the CLI through the `user.ckptfs.control`
xattr on the mount root. One JSON object per line each way:

  {"cmd": "status"}                      -> {"ok": true, "status": {...}}
  {"cmd": "flush", "path": "a/b"}        -> progress lines {"files", "bytes", "deletes", "uploaded_bytes",
                                            "upload_bytes_per_second"}: what is not yet durable under the
                                            path; uploaded_bytes of those bytes are in the bucket already
                                            (parts of running uploads); the drain's current throughput
                                            ... then {"ok": true, "done": true}
  {"cmd": "flush", "path": "a/b", "level": "replicated"}
                                         -> the same lines, counting what is neither durable nor on peer_replicas
                                            peers' disks (durability = peer; refused with one line on a mount
                                            with durability = local); "level": "durable" is the default
  {"cmd": "warmup", "paths": ["a", "b/c"]} -> progress lines {"files", "bytes", "done_bytes"}
                                            ... then {"ok": true, "done": true, "failed": [[path, error], ...]}
  {"cmd": "evict", "path": "a"}          -> {"ok": true, "files": N, "bytes": N, "skipped": N}
  {"cmd": "unmount", "flush": false, "force": false}
                                         -> {"ok": true, "pid": N}; the daemon then stops, and once it has
                                            drained what it could: {"ok": true, "done": true, "left_files": N,
                                            "left_bytes": N, "left_deletes": N, "cache_dir": "..."} (what stays
                                            in the journal for the next mount). Refused while files are open
                                            for writing unless "force".
  {"cmd": "checkpoints" | "checkpoint_commit" | "verify" | "protect" | "unprotect" | "audit", "path": ...}
                                         -> see lifecycle/service.py (verify and commit stream progress lines)
  {"cmd": "catalogue", "path": ..., "files": false}
                                         -> the catalogue page's data: see lifecycle/overview.py
  {"cmd": "lifecycle_plan" | "lifecycle_apply" | "restore" | "usage", "path": ...}
                                         -> see lifecycle/tiers.py and lifecycle/usage.py
  {"cmd": "replicate_status"[, "path": CHECKPOINT]} | {"cmd": "verify" | "drill", "path": ..., "target": NAME}
                                         -> see replication/service.py
  {"cmd": "inject_fault", "service": NAME} -> {"ok": true}: tests only, where CKPTFS_TEST_FAULTS names the
                                            service (supervisor.py); otherwise an unknown command
Errors: {"ok": false, "error": "one line"}. A request that is not a JSON object, or whose handling fails in a
way nobody expected, is answered with such a line (logged with its traceback): the server keeps serving.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Awaitable, Callable, Protocol

import trio

from .peering import FLUSH_LEVELS
from .supervisor import Supervisor

log = logging.getLogger(__name__)

PROGRESS_INTERVAL = 0.2
LIFECYCLE_COMMANDS = ("checkpoints", "catalogue", "checkpoint_commit", "verify", "protect", "unprotect", "audit",
                      "lifecycle_plan", "lifecycle_apply", "restore", "usage",
                      "retention_plan", "retention_apply", "retention_restore", "drill", "drill_done")


class Daemon(Protocol):
    def status(self) -> dict[str, Any]: ...
    def flush_progress(self, path: str) -> dict[str, int]: ...
    def request_stop(self, flush: bool) -> None: ...
    def exists(self, path: str) -> bool: ...
    async def warmup(self, paths: list[str], progress: Callable[[dict[str, Any]], Awaitable[None]]) -> list[tuple[str, str]]: ...
    def evict(self, path: str) -> dict[str, int]: ...
    def open_for_writing(self) -> list[str]: ...
    async def stopped(self) -> dict[str, Any]: ...
    def stop_reported(self) -> None: ...
    def inject_fault(self, service: str) -> None: ...
    supervisor: Supervisor  # the services and their restarts; `faults` names those a test may break
    peers: Any  # peers.service.Peers with durability = peer, else None
    lifecycle: Any  # lifecycle.service.Lifecycle: checkpoints, commit, verify, protect (docs/lifecycle.md)


class ControlServer:
    def __init__(self, path: Path, daemon: Daemon) -> None:
        self.path = path
        self.daemon = daemon

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        old = os.umask(0o177)
        try:
            await sock.bind(str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        sock.listen(16)
        listener = trio.SocketListener(sock)
        task_status.started()
        try:
            await trio.serve_listeners(self._handle, [listener])
        finally:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass

    async def _handle(self, stream: trio.SocketStream) -> None:
        """One connection. Nothing a request does escapes: an error is answered with one line (a handler's
        exception would otherwise end `serve_listeners`, and with it the control server)."""
        async with stream:
            try:
                line = await _read_line(stream)
                if line is None:
                    return
                request = json.loads(line)
                if not isinstance(request, dict):
                    raise ValueError(f"a request is a JSON object, not {type(request).__name__}")
                await self._dispatch(request, lambda obj: stream.send_all(json.dumps(obj).encode() + b"\n"))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the client went away (e.g. flush timed out)
            except (ValueError, KeyError, TypeError) as e:
                await _answer(stream, f"bad request: {e}")
            except Exception as e:  # noqa: BLE001 - a handler's bug fails its request, never the server
                log.exception("control request failed unexpectedly")
                await _answer(stream, f"internal error: {type(e).__name__}: {e} (see the daemon's log)".splitlines()[0])

    async def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """`request` answered as over the socket, without it: the last line (the catalogue page in the daemon)."""
        replies: list[dict[str, Any]] = []

        async def keep(obj: Any) -> None:
            replies.append(obj)

        try:
            await self._dispatch(request, keep)
        except Exception as e:  # noqa: BLE001 - as on the socket: a handler's bug fails its request, not the page's server
            log.exception("control request failed unexpectedly")
            return {"ok": False, "error": f"internal error: {type(e).__name__}: {e} (see the daemon's log)".splitlines()[0]}
        return replies[-1] if replies else {"ok": False, "error": "no answer"}

    async def _dispatch(self, request: dict[str, Any], send: Callable[[Any], Awaitable[None]]) -> None:
        cmd = request.get("cmd")
        if cmd == "status":
            await send({"ok": True, "status": self.daemon.status()})
        elif cmd == "flush":
            path = str(request.get("path", "")).strip("/")
            level = request.get("level", "durable")
            if level not in FLUSH_LEVELS:
                await send({"ok": False, "error": f"flush: unknown level {level!r}: give durable (in the bucket) or replicated (on peers' disks too)"})
                return
            if not self.daemon.exists(path):
                await send({"ok": False, "error": f"{path or '/'}: no such file or directory in the mount"})
                return
            if level == "replicated":
                await self._flush_replicated(path, send)
                return
            while True:
                progress = self.daemon.flush_progress(path)
                if not (progress["files"] or progress["bytes"] or progress["deletes"]):
                    await send({"ok": True, "done": True})
                    return
                await send({"ok": True, **progress})
                await trio.sleep(PROGRESS_INTERVAL)
        elif cmd == "warmup":
            paths = [str(p).strip("/") for p in request["paths"]]

            async def progress(p: dict[str, Any]) -> None:
                await send({"ok": True, **p})

            failed = await self.daemon.warmup(paths, progress)
            await send({"ok": True, "done": True, "failed": failed})
        elif cmd == "evict":
            path = str(request.get("path", "")).strip("/")
            if not self.daemon.exists(path):
                await send({"ok": False, "error": f"{path or '/'}: no such file or directory in the mount"})
                return
            await send({"ok": True, **self.daemon.evict(path)})
        elif (cmd == "replicate_status" or (cmd in ("verify", "drill") and request.get("target")
                                             and not (cmd == "verify" and request.get("target") == self.daemon.cfg.tier_move_target))
              or (cmd == "drill_done" and self.daemon.replicator.owns_drill(request.get("id")))):
            await self.daemon.replicator.handle(request, send)
        elif cmd in LIFECYCLE_COMMANDS and self.daemon.cfg.read_only and cmd in ("checkpoint_commit", "protect", "unprotect"):
            await send({"ok": False, "error": f"{cmd}: this mount is read-only (read_only = true): run it on a mount that may change the bucket"})
        elif cmd in LIFECYCLE_COMMANDS:
            await self.daemon.lifecycle.handle(request, send)
        elif cmd == "remove_node":
            peers = getattr(self.daemon, "peers", None)  # peers.service.Peers
            if peers is None:
                await send({"ok": False, "error": "remove-node: this mount has durability = local and keeps no node records: run it "
                                                  "on a mount with durability = peer"})
                return
            await send(await peers.remove_node(str(request.get("node", "")), bool(request.get("force"))))
        elif cmd == "inject_fault" and self.daemon.supervisor.faults:  # tests only (CKPTFS_TEST_FAULTS)
            self.daemon.inject_fault(str(request.get("service")))
            await send({"ok": True})
        elif cmd == "unmount":
            writers = self.daemon.open_for_writing()
            if writers and not request.get("force"):
                await send({"ok": False, "open_for_writing": writers, "error": open_for_writing_message(writers)})
                return
            await send({"ok": True, "pid": os.getpid()})
            self.daemon.request_stop(bool(request.get("flush")))
            left = await self.daemon.stopped()
            try:
                await send({"ok": True, "done": True, **left})
            finally:
                self.daemon.stop_reported()
        else:
            await send({"ok": False, "error": f"unknown command {cmd!r}"})


    async def _flush_replicated(self, path: str, send: Callable[[Any], Awaitable[None]]) -> None:
        """Progress lines until everything under `path` is durable or replicated. The wait is the peers' (it may
        send what they lack); the client ends it by going away (its timeout): then the wait is cancelled."""
        peers = getattr(self.daemon, "peers", None)  # peers.service.Peers
        if peers is None:
            await send({"ok": False, "error": "level replicated needs durability = peer, and this mount has durability = local "
                                              "(no peer holds copies): wait for level durable, or mount with durability = peer (docs/peers.md)"})
            return
        done = trio.Event()
        failed: list[str] = []
        client_gone = False

        async def wait() -> None:
            try:
                await peers.wait_replicated_under(path)
            except OSError as e:  # on_no_peer = fail and no peer answers
                failed.append(f"{path or '/'}: not replicated: {e.strerror or e}")
            except Exception as e:  # noqa: BLE001 - as any handler's bug: one line, the server goes on
                log.exception("waiting for replicas failed unexpectedly")
                failed.append(f"internal error: {type(e).__name__}: {e} (see the daemon's log)".splitlines()[0])
            finally:
                done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait)
            try:
                while not done.is_set():
                    files, size = peers.unreplicated_under(path)  # neither durable nor on peer_replicas peers' disks
                    await send({"ok": True, "files": files, "bytes": size, "deletes": 0})
                    with trio.move_on_after(PROGRESS_INTERVAL):
                        await done.wait()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                client_gone = True
                nursery.cancel_scope.cancel()
        if client_gone:
            return
        await send({"ok": False, "error": failed[0]} if failed else {"ok": True, "done": True})


async def _answer(stream: trio.SocketStream, error: str) -> None:
    """Send one error line, if the client still listens."""
    try:
        await stream.send_all(json.dumps({"ok": False, "error": error}).encode() + b"\n")
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


def open_for_writing_message(paths: list[str]) -> str:
    shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
    n = len(paths)
    return (f"{n} file{'s are' if n != 1 else ' is'} open for writing: {shown}: close {'them' if n != 1 else 'it'} first, "
            "or unmount --force (the writers then get errors; what they wrote so far stays in the journal)")


async def _read_line(stream: trio.SocketStream, limit: int = 65536) -> bytes | None:
    buf = b""
    while b"\n" not in buf:
        chunk = await stream.receive_some(4096)
        if not chunk:
            return buf or None
        buf += chunk
        if len(buf) > limit:
            raise ValueError("request too long")
    return buf.split(b"\n", 1)[0]
