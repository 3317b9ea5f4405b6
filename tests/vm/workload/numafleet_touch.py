"""Test workload for the QEMU test bed: allocate and touch memory, then idle until stopped.

    numafleet_touch.py --anon-mib 256 [--hugepages 32] [--hugepage-kb 2048] [--grow-file PATH]

Maps ``--anon-mib`` MiB of private anonymous memory and writes one byte into every 4 KiB page, so
every page is faulted in under the process's NUMA memory policy. With ``--hugepages N`` it also
maps N hugetlb pages (MAP_HUGETLB; they come from the kernel's hugepage pools, so the pool on the
allowed node must have N free pages) and touches each of them. Then it prints one line
``touched: anon_kb=... hugetlb_kb=...`` (the journal shows it) and sleeps until a signal ends it.

With ``--grow-file PATH`` it then reads PATH (a number of MiB) twice a second: when the number
is above what it holds it maps and touches 16 MiB chunks up to it (each page written once, so pages
the kernel reclaimed to swap stay there), when it is below it unmaps chunks down to it, and each
change logs ``grown: anon_kb=...``. The guest's memory guard test grows a placement this way until
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


CHUNK = 16 * 1024 * 1024


def wanted_mib(path: str):
    """The MiB number in ``path``, or None when it is absent or not a number."""
    try:
        with open(path, encoding="ascii") as handle:
            return max(0, int(handle.read().strip()))
    except (OSError, ValueError):
        return None


def grow_loop(path: str, base_kb: int) -> None:
    """Follow the MiB target in ``path`` with 16 MiB chunks of touched anonymous memory."""
    chunks = []
    while True:
        target = wanted_mib(path)
        if target is not None:
            want = max(0, target * 1024 * 1024 - base_kb * 1024) // CHUNK
            changed = want != len(chunks)
            while len(chunks) < want:
                chunk = mmap.mmap(-1, CHUNK, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                touch(chunk, CHUNK, PAGE)
                chunks.append(chunk)
            while len(chunks) > want:
                chunks.pop().close()
            if changed:
                print(f"grown: anon_kb={base_kb + len(chunks) * CHUNK // 1024}", flush=True)
        time.sleep(0.5)


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
