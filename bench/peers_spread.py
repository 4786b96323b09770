"""How replicas spread over unequal failure domains (issue 44): the product's own choice of holders for every owner
of a cluster whose racks differ in size, with and without the load bound (gateway/peers/spread.py).

    python -m bench.peers_spread [--racks 10,10,2] [--replicas 1] [--seeds 20] [--json out.json]

Each node is an owner (every node writes, as in data-parallel training); in a random order (drawn per seed, as
owners start), each goes down its own rendezvous order over the live nodes of other domains (records.rendezvous,
records.other_domain) and asks each candidate, which answers as the listener does (`spread.redirect`: taken, or
sent on once it takes its share of owners); an owner every candidate sends on asks the best one again, insisting.
It reports, over the seeds, the most owners any node takes against the mean (R): what the issue's target bounds
("the most replica bytes any node holds <= 2 x the mean", owners writing alike), and what rendezvous alone gives.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from typing import Any

from ckptfs.peers.records import other_domain, rendezvous
from ckptfs.peers.spread import owner_cap, redirect


def assign(racks: list[int], replicas: int, seed: int, bounded: bool) -> dict[str, list[str]]:
    """holder -> the owners whose replicas it takes."""
    domain = {f"r{r}n{i}": f"rack{r}" for r, size in enumerate(racks) for i in range(size)}
    owners = list(domain)
    random.Random(seed).shuffle(owners)
    taken: dict[str, list[str]] = {n: [] for n in domain}
    for owner in owners:
        order = [n for n in rendezvous(owner, domain) if other_domain(domain[owner], domain[n])]
        chosen: list[str] = []
        for insist in (False, True):
            for holder in order:
                if len(chosen) == replicas:
                    break
                if holder in chosen:
                    continue
                why = redirect(owner, taken[holder], (), replicas, insist, understood=bounded)
                if why is None:
                    chosen.append(holder)
                    taken[holder].append(owner)
        if len(chosen) < replicas and not order:
            continue  # a cluster of one domain: nobody to send to
    return taken


def spread(racks: list[int], replicas: int, seeds: int, bounded: bool) -> dict[str, Any]:
    ratios = []
    for seed in range(seeds):
        taken = assign(racks, replicas, seed, bounded)
        loads = [len(v) for v in taken.values()]
        ratios.append(max(loads) / statistics.mean(loads))
    return {"max_over_mean_worst": round(max(ratios), 2), "max_over_mean_median": round(statistics.median(ratios), 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.peers_spread", description=__doc__.split("\n\n")[0])
    ap.add_argument("--racks", default="10,10,2", help="nodes per failure domain, comma-separated")
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--json", help="write the report here too")
    a = ap.parse_args(argv)
    racks = [int(x) for x in a.racks.split(",") if x]
    report = {"racks": racks, "replicas": a.replicas, "cap": owner_cap(a.replicas), "seeds": a.seeds,
              "rendezvous_alone": spread(racks, a.replicas, a.seeds, bounded=False),
              "bounded": spread(racks, a.replicas, a.seeds, bounded=True)}
    print(json.dumps(report, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
