"""`python -m bench.profile FILE...`: summarise py-spy's collapsed stacks (`--format raw`).

Prints, per file, the samples per thread and the functions with the most
samples on top of the stack (self) and anywhere in it (inclusive), which is
what docs/benchmarks.md quotes as evidence. py-spy leaves idle samples out, so
the shares are of the time the daemon was busy.
"""

from __future__ import annotations

import collections
import re
import sys
from pathlib import Path

# a thread whose top frame is one of these is waiting (for the network, the kernel's FUSE queue, a lock)
_WAITING = re.compile(r"^(PyThread_acquire_lock_timed|poll|epoll_wait|select|futex|__futex_abstimed_wait_common|pthread_cond_(timed)?wait|sem_(timed)?wait|recv|recvfrom|accept4?|nanosleep|clock_nanosleep) ")
_LOC = re.compile(r" \((?:[^()]*/)?([^/()]+:\d+)\)$")


def _short(frame: str) -> str:
    """'send (http/client.py:1003)' -> 'send (client.py:1003)'; native frames stay as they are."""
    return _LOC.sub(r" (\1)", frame)


def summarise(path: Path, top: int = 15) -> str:
    threads: collections.Counter[str] = collections.Counter()
    self_: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    busy_self: collections.Counter[str] = collections.Counter()
    busy_incl: collections.Counter[str] = collections.Counter()
    total = busy = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        total += n
        threads[re.sub(r"\s*\(.*", "", frames[0])] += n
        fr = [_short(f) for f in frames[1:]]
        if fr:
            self_[fr[-1]] += n
        for f in set(fr):
            incl[f] += n
        if fr and not any(_WAITING.match(f) for f in fr[-3:]):
            busy += n
            busy_self[fr[-1]] += n
            for f in set(fr):
                busy_incl[f] += n
    if not total:
        return f"{path.name}: no samples\n"
    lines = [f"## {path.name}: {total} samples", "", "threads: " + ", ".join(f"{t} {100 * n / total:.0f}%" for t, n in threads.most_common(6)), ""]
    lines += ["self (top of stack):"] + [f"  {100 * n / total:5.1f}%  {f}" for f, n in self_.most_common(top)]
    lines += ["", "inclusive:"] + [f"  {100 * n / total:5.1f}%  {f}" for f, n in incl.most_common(top)]
    lines += ["", f"busy (not waiting): {100 * busy / total:.0f}% of samples; of those, self:"]
    lines += [f"  {100 * n / max(busy, 1):5.1f}%  {f}" for f, n in busy_self.most_common(top)]
    lines += ["", "busy, inclusive (Python frames):"]
    lines += [f"  {100 * n / max(busy, 1):5.1f}%  {f}" for f, n in busy_incl.most_common(80) if ".py:" in f][:top]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(summarise(Path(arg)))
