"""aah_core/process.py: the settings the engine's programs start with (OpenMP's wait policy, glibc's malloc).

The malloc policy is checked for its effect in child processes (the test process keeps glibc's defaults): a
freed 64 MB block allocated and written again faults its pages in anew by default, and not once kept.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from aah_core import process

GLIBC = hasattr(__import__("ctypes").CDLL(None), "gnu_get_libc_version")

# allocate and write 64 MB, free it, then again; print the page faults of the second round
SECOND_ROUND_FAULTS = textwrap.dedent("""
    import ctypes, resource, sys
    from aah_core import process
    if sys.argv[1] == "keep":
        assert process.keep_freed_memory()
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    size = 64 << 20
    def round():
        block = libc.malloc(size)
        libc.memset(block, 1, size)
        libc.free(block)
    round()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    round()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


def _faults(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "AAH_KEEP"))}
    done = subprocess.run([sys.executable, "-c", SECOND_ROUND_FAULTS, mode], env=env, capture_output=True, text=True,
                          timeout=60, check=True)
    return int(done.stdout.strip())


@pytest.mark.skipif(not GLIBC, reason="the policy is glibc's malloc's")
def test_kept_memory_is_not_faulted_in_again():
    default, kept = _faults("default"), _faults("keep")
    pages = (64 << 20) // os.sysconf("SC_PAGE_SIZE")
    assert default >= pages * 0.9  # mapped afresh: every page faults again
    assert kept < pages * 0.05


def test_the_policy_reaches_child_processes_and_can_be_turned_off(monkeypatch):
    for name in ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "AAH_KEEP_FREED_MEMORY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AAH_KEEP_FREED_MEMORY", "0")
    assert process.keep_freed_memory() is False
    assert "MALLOC_MMAP_MAX_" not in os.environ and "MALLOC_TRIM_THRESHOLD_" not in os.environ
    if not GLIBC:
        return
    monkeypatch.delenv("AAH_KEEP_FREED_MEMORY")
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "12345")  # set by hand: glibc applied it, it stays
    monkeypatch.setattr(process.ctypes, "CDLL", lambda name: _Libc())
    _Libc.calls = []
    assert process.keep_freed_memory() is True
    assert os.environ["MALLOC_MMAP_MAX_"] == "0" and os.environ["MALLOC_TRIM_THRESHOLD_"] == "12345"
    assert _Libc.calls == [(process._M_MMAP_MAX, 0)]


class _Libc:
    """glibc's two functions the policy calls, recorded (the test process's own malloc is left alone)."""

    calls: list[tuple[int, int]] = []

    def gnu_get_libc_version(self) -> bytes:
        return b"2.36"

    def mallopt(self, parameter: int, value: int) -> int:
        self.calls.append((parameter, value))
        return 1


def test_set_up_keeps_an_explicit_openmp_policy(monkeypatch):
    monkeypatch.setattr(process, "keep_freed_memory", lambda: True)
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    process.set_up()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
    monkeypatch.delenv("OMP_WAIT_POLICY")
    process.set_up()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
