"""Test workload for the QEMU test bed: allocate and touch memory, then idle until stopped.

    numafleet_touch.py --anon-mib 256 [--hugepages 32] [--hugepage-kb 2048] [--grow-file PATH]

Maps ``--anon-mib`` MiB of private anonymous memory and writes one byte into every 4 KiB page, so
every page is faulted in under the process's NUMA memory policy. With ``--hugepages N`` it also
maps N hugetlb pages (MAP_HUGETLB; they come from the kernel's hugepage pools, so the pool on the
allowed node must have N free pages) and touches each of them. Then it prints one line
``touched: anon_kb=... hugetlb_kb=...`` (the journal shows it) and sleeps until a signal ends it.

With ``--grow-file PATH`` it then reads PATH (a number of MiB) twice a second: when the number
is above what it holds it maps and touches 16 MiB chunks up to it, one at a time, reading the file
again after each (each page written once, so pages the kernel reclaimed to swap stay there), when
it is below it unmaps chunks down to it, and each target reached logs ``grown: anon_kb=...``.
SIGUSR1 makes it read the file at once, even while the kernel throttles its page faults. The guest's memory guard test grows a placement this way until
its NUMA node passes the act threshold.

Exits 2 with a message when a mapping fails (for example, no free hugepages).
"""

import argparse
import mmap
import signal
import sys
import time

PAGE = mmap.PAGESIZE
MAP_HUGETLB = getattr(
    mmap, "MAP_HUGETLB", 0x40000
)  # Linux x86_64 value; Python < 3.13 lacks the name


def touch(region: mmap.mmap, size: int, step: int) -> None:
    for offset in range(0, size, step):
        region[offset] = 1


MIB = 1024 * 1024
CHUNK = 16 * MIB


def wanted_mib(path: str):
    """The MiB number in ``path``, or None when it is absent or not a number."""
    try:
        with open(path, encoding="ascii") as handle:
            return max(0, int(handle.read().strip()))
    except (OSError, ValueError):
        return None


class Retarget(Exception):
    """SIGUSR1: read the target file again now (raised from the signal handler)."""


def _retarget(signum, frame):
    raise Retarget()


def grow_loop(path: str, base_kb: int) -> None:
    """Follow the MiB target in ``path`` with 16 MiB chunks of touched anonymous memory.

    One chunk per step, reading the target again after each. A process the kernel throttles
    (memory.high) can sleep in its page faults for a long time; SIGUSR1 breaks off the chunk it
    is touching (the chunk is unmapped) so that a lower target takes effect at once.
    """
    signal.signal(signal.SIGUSR1, _retarget)
    chunks = []
    shown = None
    while True:
        chunk = None
        try:
            target = wanted_mib(path)
            want = None if target is None else max(0, target * MIB - base_kb * 1024) // CHUNK
            if want is not None and len(chunks) < want:
                chunk = mmap.mmap(-1, CHUNK, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                touch(chunk, CHUNK, PAGE)
                chunks.append(chunk)
                chunk = None
            elif want is not None and len(chunks) > want:
                while len(chunks) > want:
                    chunks.pop().close()
            if want is not None and len(chunks) == want and shown != want:
                print(f"grown: anon_kb={base_kb + len(chunks) * CHUNK // 1024}", flush=True)
                shown = want
            if want is None or len(chunks) == want:
                time.sleep(0.5)
        except Retarget:
            if chunk is not None:
                chunk.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--anon-mib", type=int, default=256)
    parser.add_argument("--hugepages", type=int, default=0)
    parser.add_argument("--hugepage-kb", type=int, default=2048)
    # Any text, unused: the escaping test passes awkward words through ExecStart= with it.
    parser.add_argument("--label", default="")
    parser.add_argument("--grow-file", default=None)
    args = parser.parse_args(argv)
    regions = []
    anon = args.anon_mib * 1024 * 1024
    if anon:
        region = mmap.mmap(-1, anon, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        touch(region, anon, PAGE)
        regions.append(region)
    huge = args.hugepages * args.hugepage_kb * 1024
    if huge:
        try:
            region = mmap.mmap(-1, huge, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_HUGETLB)
        except OSError as exc:
            print(f"numafleet_touch: cannot map {args.hugepages} hugepages: {exc}", file=sys.stderr)
            return 2
        touch(region, huge, args.hugepage_kb * 1024)
        regions.append(region)
    print(f"touched: anon_kb={anon // 1024} hugetlb_kb={huge // 1024}", flush=True)
    if args.grow_file:
        grow_loop(args.grow_file, anon // 1024)
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
