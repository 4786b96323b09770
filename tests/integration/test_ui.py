"""The catalogue page in a real browser (Debian's chromium, headless, through chromium-driver) against a
real mount whose checkpoints the test writes: served by `ckptfs ui` and by the daemon (`ui_enabled`).
One browser for the module. The screenshot is a test artifact: its path is printed (pytest -s)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.conftest import CKPTFS, Mount, wait_for
from tests.integration.test_lifecycle import dcp_save
from tests.support.seaweed import free_port
from tests.support.extras import need

pytestmark = pytest.mark.one_transport  # the page reads the control socket: the FUSE transport changes nothing

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
TOKEN = "catalogue-token-0123456789"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    webdriver = need("selenium.webdriver", "test")
    from selenium.webdriver.chrome.service import Service

    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        pytest.skip("Debian's chromium and chromium-driver are not installed (make test-deps installs them)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)  # a given driver: nothing is downloaded
    driver.implicitly_wait(20)
    try:
        yield driver
    finally:
        driver.quit()


def http(url: str, method: str = "GET", headers: dict[str, str] | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, method=method, headers=headers or {}, data=b"{}" if method in ("POST", "PUT") else None)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def start_ui(m: Mount, *args: str) -> tuple[subprocess.Popen[str], str]:
    """`ckptfs ui` on the mount; its address once it says it serves."""
    proc = subprocess.Popen([*CKPTFS, "ui", str(m.path), *args], stderr=subprocess.PIPE, text=True, env=m.env)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert "serving the catalogue" in line, line + (proc.stderr.read() if proc.poll() is not None else "")
    return proc, line.split(" at ", 1)[1].split("/", 3)[2]


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.wait(timeout=30)


def written(m: Mount) -> None:
    """run1: step_1 committed with metadata and protected, step_2 committed, step_3 still being written."""
    for step in (1, 2):
        dcp_save(m.path / "run1" / f"step_{step}", ranks=2, size=1000 * step)
    meta = ["--meta", "lr=0.0003", "--meta", "git_commit=4f2a9c1", "--meta", "dataset=s3://data/v3"]
    assert m.cli("checkpoint", "commit", str(m.path / "run1/step_1"), *meta).returncode == 0
    assert m.cli("checkpoint", "commit", str(m.path / "run1/step_2")).returncode == 0
    assert m.cli("protect", str(m.path / "run1/step_1"), "--reason", "the paper's model").returncode == 0
    (m.path / "run1/step_3").mkdir()
    (m.path / "run1/step_3/__0_0.distcp").write_bytes(b"x" * 100)
    m.flush()


def test_the_page_lists_filters_and_shows_a_checkpoint_and_only_reads(make_mount, browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    m: Mount = make_mount(start=False, ui_enabled="true", retention_keep_last=1)
    m.metrics_port = free_port()
    m.start()
    written(m)
    proc, addr = start_ui(m, "--addr", "127.0.0.1:0")
    try:
        browser.get(f"http://{addr}/")
        browser.find_element(By.LINK_TEXT, "run1").click()
        states = {r.get_attribute("data-path"): r.get_attribute("data-state")
                  for r in browser.find_elements(By.CSS_SELECTOR, "#checkpoints tbody tr")}
        assert states == {"run1/step_1": "protected", "run1/step_2": "committed", "run1/step_3": "writing"}
        verdicts = {r.get_attribute("data-path"): r.find_elements(By.TAG_NAME, "td")[-1].text
                    for r in browser.find_elements(By.CSS_SELECTOR, "#checkpoints tbody tr")}
        assert verdicts["run1/step_2"] == "kept by last 1"  # retention_keep_last = 1: `ckptfs retention plan`'s word
        browser.set_window_size(1100, 560)
        assert browser.save_screenshot(str(tmp_path / "catalogue-run.png"))  # docs/ui.png is one of these
        browser.set_window_size(1280, 900)
        Select(browser.find_element(By.ID, "f-state")).select_by_visible_text("protected")
        browser.find_element(By.ID, "f-apply").click()
        wait_for("the filter", lambda: "state=protected" in browser.current_url, timeout=30)
        rows = browser.find_elements(By.CSS_SELECTOR, "#checkpoints tbody tr")
        assert [r.get_attribute("data-path") for r in rows] == ["run1/step_1"]
        browser.find_element(By.LINK_TEXT, "run1/step_1").click()
        meta = {tr.find_elements(By.TAG_NAME, "td")[0].text: tr.find_elements(By.TAG_NAME, "td")[1].text
                for tr in browser.find_elements(By.CSS_SELECTOR, "#metadata tbody tr")}
        assert meta == {"lr": "0.0003", "git_commit": "4f2a9c1", "dataset": "s3://data/v3"}
        assert browser.find_element(By.ID, "state").text == "protected"
        commands = browser.find_element(By.ID, "commands").text
        assert f"ckptfs warmup {m.path}/run1/step_1" in commands and f"ckptfs drill {m.path}/run1/step_1" in commands
        assert "protect by" in browser.find_element(By.ID, "history").text
        assert "__0_0.distcp" in browser.find_element(By.ID, "files").text
        shot = tmp_path / "catalogue-page.png"
        browser.set_window_size(1100, 1000)
        assert browser.save_screenshot(str(shot))
        print(f"\ncatalogue page screenshots: {shot}, {tmp_path / 'catalogue-run.png'}", file=sys.stderr)
        assert m.s3.secret_key not in browser.page_source

        # read-only: every method but GET and HEAD is refused, on the command's page and on the daemon's
        daemon = f"127.0.0.1:{m.metrics_port}"
        for base in (f"http://{addr}/run?run=run1", f"http://{daemon}/ui/run?run=run1"):
            for method in ("POST", "PUT", "DELETE"):
                assert http(base, method)[0] == 405, (base, method)
        # the daemon serves the same catalogue under /ui, and its metrics as before
        browser.get(f"http://{daemon}/ui/run?run=run1")
        assert {r.get_attribute("data-path") for r in browser.find_elements(By.CSS_SELECTOR, "#checkpoints tbody tr")} == {
            "run1/step_1", "run1/step_2", "run1/step_3"}
        status, text = http(f"http://{daemon}/metrics")
        assert status == 200 and "ckptfs_checkpoints" in text
    finally:
        stop(proc)


def test_beyond_loopback_a_token_is_required(make_mount, browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By

    m: Mount = make_mount()
    refused = m.cli("ui", str(m.path), "--addr", "0.0.0.0:0")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "not a loopback address" in refused.stderr and "--token-file" in refused.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = m.cli("ui", str(m.path), "--addr", f"127.0.0.1:{busy.getsockname()[1]}")
    assert taken.returncode == 2 and taken.stderr.count("\n") == 1 and "cannot listen on" in taken.stderr, taken.stderr
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    dcp_save(m.path / "run2/step_7", ranks=1, size=100)
    proc, addr = start_ui(m, "--addr", "0.0.0.0:0", "--token-file", str(token_file))
    try:
        port = addr.rsplit(":", 1)[1]
        assert http(f"http://127.0.0.1:{port}/")[0] == 401
        assert http(f"http://127.0.0.1:{port}/", headers={"Authorization": f"Bearer {TOKEN}"})[0] == 200
        browser.get(f"http://127.0.0.1:{port}/run?run=run2&token={TOKEN}")  # sets the cookie, then drops it from the address
        assert "token" not in browser.current_url
        assert browser.find_element(By.CSS_SELECTOR, "#checkpoints tbody tr").get_attribute("data-path") == "run2/step_7"
        assert TOKEN not in browser.page_source
    finally:
        stop(proc)
    # the daemon: ui_enabled on an address beyond loopback without ui_token_file does not start, in one line
    other = make_mount("other", start=False, ui_enabled="true", metrics_addr=f"0.0.0.0:{free_port()}")
    failed = other.cli(*other.mount_args())
    assert failed.returncode != 0 and "not a loopback address" in failed.stderr and "Traceback" not in failed.stderr
    assert not os.path.ismount(other.path)
    # nor on a port another process holds
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        other.options["metrics_addr"] = f"127.0.0.1:{busy.getsockname()[1]}"
        failed = other.cli(*other.mount_args())
    assert failed.returncode != 0 and "cannot listen for metrics" in failed.stderr and "Traceback" not in failed.stderr
    assert not os.path.ismount(other.path)
