"""FUSE transports: one filesystem (`ops.Operations`) behind two ways of talking to the kernel.

- `kernel`: the FUSE protocol (`abi`, `messages`) spoken directly on /dev/fuse, with passthrough
  (the kernel reads and writes cache files itself) when running as root on Linux >= 6.9.
- `libfuse`: pyfuse3/libfuse, for everything else (non-root mounts via fusermount3, older
  kernels); copy mode only.

Nothing here imports pyfuse3 except `libfuse`, so the kernel transport works without it.
"""
