"""Checkpoint lifecycle: checkpoints, manifests, the catalogue, verify, protection, the audit log.

The lifecycle lives in the bucket, so every node mounting it sees the same:

* `patterns`  which directories and files are checkpoints, and their steps (`checkpoint_patterns`)
* `manifest`  the manifest object written into a committed checkpoint, conditionally
* `place`     where a checkpoint's files and own objects are (inside a directory, or siblings of a file)
* `tracker`   notices checkpoints written here becoming durable and quiet, and commits them
* `catalogue` finds checkpoints in the bucket and says what state each is in
* `verify`    shallow (listing) and deep (read back, xxh3-128) checks against the manifest
* `protect`   golden checkpoints: the guard fs.py calls, legal holds on Object Lock buckets
* `audit`     one object per protect/unprotect event under `.ckptfs/audit/`
* `retention` keep rules (a pure plan), two-phase deletion (expiring, then deleted), the schedule
* `drill`     recovery drills: restore from the bucket into a fresh directory, verify deep, record the outcome
* `lease`     one node at a time: a lease object under `.ckptfs/leases/`, taken and renewed with conditional writes

It talks to the bucket only through `storeapi.LifecycleStore` (`store.Store`, in worker threads), and to
the mount's state through the namespace. `service.Lifecycle` holds them together for the daemon. See docs/lifecycle.md.
"""
