"""The benchmark harness at tiny sizes, so it does not rot between recorded runs.

No timing is asserted here (speed belongs to `make bench`): only that one run
produces results JSON with every figure and the fields the report reads, each
figure measured (> 0 where a measurement cannot be zero), and that peers whose
tools are absent are skipped rather than failing the run; a skip is accepted
only where this environment confirms its reason (the tool is not installed
here, and not where CKPTFS_REQUIRE_EXTRAS=1 says its pip extra is).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import report
from bench.env import venv_bin
from tests.conftest import NFS_GROUP, ROOT, fuse_usable
from tests.support.extras import required
from tests.support.ganesha import missing_tools

MiB = 1 << 20


@pytest.mark.integration
@NFS_GROUP  # its NFS workload runs Ganesha: one at a time on this host (tests/conftest.py)
def test_bench_quick_run_writes_every_figure(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if not fuse_usable():
        pytest.skip("/dev/fuse is not usable here")
    # the bench's cache directories hold control sockets, whose path may be 107 bytes at most: a pytest-xdist
    # worker's tmp_path (.../popen-gw1/test_bench_quick_run_writes_every_figure0/work/...) is too long for them
    work = Path(tempfile.mkdtemp(prefix="ckptfs-bench-"))
    request.addfinalizer(lambda: shutil.rmtree(work, ignore_errors=True))
    out = tmp_path / "results.json"
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nHand-written analysis stays.\n")
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--scale", "0.001", "--runs", "1", "--out", str(out),
         "--doc", str(doc), "--work", str(work)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())

    assert result["meta"]["sizes"] == {"single": 4 * MiB, "shard": MiB, "shards": 8, "sharded": 8 * MiB, "chunk": 4 * MiB}
    assert result["meta"]["runs"] == 1
    (run,) = result["runs"]
    assert set(run["raw"]) == {"single", "sharded"}, run["raw"]
    ckptfs = run["ckptfs"]
    assert "error" not in ckptfs, ckptfs
    assert {"ack_s", "rename_s", "rename_received_bytes", "received_bytes", "copy_requests",
            "durable_from_close_s", "durable_from_start_s"} <= set(ckptfs["single"])
    assert {"ack_s", "durable_from_close_s", "durable_from_start_s"} <= set(ckptfs["sharded"])
    assert ckptfs["daemon"]["peak_rss_bytes"] > 0
    # the store's own counter saw the file's bytes, once, and no server-side copy
    assert ckptfs["single"]["received_bytes"] == 4 * MiB
    assert ckptfs["single"]["copy_requests"] == 0
    assert run["boto3"]["single"]["upload_s"] > 0, run["boto3"]
    if ran(run["s5cmd"], "s5cmd", "bench"):
        assert run["s5cmd"]["single"]["upload_s"] > 0 and run["s5cmd"]["sharded"]["upload_s"] > 0, run["s5cmd"]
    for peer, extra in (("rclone", "bench"), ("s3fs", None)):  # s3fs comes from apt (make test-deps)
        if ran(run[peer], peer, extra):
            assert run[peer]["single"]["ack_s"] > 0 and run[peer]["sharded"]["ack_s"] > 0, run[peer]
    # a fresh mount read the whole object back from the bucket, under each transport
    mount = run["cold_read"]["mount"]
    assert "read_s" in mount, mount
    assert "read_s" in run["cold_read"]["mount_libfuse"], run["cold_read"]
    assert run["cold_read"]["direct_s"] > 0
    # ckptfs under each FUSE transport: what the daemon reported, and what reached it
    for part in ("ckptfs", "ckptfs_copy", "ckptfs_libfuse"):
        assert "error" not in run[part], run[part]
        assert run[part]["single"]["ack_s"] > 0 and run[part]["sharded"]["ack_s"] > 0
        daemon = run[part]["daemon"]
        assert isinstance(daemon["cpu_ack_single_s"], float) and daemon["cpu_ack_single_s"] >= 0, daemon  # ticks: may be 0
        if part != "ckptfs" or not run[part]["transport"]["passthrough"]:  # the daemon copied every byte written itself
            assert daemon["cpu_write_s"] > 0, daemon
        cached = run[part]["cached_read"]
        assert cached["warm_resident"] == {"raw": 1.0, "cache_file": 1.0}, cached  # same page cache state for both
        assert cached["warm"]["mount_s"] > 0 and cached["warm"]["raw_s"] > 0
    cached = ckptfs["cached_read"]  # the default mount's also cold: neither file's pages resident
    assert cached["cold_resident"] == {"raw": 0.0, "cache_file": 0.0}, cached
    assert cached["cold"]["mount_s"] > 0 and cached["cold"]["raw_s"] > 0
    copy, libfuse = run["ckptfs_copy"]["transport"], run["ckptfs_libfuse"]["transport"]
    assert (copy["fuse_transport"], copy["passthrough"], libfuse["fuse_transport"]) == ("kernel", False, "libfuse")
    for t, part in ((copy, "ckptfs_copy"), (libfuse, "ckptfs_libfuse")):  # copy mode: the daemon saw every write and read
        assert t["ack_requests"]["single"]["write"] >= 1 and run[part]["cached_read"]["warm"]["daemon_reads"] >= 1
    pt = ckptfs["transport"]
    if pt["passthrough"]:  # root on Linux >= 6.9: the kernel wrote and read the cache files itself
        assert pt["ack_requests"]["single"]["write"] == pt["ack_requests"]["sharded"]["write"] == 0, pt
        assert ckptfs["cached_read"]["warm"]["daemon_reads"] == 0

    # the daemon's copy to a second server, and s5cmd's of the same objects, both ways
    repl = run["replication"]
    assert "error" not in repl, repl
    assert repl["copied_bytes"] == repl["bytes"] == 4 * MiB and repl["server_side_objects"] == 0
    assert repl["replicate_s"] > 0 and repl["rss_peak_bytes"] > 0 and repl["rss_samples"] > 0
    if ran(repl["s5cmd"], "s5cmd", "bench"):
        assert repl["s5cmd"]["pipe_s"] > 0 and repl["s5cmd"]["via_disk_s"] > 0, repl["s5cmd"]

    # the cold tier's codec on a model trained for the run, and the daemon's move and restore with and without it
    cz = run["compression"]
    assert "error" not in cz, cz
    assert all(0 < e["ours"] < e["size"] and e["encode_cpu_s"] > 0 for e in cz["files"].values()), cz["files"]
    assert cz["daemon_auto"]["stored_bytes"] < cz["daemon_auto"]["original_bytes"] == cz["daemon_none"]["stored_bytes"]
    assert cz["daemon_auto"]["restore_s"] > 0 and cz["daemon_none"]["restore_s"] > 0

    # a checkpoint staged in step_1.tmp/ and renamed: each byte sent once, no temporary key listed
    td = run["temporary_dir"]["ckptfs"]
    assert "error" not in td, td
    assert td["sent_bytes"] == td["bytes"] == 3 * MiB and td["temporary_keys_seen"] == 0 and td["listings"] > 0, td

    # the drain alone, its bytes signed and not: every round drained the file (bench/drain_cpu.py)
    dc = run["drain_cpu"]
    assert dc["size"] == 4 * MiB and set(dc["rounds"]) == {"signed", "unsigned"}, dc
    assert all(r["drain_s"] > 0 and r["cpu_per_gib"] >= 0 for rounds in dc["rounds"].values() for r in rounds), dc

    # the NFS gateway: Ganesha into ckptfs and over a plain directory, 1 and 4 nfs-cp clients of 1 MiB
    nfs_tools = not missing_tools()
    if nfs_tools:
        assert_nfs_gateway_result(run["nfs_gateway"], MiB)
    else:
        assert "NFS gateway tools missing" in run["nfs_gateway"]["skipped"]

    # peer durability (bench/peers.py): a local node, a pair, the node-loss trials
    peers = run["peers"]
    assert {"floor", "local", "peer", "trials"} <= set(peers) and "error" not in peers["local"], peers
    # the floor (bench/peerfloor.py) ran: both ratios measured, with and without the hashes
    assert "error" not in peers["floor"], peers["floor"]
    assert all(0 < peers["floor"][p][f"ratio_{c}"] for p in ("single", "writers") for c in ("none", "hashed")), peers["floor"]
    assert peers["local"]["drain"]["flush_s"] > 0

    figures = {f["id"]: f for f in result["figures"]}
    assert set(figures) == {f.id for f in report.FIGURES}
    fids = ["ack_single", "ack_sharded", "rename_ms", "rename_store_ratio", "drain_single", "drain_sharded",
            "rss_peak", "cpu_written", "cpu_drained", "ack_copy_single", "ack_libfuse_single", "ack_libfuse_sharded",
            "cached_read_copy", "cached_read_libfuse", "cold_read", "cold_read_libfuse", "replication_rss",
            "cz_bf16", "cz_training", "cz_vs_zstd3", "cz_compress_gbps", "cz_restore", "small_ack", "tmpdir_sent", "tmpdir_keys",
            "drain_cpu_signed", "drain_cpu_unsigned"]
    if pt["passthrough"]:
        fids += ["ack_passthrough_single", "ack_passthrough_sharded", "cpu_passthrough_ack", "cached_read_passthrough"]
    else:  # never labelled passthrough when it was not
        assert figures["ack_passthrough_single"]["median"] is None
        assert "without passthrough" in figures["ack_passthrough_single"]["why_missing"]
    if nfs_tools:
        fids += ["nfs_write_1", "nfs_write_4", "nfs_cpu_daemon", "nfs_cpu_ganesha", "nfs_cpu_gateway", "nfs_cpu_ganesha_plain",
                 "nfs_daemon_requests", "nfs_loadavg"]
    for fid in fids:
        f = figures[fid]
        assert f["median"] is not None and f["min"] <= f["median"] <= f["max"], f
        assert len(f["values"]) == 1
    for f in figures.values():
        assert f["median"] is not None or f.get("why_missing"), f

    text = doc.read_text()
    assert "Hand-written analysis stays." in text
    assert report.BEGIN in text and report.END in text
    assert "| Acknowledge, 1 file: ckptfs / raw disk throughput |" in text
    assert "- `ckptfs_libfuse` (libfuse): libfuse:" in text


def ran(part: dict[str, Any], tool: str, extra: str | None) -> bool:
    """Whether a workload that needs `tool` ran. One that failed fails the test; one skipped is accepted only for a
    reason this environment confirms: `tool` is not installed here, and its pip extra (if any) is not required."""
    assert "error" not in part, part
    if "skipped" not in part:
        return True
    assert venv_bin(tool) is None, f"{tool} is installed here ({venv_bin(tool)}), yet the workload was skipped: {part['skipped']}"
    assert not (extra and required()), f"{tool} (pip extra `{extra}`) must be installed here (CKPTFS_REQUIRE_EXTRAS=1): {part['skipped']}"
    return False


def assert_nfs_gateway_result(nfs: dict, size: int) -> None:
    """Both exports written by 1 and by 4 clients, every byte the ckptfs export took drained after the window."""
    assert {"plain", "ckptfs"} <= set(nfs) and nfs["size"] == size and nfs["clients"] == [1, 4], nfs
    for export in ("plain", "ckptfs"):
        assert "error" not in nfs[export], nfs[export]
        for clients in (1, 4):
            part = nfs[export][f"clients_{clients}"]
            assert part["bytes"] == clients * size and part["write_s"] > 0 and part["cpu_ganesha_s"] >= 0, part
            assert len(part["loadavg_before"]) == len(part["loadavg_after"]) == 3
    assert all(nfs["ckptfs"][f"clients_{c}"]["cpu_daemon_s"] >= 0 for c in (1, 4))
    assert "cpu_daemon_s" not in nfs["plain"]["clients_1"]  # no daemon behind a plain directory
    assert nfs["ckptfs"]["fuse_requests"].get("create") == 5, nfs["ckptfs"]["fuse_requests"]  # one per client file
    drain = nfs["ckptfs"]["drain"]
    assert drain["bytes"] == 5 * size and drain["uploaded_bytes"] == 5 * size and drain["flush_s"] > 0, drain


@pytest.mark.integration
@NFS_GROUP
def test_nfs_gateway_bench_alone_at_one_mib(tmp_path: Path) -> None:
    """`python -m bench.nfs_gateway`, the NFS workload run by itself, at 1 MiB per client; with `--compare`
    (this checkout again), the third export measured as the second is, and its figures printed apart."""
    if not fuse_usable():
        pytest.skip("/dev/fuse is not usable here")
    missing = missing_tools()
    if missing:
        pytest.skip(f"NFS gateway tools missing: {', '.join(missing)}")
    out = tmp_path / "nfs.json"
    proc = subprocess.run([sys.executable, "-m", "bench.nfs_gateway", "--size-mib", "1", "--out", str(out), "--work", str(tmp_path / "work"),
                           "--compare", str(ROOT)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (nfs,) = json.loads(out.read_text())
    assert_nfs_gateway_result(nfs, MiB)
    assert_nfs_gateway_result({**nfs, "ckptfs": nfs["ckptfs_base"]}, MiB)
    decoder = json.JSONDecoder()
    printed, end = decoder.raw_decode(proc.stdout, proc.stdout.index("{"))
    base, _ = decoder.raw_decode(proc.stdout, proc.stdout.index("{", end))
    for fid in ("nfs_write_1", "nfs_write_4"):  # throughputs: measured, so never 0
        assert isinstance(printed[fid], float) and printed[fid] > 0, printed
        assert isinstance(base[f"{fid} (base)"], float) and base[f"{fid} (base)"] > 0, base
    # CPU seconds per GiB: counted in clock ticks, so 1 MiB per client may honestly cost 0 of them
    assert isinstance(printed["nfs_cpu_gateway"], float) and printed["nfs_cpu_gateway"] >= 0, printed
    assert isinstance(base["nfs_cpu_gateway (base)"], float) and base["nfs_cpu_gateway (base)"] >= 0, base
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").iterdir())  # its scratch is gone


def test_a_figure_is_never_labelled_with_a_transport_it_did_not_measure() -> None:
    meta = {"sizes": {"single": 4 * MiB, "sharded": 8 * MiB}}
    raw = {"single": {"ack_s": 1.0}, "sharded": {"ack_s": 1.0}}
    granted = {"fuse_transport": "kernel", "passthrough": True, "ack_requests": {"single": {"write": 0}, "sharded": {"write": 0}}}
    run = {"raw": raw, "ckptfs": {"single": {"ack_s": 1.0}, "sharded": {"ack_s": 2.0}, "transport": granted},
           "ckptfs_libfuse": {"single": {"ack_s": 2.0}, "sharded": {"ack_s": 2.0}, "transport": {**granted, "passthrough": False}}}
    figures = {f["id"]: f for f in report.summarise([run], meta)}
    assert figures["ack_passthrough_single"]["median"] == 1.0
    assert figures["ack_passthrough_sharded"]["median"] == 0.5
    # the libfuse part reported the kernel transport: its rows stay empty, saying why
    assert figures["ack_libfuse_single"]["median"] is None
    assert "not libfuse" in figures["ack_libfuse_single"]["why_missing"]
    # WRITE requests reached the daemon: not passthrough, whatever INIT said
    run["ckptfs"]["transport"] = {**granted, "ack_requests": {"single": {"write": 3}, "sharded": {"write": 0}}}
    figures = {f["id"]: f for f in report.summarise([run], meta)}
    assert figures["ack_passthrough_single"]["median"] is None
    assert "3 WRITE requests" in figures["ack_passthrough_single"]["why_missing"]
    assert figures["ack_single"]["median"] == 1.0  # the default mount's row stays, whatever its transport


def test_update_doc_replaces_only_the_generated_block(tmp_path: Path) -> None:
    doc = tmp_path / "b.md"
    doc.write_text(f"# B\n\nintro\n\n{report.BEGIN}\nold table\n{report.END}\n\n## Analysis\n\nkept\n")
    report.update_doc(doc, "new table\n")
    text = doc.read_text()
    assert "old table" not in text and "new table" in text
    assert text.startswith("# B\n\nintro") and text.endswith("## Analysis\n\nkept\n")
