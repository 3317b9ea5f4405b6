"""Stand-in for tests/gpu/cuda_client.py where there is no GPU (GPU proof kit tests).

Speaks the client's protocol (JSON lines ``devices`` / ``ready``; ``hold`` waits for a line on
stdin) for one made-up GPU, ``STUB_GPU_UUID``, filtered the way CUDA filters: with
``CUDA_VISIBLE_DEVICES`` set to anything else it sees no device. Under
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<n>M`` its free memory is under n MiB, as an MPS client's is.
Its "pinned" buffer is a real mmap that it touches, so the kit reads real numa_maps.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import sys

UUID = os.environ.get("STUB_GPU_UUID", "GPU-11111111-2222-3333-4444-555555555555")
ADDRESS = os.environ.get("STUB_GPU_ADDRESS", "0000:00:04.0")


def say(event: str, **fields) -> None:
    print(json.dumps({"event": event, **fields}, sort_keys=True), flush=True)


def main() -> int:
    # STUB_STDERR_KB: a chatty framework, writing that much to stderr before anything else.
    for dummy in range(int(os.environ.get("STUB_STDERR_KB", "0"))):
        sys.stderr.write("w" * 1023 + "\n")
    sys.stderr.flush()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    # An H200's memory; under an MPS pinned-memory limit the free memory is at most the limit
    # (less what the client holds), the total stays the GPU's, as the real driver reports it.
    total = free = 150109880320
    limit = os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "")
    if limit.startswith("0=") and limit.endswith("M"):
        free = (int(limit[2:-1]) - 2) << 20
    devices = []
    if visible is None or visible == UUID:
        devices = [
            {
                "index": 0,
                "uuid": UUID,
                "address": ADDRESS,
                "memory_total_bytes": total,
                "memory_free_bytes": free,
            }
        ]
    say("devices", framework="stub", version="0", count=len(devices), devices=devices)
    if sys.argv[1] != "hold" or not devices:
        return 0
    size = int(sys.argv[2]) << 20
    buffer = mmap.mmap(-1, size)
    buffer.write(b"\7" * size)
    address = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
    say(
        "ready",
        pid=os.getpid(),
        buffer_address=address,
        buffer_bytes=size,
        allocator="mmap",
        cpus_allowed=sorted(os.sched_getaffinity(0)),
    )
    sys.stdin.readline()
    return 0


if __name__ == "__main__":
    sys.exit(main())
