"""The catalogue page: a read-only web view of the runs, checkpoints and files under a mount (docs/ui.md).

`view` turns the daemon's `catalogue` answer into what a page shows (pure), `snapshot` keeps
the last answer and refreshes it when a page finds it old, `app` is the ASGI application
(GET only, a token where one is set), `serve` runs it under hypercorn in the caller's trio
nursery. It reads everything through one `ask` callable: the control socket for `ckptfs ui`,
the control dispatch itself in the daemon (`ui_enabled`), so it never holds the bucket's
credentials and can only ask the read-only commands in `snapshot.READ_COMMANDS`.
"""
