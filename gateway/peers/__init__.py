"""Peer durability (docs/peers.md): a file's acknowledged bytes on other nodes until the bucket has them.

One module per concern: `membership` (node records in the bucket, the lease that fences a paused
node, which peers hold whose replicas), `wire` (frames and the challenge-response handshake),
`listener` and `replicas` (the receiving side: other nodes' replicas on this node's disk),
`link` and `sender` (the owning side: bytes streamed to peers as they are written; fsync and
close wait for them), `takeover` (a dead node's replicas uploaded as it would have), `service`
(wires them under the daemon's supervisor). Beside the drain, over the namespace and the store.
"""
