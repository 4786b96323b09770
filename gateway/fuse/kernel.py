"""The kernel transport: the FUSE protocol spoken directly on /dev/fuse, with passthrough.

Why: with passthrough the kernel does READ and WRITE on the backing (cache) file itself and
the daemon leaves the data path; libfuse 3.14/pyfuse3 cannot ask for it. Where passthrough
is refused, copy mode here still beats pyfuse3: one copy per write (the kernel copies into a
preallocated buffer, the WRITE payload is handed on as a memoryview of it) and many requests
in flight (each request runs in its own trio task, so a slow one does not hold up others).

How:
- `mount()` opens /dev/fuse and mounts it with mount(2); `serve()` answers INIT (asking for
  passthrough when offered), probes FUSE_DEV_IOC_BACKING_OPEN once, then reads requests
  until the kernel says ENODEV (unmounted) or `stop()` unmounts and cancels it. Reads:
  `workers` copy workers (the default, `fuse/workers.py`: threads on cloned descriptors that
  move the bytes of READ and WRITE themselves and hand every other request to a task here),
  or one task on the trio thread waiting on the fd with `trio.lowlevel.wait_readable` ("poll",
  every byte copied on the trio thread); `bench/kernel_transport_probe.py` compares them.
- Every handler error becomes an errno reply: OSError -> its errno, anything else -> EIO
  (logged). The loop itself never dies of a handler.
- INTERRUPT cancels the request's task; the request is answered EINTR.
- A reply the kernel no longer wants (ENOENT: interrupted) is undone where it matters: an
  open's handle is released, a lookup's reference forgotten.
- Notifications are written from a worker thread: the kernel may block them on a directory
  lock held by a request that waits for us.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import struct
import tempfile
from collections import Counter
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import trio

from . import abi
from . import mount as _mount
from .handlers import Parts, RequestHandlers, Undo
from .iomode import IoModes
from .messages import ProtocolError, Request, notify_inval_entry, notify_inval_inode, parse_request, reply, reply_error
from .ops import Operations
from .workers import CopyWorkers, clone, parse_or_eio, send

log = logging.getLogger(__name__)


class Unmounted(Exception):
    """The kernel ended the connection (ENODEV): the file system was unmounted."""


class _Buffers:
    """Preallocated request buffers. A WRITE keeps its buffer until handled (its payload is a
    view into it); every other request gives it back as soon as it is parsed."""

    def __init__(self, size: int, count: int) -> None:
        self.size = size
        self._free: list[bytearray] = []
        self._sem = trio.Semaphore(count)

    async def get(self) -> bytearray:
        await self._sem.acquire()
        return self._free.pop() if self._free else bytearray(self.size)

    def put(self, buf: bytearray) -> None:
        self._free.append(buf)
        self._sem.release()


class KernelSession:
    """One mount served by speaking the FUSE protocol on /dev/fuse (`mount`, `serve`, `stop`,
    `passthrough`: the shape of `session.FuseSession`, shared with `libfuse.LibfuseSession`)."""

    def __init__(
        self,
        ops: Operations,
        mountpoint: str,
        *,
        source: str = "ckptfs",
        fstype: str = "fuse.ckptfs",
        passthrough: bool = True,
        max_stack_depth: int = 1,
        max_pages: int | None = None,
        reader: str = "workers",
        workers: int = 1,
        auto_workers: bool = False,
        max_in_flight: int = 32,
        allow_other: bool = True,
        read_only: bool = False,
        probe_dir: str | None = None,
    ) -> None:
        if reader not in ("poll", "workers"):
            raise ValueError("reader must be 'poll' or 'workers'")
        self.ops = ops
        self.mountpoint = mountpoint
        self.read_only = read_only  # MS_RDONLY: the kernel itself answers EROFS to every change
        self.source = source
        self.fstype = fstype
        self.want_passthrough = passthrough
        self.max_stack_depth = max_stack_depth
        self.max_pages = min(max_pages or 256, _mount.max_pages_limit())
        self.reader = reader
        self.want_workers = workers if reader == "workers" else 1
        self.auto_workers = auto_workers  # fuse_workers = auto: one reader under passthrough
        self.allow_other = allow_other
        self.probe_dir = probe_dir
        # a request is at most max_write + headers; a page more keeps every request whole
        self._buffers = _Buffers(self.max_pages * 4096 + 4096, max_in_flight)
        self.max_in_flight = max_in_flight  # WRITEs handed to tasks with their buffers, copy workers too
        self.fd = -1
        self.clones: list[int] = []  # the copy workers' descriptors besides `fd`
        # request workers, each with its /dev/fuse fd, that move data (status: fuse_workers)
        self.workers = 1
        self._copy: CopyWorkers | None = None
        self.init_out: abi.InitOut | None = None
        self.kernel_flags = 0
        self.passthrough_offered = False
        self.passthrough_error: str | None = None
        self.modes = IoModes(self._backing_open, self._backing_close, enabled=False)
        self.handlers = RequestHandlers(ops, self.modes)
        self.counts: Counter[int] = Counter()  # requests received, by opcode
        self.done = trio.Event()
        self._serving = trio.CancelScope()  # cancelled by stop()
        self._inflight: dict[int, trio.CancelScope] = {}
        # INTERRUPTs read (by another worker) before the request they name was dispatched
        self._early_interrupts: set[int] = set()
        # RELEASEs dispatched and not yet handled, by inode: an OPEN of that inode waits for them, so it
        # never overtakes a release the kernel sent before it (each request runs in its own task)
        self._releasing: dict[int, int] = {}
        self._released: dict[int, trio.Event] = {}
        self._nursery: trio.Nursery | None = None

    # ------------------------------------------------------------------ state
    @property
    def passthrough(self) -> bool:
        """Passthrough granted: the kernel agreed at INIT and a backing id could be opened."""
        return self.modes.enabled

    @property
    def passthrough_handles(self) -> int:
        return self.modes.passthrough_handles

    @property
    def protocol(self) -> str | None:
        """The FUSE protocol version settled at INIT ("7.38"), None before."""
        return None if self.init_out is None else f"{self.init_out.major}.{self.init_out.minor}"

    # ------------------------------------------------------------- mount/unmount
    def mount(self) -> None:
        self.fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        os.set_blocking(self.fd, False)
        try:
            flags = _mount.MS_NOSUID | _mount.MS_NODEV | (_mount.MS_RDONLY if self.read_only else 0)
            _mount.mount(self.source, self.mountpoint, self.fstype,
                         _mount.options(self.fd, allow_other=self.allow_other), flags)
        except BaseException:
            os.close(self.fd)
            self.fd = -1
            raise

    async def unmount(self, lazy: bool = False) -> None:
        """umount2 in a thread (the kernel may need our answers while it unmounts)."""
        await trio.to_thread.run_sync(_mount.umount, self.mountpoint, lazy)

    def close(self) -> None:
        """Close /dev/fuse: aborts the connection if it is still mounted."""
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            trio.lowlevel.notify_closing(fd)
            self.modes.drop_all()
            os.close(fd)
        while self.clones:
            os.close(self.clones.pop())

    # ---------------------------------------------------------------- backing ids
    def _backing_open(self, fd: int) -> int:
        arg = bytearray(abi.BACKING_MAP.pack(fd, 0, 0))
        return fcntl.ioctl(self.fd, abi.DEV_IOC_BACKING_OPEN, arg, True)

    def _backing_close(self, backing_id: int) -> None:
        fcntl.ioctl(self.fd, abi.DEV_IOC_BACKING_CLOSE, bytearray(struct.pack("<I", backing_id)), True)

    def _probe_backing(self) -> bool:
        try:
            with tempfile.TemporaryFile(dir=self.probe_dir) as f:
                self._backing_close(self._backing_open(f.fileno()))
            return True
        except OSError as e:
            self.passthrough_error = f"FUSE_DEV_IOC_BACKING_OPEN: {e.strerror}"
            log.warning("passthrough refused: %s", self.passthrough_error)
            return False

    # ------------------------------------------------------------------ reading
    async def _read(self, buf: bytearray) -> int:
        while True:
            try:
                return os.readv(self.fd, [buf])
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self.fd)
            except InterruptedError:
                continue
            except OSError as e:
                if e.errno == errno.ENOENT:  # the request was interrupted before we read it
                    continue
                if e.errno in (errno.ENODEV, errno.EBADF):
                    raise Unmounted() from None
                raise

    # ---------------------------------------------------------------- the loop
    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Answer INIT, report started, then serve until unmounted or `stop()`. A mount whose
        INIT never completed is unmounted here: no dead mount is left behind."""
        try:
            with self._serving:
                await self._handshake()
                task_status.started()
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    if self.reader == "workers" and self._workers_wanted() > 1:
                        self._copy = self._start_workers()
                        nursery.start_soon(self._copy.run)
                    else:
                        nursery.start_soon(self._reader)
        finally:
            if self.init_out is None:
                _mount.umount(self.mountpoint, lazy=True)
                self.close()
            self.done.set()

    async def stop(self) -> None:
        """Unmount and stop serving. Like libfuse: detach at once (handles still open keep the
        mount alive), give the loop a second to see the connection end, then cancel it; close
        /dev/fuse."""
        await self.unmount(lazy=True)
        with trio.move_on_after(1):
            await self.done.wait()
        self._serving.cancel()
        await self.done.wait()
        self.close()

    async def _handshake(self) -> None:
        buf = bytearray(self._buffers.size)
        n = await self._read(buf)
        req = parse_request(memoryview(buf)[:n])
        if req.opcode != abi.Op.INIT:
            raise ProtocolError(f"first request is {req.opcode}, not INIT")
        init: abi.Init = req.args
        self.kernel_flags = init.flags
        self.passthrough_offered = bool(init.flags & abi.PASSTHROUGH)
        try:
            out = abi.negotiate(init, passthrough=self.want_passthrough, max_pages=self.max_pages,
                                max_stack_depth=self.max_stack_depth)
        except abi.InitError:
            send(self.fd, reply_error(req.unique, errno.EPROTO))
            raise
        self.init_out = out
        send(self.fd, reply(req.unique, abi.encode_init(out)))
        if not self.passthrough_offered:
            self.passthrough_error = "the kernel does not offer FUSE_PASSTHROUGH"
        elif not self.want_passthrough:
            self.passthrough_error = "not asked for (fuse_passthrough = false)"
        self.modes.enabled = bool(out.flags & abi.PASSTHROUGH) and self._probe_backing()
        await self.ops.init()

    async def _reader(self) -> None:
        assert self._nursery is not None
        while True:
            buf = await self._buffers.get()
            try:
                n = await self._read(buf)
            except Unmounted:
                self._buffers.put(buf)
                return
            except BaseException:
                self._buffers.put(buf)
                raise
            req = parse_or_eio(memoryview(buf)[:n], self.fd)
            held = buf if req is not None and req.opcode == abi.Op.WRITE else None
            if held is None:
                self._buffers.put(buf)
            if req is not None:
                self._dispatch(req, held, self.fd)

    def _workers_wanted(self) -> int:
        """How many copy workers to run. One means the single reader on the trio thread: no thread
        hop per request. With `fuse_workers` auto that is the choice under passthrough, where the
        kernel moves the bytes and the hop would only add to every request's cost (measured: a
        small file's create+write+close cost 1.5x the daemon CPU through the workers)."""
        if self.auto_workers and self.passthrough:
            return 1
        return self.want_workers

    def _start_workers(self) -> CopyWorkers:
        """The copy workers: the mount's descriptor and `want_workers - 1` clones of it (fewer if
        the kernel refuses a clone: FUSE_DEV_IOC_CLONE exists since Linux 4.2)."""
        for _ in range(self.want_workers - 1):
            try:
                self.clones.append(clone(self.fd))
            except OSError as e:
                log.warning("FUSE_DEV_IOC_CLONE refused (%s): %d copy workers", e.strerror, len(self.clones) + 1)
                break
        self.workers = 1 + len(self.clones)
        return CopyWorkers(self.ops, [self.fd, *self.clones], self._buffers.size, self.max_pages * 4096, self._dispatch,
                           max_in_flight=self.max_in_flight)

    def _dispatch(self, req: Request, buf: bytearray | None, fd: int) -> None:
        """Start answering `req` (read from `fd`, where its reply goes) in a task of its own. On the trio thread."""
        assert self._nursery is not None
        op = req.opcode
        self.counts[op] += 1
        if op == abi.Op.INTERRUPT:
            scope = self._inflight.get(req.args.unique)
            if scope is not None:
                scope.cancel()
            elif self.clones:
                # read before its request was dispatched by another worker (or after it was answered:
                # such an entry never matches, uniques are not reused; the set is kept small)
                if len(self._early_interrupts) > 1024:
                    self._early_interrupts.clear()
                self._early_interrupts.add(req.args.unique)
            return
        if op == abi.Op.FORGET:
            self._nursery.start_soon(self._forget, [(req.nodeid, req.args.nlookup)])
            return
        if op == abi.Op.BATCH_FORGET:
            self._nursery.start_soon(self._forget, req.args.items)
            return
        if op == abi.Op.GETATTR or op == abi.Op.GETXATTR:
            parts = self.handlers.now(req)  # answered here, without a task, where the filesystem need not wait
            if parts is not None:
                send(fd, parts)
                return
        if op == abi.Op.RELEASE:
            self._releasing[req.nodeid] = self._releasing.get(req.nodeid, 0) + 1
        scope = trio.CancelScope()
        if self._early_interrupts and req.unique in self._early_interrupts:
            self._early_interrupts.discard(req.unique)
            scope.cancel()
        self._inflight[req.unique] = scope
        self._nursery.start_soon(self._run, req, buf, scope, fd)

    async def _forget(self, items: list[tuple[int, int]]) -> None:
        try:
            await self.ops.forget(items)
        except Exception:
            log.exception("forget")

    async def _run(self, req: Request, buf: bytearray | None, scope: trio.CancelScope, fd: int) -> None:
        undo: Undo = None
        try:
            with scope:
                if req.opcode == abi.Op.OPEN and req.nodeid in self._releasing:
                    await self._released.setdefault(req.nodeid, trio.Event()).wait()
                parts, undo = await self.handlers.handle(req)
            if scope.cancelled_caught:
                parts, undo = reply_error(req.unique, errno.EINTR), None
        except OSError as e:
            parts = reply_error(req.unique, e.errno or errno.EIO)
        except Exception:
            log.exception("internal error in %s", _opname(req.opcode))
            parts = reply_error(req.unique, errno.EIO)
        finally:
            self._inflight.pop(req.unique, None)
            if req.opcode == abi.Op.RELEASE:
                self._release_done(req.nodeid)
            if buf is not None:
                req.args = None  # drop the view into the buffer before reusing it
                if self._copy is not None:
                    self._copy.give_back(buf)
                else:
                    self._buffers.put(buf)
        if not send(fd, parts) and undo is not None:
            try:
                await undo()
            except Exception:
                log.exception("undoing an unwanted %s reply", _opname(req.opcode))

    def _release_done(self, ino: int) -> None:
        left = self._releasing.get(ino, 1) - 1
        if left:
            self._releasing[ino] = left
            return
        self._releasing.pop(ino, None)
        event = self._released.pop(ino, None)
        if event is not None:
            event.set()

    # ------------------------------------------------------------ notifications
    async def invalidate_inode(self, ino: int, offset: int = 0, length: int = 0) -> None:
        """Make the kernel drop its cached attributes (and pages) of `ino`."""
        await trio.to_thread.run_sync(self._notify, notify_inval_inode(ino, offset, length))

    async def invalidate_entry(self, parent: int, name: bytes) -> None:
        """Make the kernel forget the name `name` in directory `parent`."""
        await trio.to_thread.run_sync(self._notify, notify_inval_entry(parent, name))

    def _notify(self, parts: Parts) -> None:
        try:
            os.writev(self.fd, parts)
        except OSError as e:
            if e.errno != errno.ENOENT:  # ENOENT: the kernel has nothing cached to drop
                raise


def _opname(opcode: int) -> str:
    try:
        return abi.Op(opcode).name
    except ValueError:
        return str(opcode)


def can_mount_directly() -> bool:
    """Whether the daemon can mount /dev/fuse itself with mount(2): root, on any kernel (the
    protocol minor is settled at INIT; passthrough is asked for only where offered)."""
    return os.geteuid() == 0


def choose_transport(setting: str) -> str:
    """`fuse_transport` resolved: "kernel" or "libfuse" ("auto": kernel where the daemon can
    mount /dev/fuse itself, libfuse and fusermount3 otherwise)."""
    if setting in ("kernel", "libfuse"):
        return setting
    return "kernel" if can_mount_directly() else "libfuse"


@asynccontextmanager
async def mounted(ops: Operations, mountpoint: str, *, stop_timeout: float = 10.0, **kwargs: Any) -> AsyncIterator[KernelSession]:
    """Mount `ops` at `mountpoint`, serve it in the background, unmount on exit."""
    session = KernelSession(ops, mountpoint, **kwargs)
    session.mount()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(session.serve)
            try:
                yield session
            finally:
                with trio.CancelScope(shield=True):
                    await session.unmount()
                    with trio.move_on_after(stop_timeout):
                        await session.done.wait()
                nursery.cancel_scope.cancel()
    finally:
        try:
            _mount.umount(mountpoint, lazy=True)  # still there if serve() failed early
        finally:
            session.close()
