#!/usr/bin/env python3
"""Run the core integration tests inside a VM booted with an older kernel (`make test-vm`).

Why: the kernel transport speaks every FUSE protocol minor from 7.31 on, and this machine's
own kernel speaks only its newest one. Debian 12's kernel (`linux-image-amd64`: Linux 6.1,
FUSE 7.38, no passthrough; Amazon Linux 2023's kernel) is booted under QEMU and the tests run
there under the kernel transport (copy mode: 6.1 has no passthrough) and under pyfuse3.

How, with nothing to build or download: the host's whole file system is shared read-only into
the guest over 9p, so the guest runs this worktree with the host's Python, venv and SeaweedFS
binary (the tests' fixtures start SeaweedFS inside the guest, on its loopback). A small
initramfs (busybox-static, the 9p/virtio/fuse modules of the 6.1 kernel, a shell init) mounts
the share, puts tmpfs on /tmp, /run and /var/tmp (HOME is /tmp/home; the share is read-only: nothing the guest does
touches the host; a worktree or venv under one of them, a clone in /tmp, is bound back over the tmpfs at its
own path), chroots into it and runs pytest; its output comes back on the serial
console, with a last line `vm-exit: <pytest's status>`.

KVM is used only where a guest boots with it (nested virtualization often hangs right after
the kernel is entered); otherwise TCG emulation (`-accel tcg -cpu max -smp 2`), where the run
is slow but every test is functional, not timed.

`--if-possible` (what `make test` uses): a machine where the VM cannot run (no qemu, no 6.1
kernel, no boot) skips with one line saying why and exits 0; a failing test still fails.

`--selection`: `core` (what `make test-vm` runs: every test below, both transports, about an
hour of two cores under TCG), `smoke` (write + fsync + rename + flush, both transports, ~6 min
under TCG), `nfs` (`make test-vm SELECTION=nfs`: the NFS gateway with the kernel's NFSv4.1
client, whose modules the guest's init then loads too) or `auto` (what `make test` runs): the core selection where the guest boots under KVM,
the smoke selection under TCG, said in one line. Why not the whole selection everywhere: under
emulation it alone would take most of CI's 90 minutes.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# The tests that run in the guest: existing ones, each once per transport ([kernel] and
# [libfuse]). write + fsync + rename + flush; DCP with 2 ranks; crash recovery (kill -9,
# remount); a cold read from the bucket; interrupts; a full cache.
TESTS = [
    "tests/integration/test_core.py::test_tmp_fsync_rename_flush",
    "tests/integration/test_lifecycle.py::test_dcp_step_from_several_processes_is_committed_once_quiet",
    "tests/integration/test_faults.py::test_kill9_mid_upload_resumes_from_the_parts_in_the_bucket",
    "tests/integration/test_namespace.py::test_written_on_a_reads_identical_on_b",
    "tests/integration/test_kernel_transport.py::test_interrupt_cancels_the_request",
    "tests/integration/test_cache_full.py::test_full_of_dirty_data_gives_enospc_then_recovers",
]

# What `make test` runs in the guest where only TCG emulation is to be had: the heart of the
# product (tmp, fsync, rename, flush, bytes in the bucket) under both transports in copy mode.
SMOKE = ["tests/integration/test_core.py::test_tmp_fsync_rename_flush"]

# `make test-vm SELECTION=nfs`: the gateway mode with the kernel's NFSv4.1 client (this machine's
# kernel may have none), and NFSv3 through libnfs. The guest runs ckptfs, rpcbind, Ganesha (the
# host's, through the share) and the client on its own loopback; its init loads the NFS client.
NFS = ["tests/integration/test_nfs_kernel_client.py", "tests/integration/test_nfs_gateway.py"]

KERNEL_GLOB = "6.1.*"  # Debian 12's kernel
MODULES = ["virtio_pci", "9pnet_virtio", "9p", "fuse"]
NFS_MODULES = ["sunrpc", "nfs", "nfsv4"]  # their dependencies (lockd, grace, fscache, netfs, dns_resolver) come from modules.dep
BOOT_MARK = "vm: booted"
EXIT_MARK = re.compile(r"^vm-exit: (\d+)")
# pytest's last line: "===== 3 passed, 2 skipped in 41.2s =====" (or without the rules, with -q)
SUMMARY = re.compile(r"^=*\s*((?:\d+ \w+(?:, )?)+) in [\d.]+s")
KVM_BOOT_TIMEOUT = 30.0  # a KVM guest reaches its init in seconds where KVM works at all
TCG_BOOT_TIMEOUT = 180.0  # ~10 s measured; generous for a loaded machine
MEMORY_MB = 3072

INIT = r"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules.load); do insmod "/$m" || echo "vm: insmod $m failed"; done
echo "{boot_mark}"
mkdir -p /host
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=524288,cache=loose hostroot /host || {{ echo "vm: cannot mount the host's file system"; echo "vm-exit: 125"; poweroff -f; }}
mount -t proc proc /host/proc
mount -t sysfs sys /host/sys
mount -t devtmpfs dev /host/dev
mkdir -p /host/dev/pts /host/dev/shm
mount -t devpts devpts /host/dev/pts
mount -t tmpfs shm /host/dev/shm
{keep}mount -t tmpfs tmp /host/tmp
mount -t tmpfs run /host/run
mount -t tmpfs vartmp /host/var/tmp
{restore}ip link set lo up
# with the NFS client loaded (the nfs selection): Ganesha resolves its Bind_addr with AI_ADDRCONFIG,
# which finds no IPv4 at all where 127.0.0.1 is the only address: give lo a second one
if grep -q nfsv4 /modules.load; then ip addr add 192.0.2.1/32 dev lo; fi
echo "guest kernel: $(uname -r)"
cp /run.sh /host/run/ckptfs-vm.sh
chroot /host /bin/sh /run/ckptfs-vm.sh
echo "vm-exit: $?"
sync
poweroff -f
"""

RUN = r"""cd {repo}
mkdir -p /tmp/home
export HOME=/tmp/home PATH={path} PYTHONDONTWRITEBYTECODE=1 LANG=C.UTF-8 CKPTFS_IN_VM=1
# the first `ckptfs mount` reads every module cold over 9p under emulation, and its CLI waits
# 120 s: read them once here (9p's cache=loose keeps them)
{python} -c "import ckptfs.cli, ckptfs.daemon" >/dev/null 2>&1
exec {python} -m pytest -p no:cacheprovider {pytest_args}
"""


# the guest's scratch space: tmpfs over these directories of the read-only share
SCRATCH = ("/tmp", "/run", "/var/tmp")


def hidden_by_scratch(paths: list[Path]) -> list[str]:
    """The paths the guest needs (worktree, venv, interpreter) that its scratch tmpfs would hide (a clone under /tmp),
    outermost first; each is bound back over the tmpfs at its own path."""
    out: list[str] = []
    for p in sorted({os.path.normpath(str(p)) for p in paths}):
        if any(p.startswith(top + "/") for top in SCRATCH) and not any(p.startswith(kept + "/") for kept in out):
            out.append(p)
    return out


def init_script(keep: list[str]) -> str:
    """The guest's /init: before the scratch tmpfs goes over /tmp, /run and /var/tmp, each path of `keep` is bound
    aside (/keep/PATH) and afterwards bound back to its place, read-only as the rest of the share."""
    aside = "".join(f"mkdir -p {shlex.quote('/keep' + p)} && mount -o bind {shlex.quote('/host' + p)} {shlex.quote('/keep' + p)}"
                    f" || echo {shlex.quote('vm: cannot keep ' + p)}\n" for p in keep)
    back = "".join(f"mkdir -p {shlex.quote('/host' + p)} && mount -o bind {shlex.quote('/keep' + p)} {shlex.quote('/host' + p)}"
                   f" || echo {shlex.quote('vm: cannot bind back ' + p)}\n" for p in keep)
    return INIT.format(boot_mark=BOOT_MARK, keep=aside, restore=back)


def guest_paths(python: Path) -> list[Path]:
    """What the guest runs: this worktree, and the interpreter (its venv as named and as resolved, and its prefix)."""
    venv = python.parent.parent
    return [REPO, venv, Path(os.path.realpath(venv)), Path(os.path.realpath(python)).parent.parent]


class Skip(Exception):
    """The VM cannot run here (no qemu, no kernel, no boot): the reason, in one line."""


# ------------------------------------------------------------------ the kernel
def find_kernel() -> tuple[Path, Path]:
    """The newest installed 6.1 kernel image and its modules directory."""
    found = []
    for modules in glob.glob(f"/lib/modules/{KERNEL_GLOB}"):
        version = os.path.basename(modules)
        image = Path(f"/boot/vmlinuz-{version}")
        if image.is_file():
            found.append((image, Path(modules)))
    if not found:
        raise Skip(f"no Linux {KERNEL_GLOB} kernel in /boot and /lib/modules (apt-get install linux-image-amd64 on Debian 12)")
    return sorted(found, key=lambda f: [int(x) if x.isdigit() else x for x in re.split(r"[.-]", f[1].name)])[-1]


def module_load_order(modules_dir: Path, wanted: list[str]) -> list[str]:
    """The module files (relative to `modules_dir`) to insmod, dependencies first (modules.dep)."""
    deps: dict[str, list[str]] = {}
    by_name: dict[str, str] = {}
    for line in (modules_dir / "modules.dep").read_text().splitlines():
        path, _, rest = line.partition(":")
        deps[path] = rest.split()
        by_name[os.path.basename(path).split(".ko")[0].replace("-", "_")] = path
    order: list[str] = []

    def add(path: str) -> None:
        if path in order:
            return
        for dep in reversed(deps.get(path, [])):
            add(dep)
        order.append(path)

    for name in wanted:
        if name not in by_name:
            raise Skip(f"kernel module {name} is not in {modules_dir}")
        add(by_name[name])
    return order


# ------------------------------------------------------------------ the initramfs
def _cpio_entry(out: io.BytesIO, name: str, mode: int, data: bytes = b"", ino: int = 0) -> None:
    """One entry of a newc cpio archive (what the kernel unpacks as its initramfs)."""
    raw = name.encode() + b"\0"
    fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(raw), 0]
    out.write(b"070701" + b"".join(b"%08X" % f for f in fields) + raw)
    out.write(b"\0" * (-(110 + len(raw)) % 4))
    out.write(data)
    out.write(b"\0" * (-len(data) % 4))


def build_initramfs(modules_dir: Path, run_script: str, keep: list[str], modules: list[str] = MODULES) -> bytes:
    busybox = shutil.which("busybox") or "/bin/busybox"
    if not os.path.isfile(busybox) or not _is_static(busybox):
        raise Skip("no static busybox (apt-get install busybox-static)")
    order = module_load_order(modules_dir, modules)
    out = io.BytesIO()
    ino = 1
    for d in ("bin", "proc", "sys", "dev", "tmp"):
        _cpio_entry(out, d, 0o040755, ino=ino)
        ino += 1
    _cpio_entry(out, "bin/busybox", 0o100755, Path(busybox).read_bytes(), ino=ino)
    ino += 1
    made: set[str] = set()
    for rel in order:
        parts = rel.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in made:
                made.add(d)
                _cpio_entry(out, d, 0o040755, ino=ino)
                ino += 1
        _cpio_entry(out, rel, 0o100644, (modules_dir / rel).read_bytes(), ino=ino)
        ino += 1
    _cpio_entry(out, "modules.load", 0o100644, "\n".join(order).encode() + b"\n", ino=ino)
    init = init_script(keep)
    _cpio_entry(out, "init", 0o100755, init.encode(), ino=ino + 1)
    _cpio_entry(out, "run.sh", 0o100755, run_script.encode(), ino=ino + 2)
    _cpio_entry(out, "TRAILER!!!", 0)
    return gzip.compress(out.getvalue(), compresslevel=1)


def _is_static(path: str) -> bool:
    """A static executable names no dynamic loader (a dynamic busybox cannot run in the initramfs)."""
    with open(path, "rb") as f:
        return b"/lib64/ld-linux" not in f.read(4096)


# ------------------------------------------------------------------ booting
def kvm_usable() -> bool:
    try:
        fd = os.open("/dev/kvm", os.O_RDWR)
    except OSError:
        return False
    os.close(fd)
    return True


def qemu_command(image: Path, initrd: Path, accel: str) -> list[str]:
    qemu = shutil.which("qemu-system-x86_64")
    if qemu is None:
        raise Skip("no qemu-system-x86_64 (apt-get install qemu-system-x86)")
    cpu = ["-accel", "kvm", "-cpu", "host"] if accel == "kvm" else ["-accel", "tcg", "-cpu", "max"]
    return [
        qemu, *cpu, "-smp", "2", "-m", str(MEMORY_MB), "-nodefaults", "-no-reboot",
        "-display", "none", "-serial", "stdio", "-monitor", "none",
        "-kernel", str(image), "-initrd", str(initrd),
        "-append", "console=ttyS0 panic=-1 quiet loglevel=3",
        "-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
    ]


class Guest:
    """One QEMU run: its console copied to our stdout as it comes, markers noted."""

    def __init__(self, cmd: list[str], echo: bool) -> None:
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.booted = threading.Event()
        self.exit_status: int | None = None
        self.lines: list[str] = []
        self.echo = echo
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip("\r\n")
            self.lines.append(line)
            if BOOT_MARK in line:
                self.booted.set()
            m = EXIT_MARK.match(line)
            if m:
                self.exit_status = int(m.group(1))
            if self.echo or line.startswith("guest kernel:"):
                print(line, flush=True)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def wait(self, timeout: float) -> None:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        self._reader.join(5)


def boot(image: Path, initrd: Path, accel: str, timeout: float) -> Guest | None:
    """Start the guest; None (and it killed) if it did not reach its init within `timeout`."""
    guest = Guest(qemu_command(image, initrd, accel), echo=False)
    if guest.booted.wait(timeout):
        guest.echo = True
        return guest
    guest.kill()
    return None


def run_script(python: Path, pytest_args: list[str]) -> str:
    return RUN.format(repo=REPO, path=f"{python.parent}:/usr/sbin:/usr/bin:/sbin:/bin",
                      python=python, pytest_args=" ".join(pytest_args))


def selection_args(selection: str, accel: str) -> list[str]:
    """pytest's arguments for `selection` ("auto": the core selection under KVM, smoke under TCG)."""
    if selection == "auto":
        selection = "core" if accel == "kvm" else "smoke"
        if selection == "smoke":
            print(f"test-vm: TCG emulation (no KVM guest here): the smoke selection ({len(SMOKE)} test x 2 transports); "
                  f"make test-vm runs all {len(TESTS)} (17-40 min)", flush=True)
    return ["-v", "-rs", *{"core": TESTS, "smoke": SMOKE, "nfs": NFS}[selection]]


def guest_modules(selection: str) -> list[str]:
    """The modules the guest's init loads: the NFS client only for the nfs selection (or node ids naming nfs)."""
    return MODULES + NFS_MODULES if selection == "nfs" else MODULES


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--if-possible", action="store_true", help="skip (one line, status 0) where the VM cannot run")
    ap.add_argument("--accel", choices=["auto", "kvm", "tcg"], default=os.environ.get("CKPTFS_VM_ACCEL", "auto"))
    ap.add_argument("--selection", choices=["core", "smoke", "nfs", "auto"], default=os.environ.get("CKPTFS_VM_SELECTION", "core"),
                    help="core: every core test; smoke: write+fsync+rename+flush; nfs: the NFS gateway with the kernel's "
                         "NFSv4.1 client; auto: core under KVM, smoke under TCG")
    ap.add_argument("--timeout", type=float, default=float(os.environ.get("CKPTFS_VM_TIMEOUT", 5400)),
                    help="seconds the whole guest run may take")
    ap.add_argument("pytest_args", nargs="*", help="instead of a selection (e.g. -- -k kernel, or node ids)")
    args = ap.parse_args()
    started = time.monotonic()
    try:
        if os.geteuid() != 0:
            raise Skip("the VM tests need root (the guest mounts as root and runs the kernel transport)")
        image, modules_dir = find_kernel()
        python = Path(sys.executable)
        if not str(python).startswith(str(REPO)):
            python = REPO / ".venv" / "bin" / "python"
        with tempfile.TemporaryDirectory(prefix="ckptfs-vm-") as tmp:
            guest = None
            for accel in ("kvm", "tcg"):
                if args.accel not in ("auto", accel) or (accel == "kvm" and not kvm_usable()):
                    continue
                pytest_args = args.pytest_args or selection_args(args.selection, accel)
                initrd = Path(tmp) / f"initrd-{accel}.gz"
                modules = guest_modules("nfs" if args.selection == "nfs" or "nfs" in " ".join(args.pytest_args) else args.selection)
                initrd.write_bytes(build_initramfs(modules_dir, run_script(python, pytest_args), hidden_by_scratch(guest_paths(python)), modules))
                timeout = KVM_BOOT_TIMEOUT if accel == "kvm" else TCG_BOOT_TIMEOUT
                guest = boot(image, initrd, accel, timeout)
                if guest is not None:
                    break
                if accel == "kvm" and args.accel == "auto":
                    print(f"test-vm: the guest did not boot under KVM within {KVM_BOOT_TIMEOUT:.0f} s: using TCG emulation", flush=True)
            if guest is None:
                raise Skip(f"qemu did not boot {image.name} (accel {args.accel})")
            guest.wait(args.timeout)
    except Skip as e:
        print(f"test-vm: skipped: {e}", flush=True)
        return 0 if args.if_possible else 1
    minutes = (time.monotonic() - started) / 60
    if guest.exit_status is None:
        print(f"test-vm: the guest ended without a result after {minutes:.1f} min (timeout {args.timeout:.0f} s)", flush=True)
        return 1
    print(f"test-vm: {minutes:.1f} min, pytest exit status {guest.exit_status}", flush=True)
    if guest.exit_status == 0 and all_skipped(guest.lines):
        # a selection whose tests all skipped tested nothing (a tool missing in the guest: the skip reasons say which)
        print("test-vm: every test of the selection skipped: nothing was tested (see the skip reasons above; "
              "`make test-deps` installs what the NFS tests need)", flush=True)
        return 1
    return guest.exit_status


def all_skipped(lines: list[str]) -> bool:
    """pytest's summary says tests were skipped and none passed."""
    for line in reversed(lines):
        m = SUMMARY.match(line.strip())
        if m:
            counts = {w.split()[1]: int(w.split()[0]) for w in m.group(1).split(", ") if w}
            return counts.get("skipped", 0) > 0 and not counts.get("passed", 0)
    return False


if __name__ == "__main__":
    sys.exit(main())
