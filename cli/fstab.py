"""Mount-helper arguments: what `mount -t fuse.ckptfs` and /etc/fstab hand to `ckptfs`.

mount(8) has no helper of ours to call, so for type `fuse.ckptfs` it falls
back to `/sbin/mount.fuse` (fuse3's mount.fuse3), which runs the subtype as a
program: `ckptfs SOURCE MOUNTPOINT -o OPTIONS`. The `ckptfs#SOURCE` form of
type `fuse` ends the same way. This module turns those arguments into a
`ckptfs mount ... --daemon` command line, which returns once the mount
answers, as mount(8) expects of a helper.

OPTIONS are ckptfs options (`cache_dir=/nvme/ckptfs`, `endpoint_url=...`, any
name of docs/configuration.md; a yes/no one also as `allow_other`, `noallow_other`,
and `ro` for `read_only`), `config=FILE` for a TOML file, and the generic mount
options fstab lines carry (`defaults`, `_netdev`, `nofail`, `noatime`, `x-systemd.*`, ...), which are for mount(8) and systemd and are dropped here.
SOURCE is `s3://BUCKET[/PREFIX]`, or any word (such as `ckptfs`) when the
config file names the source.
"""

from __future__ import annotations

# generic options of mount(8) and fstab; the kernel-level ones (nodev, nosuid, noatime) are set by FUSE itself.
# `rw` is among them: mount(8) passes it for every line that does not say `ro`, so it cannot undo a config
# file's `read_only = true`; `ro` is ckptfs's `read_only` (passed on as `-o ro`)
GENERIC_OPTIONS = {
    "defaults", "rw", "auto", "noauto", "user", "nouser", "users", "owner", "group", "nofail", "_netdev",
    "dev", "nodev", "suid", "nosuid", "exec", "noexec", "atime", "noatime", "relatime", "norelatime",
    "strictatime", "nostrictatime", "diratime", "nodiratime", "lazytime", "nolazytime", "async",
    "silent", "loud", "iversion", "noiversion", "mand", "nomand", "remount",
}
GENERIC_PREFIXES = ("x-", "comment=", "fsname=", "subtype=", "helper=")


class FstabError(Exception):
    """Arguments mount(8) cannot have meant; the message is one line."""


def is_mount_helper_call(argv: list[str], commands: set[str]) -> bool:
    """`ckptfs SOURCE MOUNTPOINT [-o OPTIONS]` rather than `ckptfs COMMAND ...`."""
    if len(argv) < 2 or argv[0] in commands or argv[0].startswith("-"):
        return False
    return argv[0].startswith("s3://") or any(a == "-o" or a.startswith("-o") for a in argv[2:])


def mount_args(argv: list[str]) -> list[str] | None:
    """The `ckptfs mount` arguments for helper-style `argv` (SOURCE MOUNTPOINT [-o OPTS] [-n -s -v -f]).

    None for `-f` (mount(8)'s "fake": do everything but mount).
    """
    positional: list[str] = []
    options: list[str] = []
    fake = False
    it = iter(argv)
    for arg in it:
        if arg == "-o":
            try:
                options += next(it).split(",")
            except StopIteration:
                raise FstabError("-o needs a list of options (for example -o cache_dir=/var/cache/ckptfs/ckpt)") from None
        elif arg.startswith("-o"):
            options += arg[2:].split(",")
        elif arg in ("-n", "-s", "-v"):
            continue  # no mtab to write, sloppy, verbose: nothing for us to do
        elif arg == "-f":
            fake = True
        elif arg == "-t" or arg == "-N":
            next(it, None)  # the type (fuse.ckptfs) or mount(8)'s namespace: already in effect
        elif arg.startswith("-"):
            raise FstabError(f"unknown mount helper flag {arg!r}")
        else:
            positional.append(arg)
    if len(positional) != 2:
        raise FstabError("expected SOURCE MOUNTPOINT [-o OPTIONS], as mount(8) passes them")
    source, mountpoint = positional
    out = ["mount"]
    if source.startswith("s3://"):
        out.append(source)
    out += [mountpoint, "--daemon"]
    have_config = False
    for opt in options:
        opt = opt.strip()
        if not opt or opt in GENERIC_OPTIONS or opt.startswith(GENERIC_PREFIXES):
            continue
        key, sep, value = opt.partition("=")
        if key == "config":
            out += ["--config", value]
            have_config = True
        else:  # a yes/no word (allow_other, noallow_other, ro) is `ckptfs mount -o`'s to read, as any KEY=VALUE
            out += ["-o", opt]
    if not source.startswith("s3://") and not have_config:
        raise FstabError(f"source {source!r} is not s3://BUCKET[/PREFIX]: give one, or config=FILE naming the source")
    return None if fake else out
