"""The CUDA client the GPU proof kit starts (checks cuda_visibility and mps).

    cuda_client.py count            # print the devices CUDA shows this process, then exit
    cuda_client.py hold [PIN_MIB]   # also pin PIN_MIB MiB of host memory and copy it to device 0,
                                    # print "ready", wait for a line on stdin, then exit

Prints one JSON object per line on stdout: {"event": "devices"|"ready"|"error", ...}.
``devices``: count, and per device its UUID (``GPU-...``), PCI address and total/free memory as
the CUDA runtime gives them (``cudaMemGetInfo``: under MPS with a pinned-memory limit, total is
that limit). ``ready``: pid, the host buffer's address and size, and the CPUs the process may run
on. Uses PyTorch (``torch.empty(..., pin_memory=True)``, cudaHostAlloc underneath), else CuPy
(``cupy.cuda.alloc_pinned_memory``); ``GPU_PROOF_FRAMEWORK=torch|cupy`` picks one.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import sys
import uuid


def say(event: str, **fields) -> None:
    print(json.dumps({"event": event, **fields}, sort_keys=True), flush=True)


def _address(domain: int, bus: int, device: int) -> str:
    return f"{domain:04x}:{bus:02x}:{device:02x}.0"


def _uuid_text(raw) -> str:
    """``GPU-<8-4-4-4-12 hex>`` from the 16 bytes, the hex text or the canonical text a
    framework gives for a device UUID."""
    if isinstance(raw, (bytes, bytearray)):
        return f"GPU-{uuid.UUID(bytes=bytes(raw[:16]))}"
    text = str(raw).strip()
    if text.startswith(("GPU-", "MIG-")):
        return text
    digits = re.sub(r"[^0-9a-fA-F]", "", text)
    if len(digits) == 32:
        return f"GPU-{uuid.UUID(hex=digits)}"
    return f"GPU-{text}"


class Torch:
    name = "torch"

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.version = torch.__version__

    def devices(self) -> list:
        torch = self.torch
        found = []
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            free, total = torch.cuda.mem_get_info(index)
            found.append(
                {
                    "index": index,
                    "name": props.name,
                    "uuid": _uuid_text(props.uuid) if hasattr(props, "uuid") else None,
                    "address": _address(props.pci_domain_id, props.pci_bus_id, props.pci_device_id)
                    if hasattr(props, "pci_bus_id")
                    else None,
                    "memory_total_bytes": int(total),
                    "memory_free_bytes": int(free),
                }
            )
        return found

    def pin(self, size: int) -> tuple:
        torch = self.torch
        buffer = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        buffer.fill_(7)  # touch every page
        device = buffer.to("cuda:0", non_blocking=False)
        torch.cuda.synchronize()
        return (buffer, device), int(buffer.data_ptr()), "torch.empty(pin_memory=True)"


class CuPy:
    name = "cupy"

    def __init__(self) -> None:
        import cupy

        self.cupy = cupy
        self.version = cupy.__version__

    def devices(self) -> list:
        runtime = self.cupy.cuda.runtime
        found = []
        for index in range(runtime.getDeviceCount()):
            props = runtime.getDeviceProperties(index)
            with self.cupy.cuda.Device(index):
                free, total = runtime.memGetInfo()
            name = props.get("name")
            found.append(
                {
                    "index": index,
                    "name": name.decode() if isinstance(name, bytes) else name,
                    "uuid": _uuid_text(props["uuid"]) if props.get("uuid") else None,
                    "address": _address(
                        props["pciDomainID"], props["pciBusID"], props["pciDeviceID"]
                    ),
                    "memory_total_bytes": int(total),
                    "memory_free_bytes": int(free),
                }
            )
        return found

    def pin(self, size: int) -> tuple:
        cupy = self.cupy
        memory = cupy.cuda.alloc_pinned_memory(size)
        ctypes.memset(memory.ptr, 7, size)
        device = cupy.empty(size, dtype=cupy.uint8)
        device.set(__import__("numpy").frombuffer(memory, dtype="uint8", count=size))
        cupy.cuda.runtime.deviceSynchronize()
        return (memory, device), int(memory.ptr), "cupy.cuda.alloc_pinned_memory"


def framework():
    wanted = os.environ.get("GPU_PROOF_FRAMEWORK", "auto")
    reasons = []
    for kind in (Torch, CuPy):
        if wanted not in ("auto", kind.name):
            continue
        try:
            return kind(), None
        except Exception as exc:
            reasons.append(f"{kind.name}: {exc}")
    return None, "; ".join(reasons) or f"unknown framework {wanted!r}"


def main(argv: list) -> int:
    mode = argv[1] if len(argv) > 1 else "count"
    lib, reason = framework()
    if lib is None:
        say("error", reason=f"no CUDA framework: {reason}")
        return 3
    seen = {key: os.environ.get(key) for key in sorted(os.environ) if key.startswith("CUDA_")}
    try:
        devices = lib.devices()
    except Exception as exc:
        say(
            "devices",
            framework=lib.name,
            version=lib.version,
            count=0,
            devices=[],
            error=f"{type(exc).__name__}: {exc}",
            environment=seen,
        )
        return 0
    say(
        "devices",
        framework=lib.name,
        version=lib.version,
        count=len(devices),
        devices=devices,
        environment=seen,
    )
    if mode != "hold" or not devices:
        return 0
    size = int(argv[2] if len(argv) > 2 else 256) << 20
    try:
        keep, pointer, how = lib.pin(size)
    except Exception as exc:
        say("error", reason=f"pinning {size} bytes failed: {type(exc).__name__}: {exc}")
        return 4
    say(
        "ready",
        pid=os.getpid(),
        buffer_address=pointer,
        buffer_bytes=size,
        allocator=how,
        cpus_allowed=sorted(os.sched_getaffinity(0)),
    )
    sys.stdin.readline()
    del keep
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
