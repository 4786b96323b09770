"""The fault campaign for peers (issue 42): 3 real daemons of one bucket on one SeaweedFS, a trainer's writes on
one of them (tmp + fsync + rename of files and directories, overwrites, old mtimes, deletes, DCP's layout), and in
each episode a fault on one role, owner, holder of its replicas, or taker of its files: SIGKILL with and without the
cache, a silent death, a pause past the lease, a restart with the same name and an empty cache, a cut from the
store. The checker (tests/support/peers_campaign.py) then requires every acknowledged version in the bucket under
its final name, nothing older, no temporary or removed name left, no marker or manifest over a missing or stale
file, every completed checkpoint committed; only a loss of the owner and its replicas' holder together may lose
what the bucket lacked then, and it is counted.

`-k campaign` selects it (with the drain's). CKPTFS_CAMPAIGN_EPISODES (default 6: the CI size, every role twice),
CKPTFS_CAMPAIGN_SEED (default CI_SEED, a schedule that passed; `random`: a new one, printed), CKPTFS_CAMPAIGN_MEMBERSHIP
(`etcd`: the node records in a real etcd, peer_membership = etcd),
CKPTFS_CAMPAIGN_EPISODE (one episode of the seed alone, to
rerun a failure, or a range of them: "90-110"), CKPTFS_CAMPAIGN_NODES (3 or 4), CKPTFS_CAMPAIGN_OPS (the writer's operations per episode, 8),
CKPTFS_CAMPAIGN_DISABLE / CKPTFS_CAMPAIGN_FAULTS (which faults, operations and checks: the tables at the top of
the support module, each with the case of the issue it is known to meet), CKPTFS_CAMPAIGN_REPORT (a file to
write the report's JSON to). The report is printed (-s) in words and as one JSON line `peers campaign report:`.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path
import pytest

from tests.conftest import fuse_usable
from tests.support.peer_nodes import Cluster
from tests.support.peers_campaign import FAULTS, Campaign, Report
from tests.support.seaweed import SeaweedServer

EPISODES = int(os.environ.get("CKPTFS_CAMPAIGN_EPISODES", "6"))
# the protocol under test is behind either transport; an episode takes 20-60 s here when all holds, up to
# SETTLE_TIMEOUT more when it finds a violation: the suite's 600 s per test would cut a failing run short
pytestmark = [pytest.mark.one_transport, pytest.mark.timeout(300 + 300 * EPISODES)]


# `make test`'s schedule: one that passed on the tree that landed, so a red CI run means a regression. Random seeds
# (CKPTFS_CAMPAIGN_SEED=random, or a number) are for finding what is still open: seed 9 with 12 episodes finds a
# taker lost after its takeover was done but before its tracker committed the owner's checkpoints (issue 42's note)
CI_SEED = 10


def test_peers_fault_campaign(s3: SeaweedServer, bucket: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if not fuse_usable():
        pytest.skip("/dev/fuse is not usable here")
    asked = os.environ.get("CKPTFS_CAMPAIGN_SEED", "")
    seed = random.SystemRandom().randrange(1 << 31) if asked == "random" else int(asked or CI_SEED)
    membership: dict[str, str] = {}
    if os.environ.get("CKPTFS_CAMPAIGN_MEMBERSHIP", "bucket") == "etcd":  # the node records in a real etcd
        etcd = request.getfixturevalue("etcd")
        membership = {"peer_membership": "etcd", "etcd_endpoints": etcd.endpoint, "etcd_prefix": f"/campaign-{seed}/"}
    cluster = Cluster(s3, bucket, tmp_path, **membership)
    campaign = Campaign(cluster, seed, nodes=int(os.environ.get("CKPTFS_CAMPAIGN_NODES", "3")),
                        ops=int(os.environ.get("CKPTFS_CAMPAIGN_OPS", "8")))
    try:
        run(campaign, seed)
    finally:
        cluster.stop()
        # the cache disks go with close(): their daemons' logs stay for a rerun (CKPTFS_CAMPAIGN_LOGS: a directory that
        # outlives pytest's, which keeps only its last three runs' temporary directories)
        keep_logs(cluster, Path(os.environ.get("CKPTFS_CAMPAIGN_LOGS") or tmp_path / "logs"))
        campaign.cc.close()


def keep_logs(cluster: Cluster, into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    for n in cluster.nodes.values():
        log = n.cache_dir / "ckptfs.log"
        if log.exists():
            shutil.copyfile(log, into / f"{n.name}.log")
    lost = cluster.root / "lost-logs"  # the logs of nodes lost with their cache (peers_campaign.keep_lost_log)
    for log in sorted(lost.iterdir()) if lost.is_dir() else []:
        shutil.copyfile(log, into / f"lost-{log.name}")
    print(f"peers campaign: the daemons' logs are in {into}")


def run(campaign: Campaign, seed: int) -> None:
    episodes = EPISODES
    one = os.environ.get("CKPTFS_CAMPAIGN_EPISODE")
    report = Report(seed)
    started = time.monotonic()
    print(f"\npeers campaign: seed {seed} (CKPTFS_CAMPAIGN_SEED={seed} to rerun), faults {campaign.faults}")
    first, _, last = (one or "").partition("-")  # one episode, or a range "90-110" of the seed's
    for index in (range(int(first), int(last or first) + 1) if one else range(episodes)):
        r = campaign.episode(index)
        report.add(r)
        print(f"  episode {r.seed}: {r.fault} owner {r.owner} target {r.target}: {r.ops} ops, {r.files} files, "
              f"{len(r.violations)} violations, {len(r.allowed)} allowed losses, {r.seconds:.0f}s"
              + "".join(f"\n    case {f.case}: {f.what} {f.name}: {f.detail}" for f in r.violations)
              + "".join(f"\n    allowed: {f.what} {f.name}: {f.detail}" for f in r.allowed)
              + "".join(f"\n    note: {n}" for n in r.notes), flush=True)
    report.seconds = time.monotonic() - started
    doc = report.as_dict()
    print("peers campaign report: " + json.dumps(doc, sort_keys=True))
    if os.environ.get("CKPTFS_CAMPAIGN_REPORT"):
        Path(os.environ["CKPTFS_CAMPAIGN_REPORT"]).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    # a campaign that exercised nothing proves nothing: operations acknowledged, files checked, every role faulted
    assert report.operations > 0 and report.files_checked > 0, doc
    roles = {k.split(":")[0] for k in campaign.faults}
    if not one and episodes >= len(roles):
        assert set(report.faults_per_role) == roles, doc
    assert report.violations == 0, (
        f"{report.violations} violations (seed {seed}; by case of issue 42: {dict(report.violations_by_case)}); "
        f"rerun one with CKPTFS_CAMPAIGN_SEED={seed} CKPTFS_CAMPAIGN_EPISODE=<n>:\n"
        + "\n".join(f"{s}: {line}" for s, lines in report.failing.items() for line in lines)
        + f"\nknown cases per fault kind: { {k: v for k, v in FAULTS.items() if v} }")
