"""Replication: committed checkpoints copied to other stores, checked against their manifests (docs/replication.md).

* `copy`     one checkpoint to one target: files (server-side or streamed), checked, the manifest last
* `service`  the replicator: surveys, the `replication` lease, status, verify on a target, metrics

Targets are `[replica.NAME]` tables in the config (config.Replica); each is a
second `store.Store`.
"""
