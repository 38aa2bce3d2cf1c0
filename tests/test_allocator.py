"""The allocator's tuning takes effect where glibc is, and does nothing (without failing) elsewhere."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import textwrap

import pytest

from slayer_lsp import allocator

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"

# In a fresh interpreter (the test process's other libraries may have tuned malloc themselves): 128 MiB
# in 64 KiB blocks, each pinned by a small block after it, then the big blocks freed: holes that
# glibc keeps resident until it is asked to hand them back.
PROBE = textwrap.dedent(
    """
    import ctypes, json
    from slayer_lsp import allocator

    def rss_kib():
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS"))

    tuned = allocator.tune(2)
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    blocks, pins = [], []
    for _ in range(2000):
        block = libc.malloc(64 * 1024)
        ctypes.memset(block, 1, 64 * 1024)
        blocks.append(block)
        pins.append(libc.malloc(64))
    for block in blocks:
        libc.free(block)
    freed = rss_kib()
    allocator.trim()
    print(json.dumps({"tuned": tuned, "freed": freed, "trimmed": rss_kib()}))
    """
)


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_on_glibc_the_arena_cap_takes_and_trim_returns_free_pages():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    seen = json.loads(out.stdout)
    assert seen["tuned"] is True
    assert seen["trimmed"] < seen["freed"] - 64 * 1024  # most of the freed 128 MiB went back


def test_without_glibc_every_call_is_a_harmless_no_op(monkeypatch):
    monkeypatch.setattr(allocator, "_libc", lambda: None)
    assert allocator.tune() is False
    allocator.trim()
