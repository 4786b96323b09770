"""The control server answers every request, even one whose handler fails, and keeps serving (gateway/control.py).

A real Unix socket served by `ControlServer`; the daemon behind it is a stand-in whose `status` fails the
first time, as a bug would (the integration tests show the same with a real daemon and a malformed request).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from ckptfs.control import ControlServer
from ckptfs.supervisor import Supervisor


class FlakyDaemon:
    def __init__(self) -> None:
        self.calls = 0
        self.supervisor = Supervisor()

    def status(self) -> dict[str, Any]:
        self.calls += 1
        if self.calls == 1:
            raise ZeroDivisionError("division by zero\nsecond line")
        return {"pid": 1}


async def request(path: Path, raw: bytes) -> list[dict[str, Any]]:
    stream = await trio.open_unix_socket(str(path))
    async with stream:
        await stream.send_all(raw)
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    return [json.loads(line) for line in data.splitlines()]


def test_a_failing_handler_is_answered_with_one_line_and_the_server_keeps_serving(tmp_path: Path) -> None:
    sock = tmp_path / "control.sock"
    daemon = FlakyDaemon()
    server = ControlServer(sock, daemon)  # type: ignore[arg-type]
    answers: list[list[dict[str, Any]]] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            for raw in (b'{"cmd": "status"}\n', b"[1]\n", b'{"cmd": "inject_fault", "service": "drainer"}\n', b'{"cmd": "status"}\n'):
                answers.append(await request(sock, raw))
            answers.append([await server.ask({"cmd": "status"})])
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert answers[0] == [{"ok": False, "error": "internal error: ZeroDivisionError: division by zero"}]
    assert answers[1] == [{"ok": False, "error": "bad request: a request is a JSON object, not list"}]
    assert answers[2] == [{"ok": False, "error": "unknown command 'inject_fault'"}]  # no CKPTFS_TEST_FAULTS: no such command
    assert answers[3] == [{"ok": True, "status": {"pid": 1}}]
    assert answers[4] == [{"ok": True, "status": {"pid": 1}}]
