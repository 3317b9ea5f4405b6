# Private to this collection: may change in any release.
"""Host variables of the planner (placements, tenants, policy) parsed into frozen dataclasses.

Only the shape of the variables is checked here; what needs the host's facts (GPUs, nodes,
hugepage sizes, CPUs) is checked by the planner with the same kind of messages.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional, Union

from .cpulist import parse_cpulist
from .errors import CpulistError, PlacementError
from .frozen import frozen_builder
from .limits import Limits, parse_limits
from .priority import DEFAULT_PRIORITY, parse_priority, resolve

PLACEMENT_KEYS = (
    "name",
    "tenant",
    "exec",
    "unit",
    "user",
    "group",
    "description",
    "gpus",
    "cpus",
    "node",
    "near",
    "memory",
    "hugepages",
    "environment",
    "mig_profile",
    "partition",
    "mps",
    "allow_span",
    "hardening",
    # Resource limits of the placement's service (limits.py).
    "memory_limit",
    "cpu_weight",
    "io_weight",
    "tasks_max",
    # high | normal | low (priority.py): MemoryLow= for high, the memory guard's order.
    "priority",
)
TENANT_KEYS = ("name", "memory_max", "description", "priority")
HUGEPAGE_KEYS = ("size", "count")
HUGEPAGES_EXTRA_KEYS = ("node", "size", "count")
MIG_GPU_KEYS = ("gpu", "mode", "layout")
MIG_INSTANCE_KEYS = ("profile", "start", "compute_profile")
# numafleet_gpu_partitions: the MIG keys (NVIDIA) and the AMD compute/memory partition keys.
AMD_PARTITION_KEYS = ("compute_partition", "memory_partition")
GPU_PARTITION_KEYS = MIG_GPU_KEYS + AMD_PARTITION_KEYS
MPS_KEYS = ("active_thread_percentage", "pinned_memory_limit")
# Set by the planner from the GPUs it picks: a user value would point at other devices.
RESERVED_ENV = ("CUDA_VISIBLE_DEVICES",)

DEFAULT_HEADROOM_PCT = 15
_PLACEMENT_KEY_SET = frozenset(PLACEMENT_KEYS)
_KEY_SETS = {
    keys: frozenset(keys)
    for keys in (
        PLACEMENT_KEYS,
        TENANT_KEYS,
        HUGEPAGE_KEYS,
        HUGEPAGES_EXTRA_KEYS,
        MIG_GPU_KEYS,
        MIG_INSTANCE_KEYS,
        GPU_PARTITION_KEYS,
    )
}
PLACEMENTS_VAR = "numafleet_placements"
TENANTS_VAR = "numafleet_tenants"
RESERVED_VAR = "numafleet_reserved_cpus"
HEADROOM_VAR = "numafleet_memory_headroom_pct"
HUGEPAGES_EXTRA_VAR = "numafleet_hugepages_extra"
MIG_GPUS_VAR = "numafleet_mig_gpus"
GPU_PARTITIONS_VAR = "numafleet_gpu_partitions"
MIG_MODES = ("enabled", "disabled")
# AMD Instinct compute partitions (XCP modes: 1, 2, 3, 4 or 8 logical GPUs) and memory
# partitions (NPS modes), as the amdgpu sysfs files current_compute_partition and
# current_memory_partition spell them.
AMD_COMPUTE_PARTITIONS = ("SPX", "DPX", "TPX", "QPX", "CPX")
AMD_MEMORY_PARTITIONS = ("NPS1", "NPS2", "NPS4", "NPS8")
# The placement key partition: one logical GPU of a GPU in that mode (SPX is the whole GPU).
PLACEMENT_PARTITIONS = ("DPX", "TPX", "QPX", "CPX")
MIG_GPUS_DEPRECATED = (
    "numafleet_mig_gpus is deprecated: rename it numafleet_gpu_partitions (same keys)"
)

_PLACEMENT_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}\Z")
_TENANT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}\Z")
_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}\$?\Z")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_UNIT = re.compile(r"^[A-Za-z0-9:_.@\\-]{1,249}\.service\Z")
_PROGRAM = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*\Z")
_SIZE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*(?:([kmgt])(i?))?(b?)\Z", re.IGNORECASE)
# Unicode category Cc, as the unit renderers refuse it: C0, DEL and C1 (NEL U+0085 included).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_QUOTING = re.compile(r"['\"\\]")
_MULTIPLIER = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
# The last character of the usual sizes (64G, 512M): its multiplier, either case.
_UNIT_MULTIPLIER = {unit: _MULTIPLIER[unit.lower()] for unit in "kmgtKMGT"}
_GPU_ADDRESS = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z")
# BB:DD.F, the form without the PCI domain that lspci and the plan summary print.
GPU_SHORT_ADDRESS = re.compile(r"^[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z")
# Units this collection writes itself (numafleet-<placement>.service): never a drop-in target.
GENERATED_UNIT_PREFIX = "numafleet-"
_MIB_KB = 1024
# What a drop-in leaves to the pinned unit itself (description/hardening are exec-only keys).
_UNIT_OWN = {"description": "Description=", "hardening": "the sandboxing settings"}
# A MIG profile name as nvidia-smi and NVML print it without "MIG ": 3g.40gb, 1g.10gb+me, 1c.3g.40gb.
_MIG_PROFILE = re.compile(r"^[0-9]+g\.[0-9]+gb(?:[+-][a-z.]+)?\Z")
_MIG_CI_PROFILE = re.compile(r"^(?:[0-9]+c\.)?[0-9]+g\.[0-9]+gb(?:[+-][a-z.]+)?\Z")
_CONTROL_NAMES = {
    "\t": "a tab",
    "\n": "a newline",
    "\r": "a carriage return",
    "\x85": "a NEL (U+0085)",
}


@dataclass(frozen=True)
class Hugepages:
    size_kb: int
    count: int


@dataclass(frozen=True)
class HugepagesExtra:
    """An entry of numafleet_hugepages_extra: pages reserved on a node outside the placements."""

    index: int
    node: int
    size_kb: int
    count: int

    @property
    def where(self) -> str:
        """The variable path of this entry, as error messages name it."""
        return f"{HUGEPAGES_EXTRA_VAR}[{self.index}]"


@dataclass(frozen=True)
class Mps:
    active_thread_percentage: Optional[int]
    pinned_memory_limit_kb: Optional[int]


@dataclass(frozen=True)
class Placement:
    index: int
    name: str
    tenant: Optional[str]
    exec: Optional[str]
    argv: tuple
    unit: Optional[str]
    user: Optional[str]
    group: Optional[str]
    description: str
    gpu_count: int
    gpu_ids: Optional[tuple]  # explicit PCI addresses (lower case) / UUIDs, in the given order
    cpu_count: int
    cpu_list: Optional[tuple]  # explicit CPUs, sorted
    node: Optional[int]
    near: Optional[str]  # PCI address (lower case, full or BB:DD.F) whose node anchors it
    memory_kb: int
    hugepages: Optional[Hugepages]
    environment: tuple  # sorted (key, value) pairs
    mig_profile: Optional[str]
    mps: Optional[Mps]
    allow_span: bool
    hardening: Optional[bool]
    limits: Optional[Limits] = None  # memory_limit, weights, tasks_max (None: none set)
    # AMD compute partition mode (DPX/TPX/QPX/CPX, upper case): one logical GPU (XCP) of an AMD
    # GPU in that mode; None: whole GPUs (gpus:) or a MIG instance (mig_profile).
    partition: Optional[str] = None
    # high, normal or low: its own priority:, else its tenant's, else normal (priority.py).
    priority: str = DEFAULT_PRIORITY

    @property
    def where(self) -> str:
        """The variable path of this placement, as error messages name it."""
        return f"{PLACEMENTS_VAR}[{self.index}] ({self.name})"


# Placement(...) without the frozen __init__'s setattr per field (frozen.py).
_placement_record = frozen_builder(Placement)


@dataclass(frozen=True)
class MigInstance:
    """One GPU instance of a declared MIG layout: profile name, start (None: any), CI profile."""

    profile: str
    start: Optional[int]
    compute_profile: Optional[str]


@dataclass(frozen=True)
class MigGpu:
    """One NVIDIA entry of numafleet_gpu_partitions (or of the deprecated numafleet_mig_gpus):
    the GPU, its MIG mode and (None: from the plan) layout."""

    index: int
    gpu: str  # PCI address (lower case, full or BB:DD.F) or UUID
    mode: str
    layout: Optional[tuple]  # MigInstance entries; None = the plan's instances
    var: str = MIG_GPUS_VAR  # the host variable the entry came from

    @property
    def where(self) -> str:
        return f"{self.var}[{self.index}]"


@dataclass(frozen=True)
class AmdPartitionDecl:
    """One AMD entry of numafleet_gpu_partitions: the GPU and its declared compute partition
    (SPX/DPX/TPX/QPX/CPX) and memory partition (NPS1/NPS2/NPS4/NPS8), upper case; None: keep."""

    index: int
    gpu: str  # PCI address (lower case, full or BB:DD.F) or UUID
    compute_partition: Optional[str]
    memory_partition: Optional[str]
    var: str = GPU_PARTITIONS_VAR

    @property
    def where(self) -> str:
        return f"{self.var}[{self.index}]"


@dataclass(frozen=True)
class Tenant:
    index: int
    name: str
    memory_max_kb: Optional[int]
    description: str
    priority: Optional[str] = None  # None: not set (its placements then default to normal)


@dataclass(frozen=True)
class Policy:
    reserved_cpus: tuple
    memory_headroom_pct: int


def _fail(host: str, message: str) -> PlacementError:
    return PlacementError(host, message)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_size_kb(value) -> Optional[int]:
    """kB (KiB, rounded up) of a size: int bytes or '<number>[KMGT][i][B]'; None if not a size."""
    if value.__class__ is str:
        text = value.strip()
        digits, multiplier = text[:-1], _UNIT_MULTIPLIER.get(text[-1:])
        if multiplier is not None and digits.isdigit() and digits.isascii():  # 64G, 512M
            return -(-int(digits) * multiplier // 1024)
        match = _SIZE.match(text)
    elif _is_int(value):
        return -(-value // 1024) if value >= 0 else None
    else:
        return None
    if not match:
        return None
    number, prefix, binary, dummy = match.groups()
    if binary and not prefix:
        return None
    multiplier = _MULTIPLIER[(prefix or "").lower()]
    if "." not in number:
        return -(-int(number) * multiplier // 1024)
    amount = Fraction(number) * multiplier
    return -(-amount.numerator // (amount.denominator * 1024))


def format_kb(kb: int) -> str:
    """Short human text of a kB amount ('190.1 GiB', '512 MiB', '4 KiB')."""
    for unit, scale in (("TiB", 1 << 30), ("GiB", 1 << 20), ("MiB", 1 << 10)):
        if kb >= scale:
            text = f"{kb / scale:.1f}".rstrip("0").rstrip(".")
            return f"{text} {unit}"
    return f"{kb} KiB"


def _check_text(host: str, where: str, key: str, value) -> str:
    if value.__class__ is str and (value.isprintable() or not _CONTROL.search(value)):
        return value
    if not isinstance(value, str):
        raise _fail(host, f"{where}.{key}: {value!r} is not a string; quote it in YAML")
    found = _CONTROL.search(value)
    if found:
        char, position = found.group(), found.start()
        name = _CONTROL_NAMES.get(char, f"{char!r}")
        raise _fail(
            host,
            f"{where}.{key} contains a control character or newline ({name} at character "
            f"{position + 1} of {_excerpt(value, position)}); write it on one line without "
            "control characters",
        )
    return value


def _excerpt(value: str, position: int) -> str:
    """repr() of value (escapes shown as \\t, \\n...), cut to 120 characters around position."""
    if len(value) <= 120:
        return repr(value)
    start = max(0, min(position - 60, len(value) - 120))
    text = repr(value[start : start + 120])
    return ("..." if start else "") + text + ("..." if start + 120 < len(value) else "")


def _check_keys(host: str, where: str, entry: dict, allowed: tuple) -> None:
    if _KEY_SETS[allowed].issuperset(entry):
        return
    unknown = sorted(str(key) for key in entry if key not in allowed)
    if unknown:
        raise _fail(
            host,
            f"{where}: unknown key {', '.join(repr(k) for k in unknown)}; "
            f"allowed keys: {', '.join(allowed)}",
        )


def _size(host: str, where: str, key: str, value) -> int:
    kb = parse_size_kb(value)
    if kb is None:
        raise _fail(host, f"{where}.{key}: {value!r} is not a size; write e.g. 64G or 512M")
    if 0 < kb < _MIB_KB:
        text = str(value).strip()
        if text.isdigit():  # no unit: bytes, as systemd reads MemoryMax=64
            raise _fail(
                host,
                f"{where}.{key}: {text} is {text} bytes; write {text}G or {text}M (a number "
                "without a unit counts bytes, and sizes under 1 MiB are refused as a slip)",
            )
        raise _fail(
            host,
            f"{where}.{key}: {value!r} is under 1 MiB, too small to be meant; write the size "
            "in M or G, e.g. 512M",
        )
    return kb


def _split_exec(host: str, where: str, text: str) -> tuple:
    _check_text(host, where, "exec", text)
    if text.isascii() and not _QUOTING.search(text):
        argv = text.split()  # what shlex gives for text without quotes or escapes
    else:
        argv = None
    try:
        argv = argv if argv is not None else shlex.split(text, posix=True)
    except ValueError as exc:
        raise _fail(
            host,
            f"{where}.exec: cannot split {text[:80]!r} into words ({exc}); "
            "close the quotes or escape the quote character with a backslash",
        ) from None
    if not argv:
        raise _fail(host, f"{where}.exec is empty; write the command to run, e.g. /usr/bin/serve")
    if ";" in argv:
        raise _fail(
            host,
            f"{where}.exec has a bare ';' word, which systemd treats as a command separator; "
            "use a wrapper script to run several commands",
        )
    first = argv[0]
    if not (first.startswith("/") or _PROGRAM.match(first)):
        raise _fail(
            host,
            f"{where}.exec: the first word {first!r} is neither an absolute path nor a plain "
            "program name; write e.g. /opt/app/bin/serve or python3",
        )
    return tuple(argv)


def _pci_address(text: str) -> Optional[str]:
    """text lower-cased if it is a PCI address (DDDD:BB:DD.F or BB:DD.F), else None."""
    lower = text.lower()
    if _GPU_ADDRESS.match(lower) or GPU_SHORT_ADDRESS.match(lower):
        return lower
    return None


def _gpus(host: str, where: str, value) -> tuple:
    if value is None:
        return 0, None
    if _is_int(value):
        if value < 0:
            raise _fail(host, f"{where}.gpus: {value} is negative; write a count >= 0 or a list")
        return value, None
    if not isinstance(value, list):
        raise _fail(
            host,
            f"{where}.gpus: {value!r} is neither a count nor a list; write e.g. 2 or "
            "['0000:17:00.0']",
        )
    ids = []
    for item in value:
        if not isinstance(item, str) or not item.strip():
            raise _fail(
                host,
                f"{where}.gpus: {item!r} is not a GPU; list PCI addresses (0000:17:00.0) or "
                "UUIDs (GPU-...)",
            )
        ident = item.strip()
        ident = _pci_address(ident) or ident
        if ident in ids:
            raise _fail(host, f"{where}.gpus lists {ident} twice; list each GPU once")
        ids.append(ident)
    return len(ids), tuple(ids)


def _near(host: str, where: str, value) -> str:
    """The PCI address of near: (lower case, full or BB:DD.F); raises PlacementError."""
    if isinstance(value, list):
        raise _fail(
            host,
            f"{where}.near: {value!r} is a list; near anchors the placement on one PCI device: "
            "write one address, e.g. near: 0000:4b:00.0",
        )
    address = _pci_address(value.strip()) if isinstance(value, str) else None
    if address is None:
        raise _fail(
            host,
            f"{where}.near: {value!r} is not a PCI address; write one address of "
            "ansible_facts.numa.pci_devices, full (0000:4b:00.0) or short (4b:00.0)",
        )
    return address


def _cpus(host: str, where: str, value) -> tuple:
    if value is None:
        raise _fail(host, f"{where}: cpus is required; write a count (cpus: 8) or a cpulist")
    if _is_int(value):
        if value < 1:
            raise _fail(host, f"{where}.cpus: {value} is below 1; ask for at least one CPU")
        return value, None
    if not isinstance(value, str):
        raise _fail(host, f"{where}.cpus: {value!r} is neither a count nor a cpulist string")
    bare = value.strip()
    if bare.isascii() and bare.isdigit():
        raise _ambiguous_cpus(host, where, value, int(bare))
    try:
        cpus = parse_cpulist(value)
    except CpulistError as exc:
        raise _fail(
            host, f"{where}.cpus: {exc}; write a count (8) or a cpulist such as '4-11,68-75'"
        ) from None
    if not cpus:
        raise _fail(host, f"{where}.cpus: {value!r} names no CPU; write a count or a cpulist")
    return len(cpus), tuple(cpus)


def _ambiguous_cpus(host: str, where: str, value: str, cpu: int) -> PlacementError:
    count = (
        f"write cpus: {cpu} for a count of {cpu} CPU{'' if cpu == 1 else 's'}, or"
        if cpu
        else "a count is at least 1; write"
    )
    return _fail(
        host,
        f"{where}.cpus: {value!r} is ambiguous (a quoted number: a count, or CPU {cpu} alone?); "
        f'{count} a cpulist like "{cpu},{cpu + 64}" / "{cpu}-{cpu + 1}" to pin CPUs '
        f'("{cpu}-{cpu}" pins CPU {cpu} alone)',
    )


def _hugepage_size_kb(value) -> Optional[int]:
    """kB of a hugepage size (2M, 1G, '2048kB'; an int is bytes); None unless a power of two >= 4."""
    size_kb = parse_size_kb(value)
    if size_kb is None or size_kb < 4 or size_kb & (size_kb - 1):
        return None
    return size_kb


def _hugepages(host: str, where: str, value) -> Optional[Hugepages]:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _fail(host, f"{where}.hugepages: write a mapping like {{size: 2M, count: 512}}")
    _check_keys(host, f"{where}.hugepages", value, HUGEPAGE_KEYS)
    size_kb = _hugepage_size_kb(value.get("size"))
    if size_kb is None:
        raise _fail(
            host,
            f"{where}.hugepages.size: {value.get('size')!r} is not a hugepage size; "
            "write 2M or 1G (a power of two the kernel offers)",
        )
    count = value.get("count")
    if not _is_int(count) or count < 1:
        raise _fail(
            host, f"{where}.hugepages.count: {count!r} is not a count >= 1; write e.g. count: 512"
        )
    return Hugepages(size_kb, count)


def _environment(host: str, where: str, value) -> tuple:
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise _fail(host, f"{where}.environment: write a mapping of NAME: value")
    pairs = []
    for key, item in value.items():
        if not isinstance(key, str) or not _ENV_KEY.match(key):
            raise _fail(
                host,
                f"{where}.environment: {key!r} is not a variable name; use letters, digits "
                "and _ and do not start with a digit",
            )
        if key in RESERVED_ENV:
            raise _fail(
                host,
                f"{where}.environment sets {key}, which the planner sets from the GPUs it "
                "picks; remove it and choose GPUs with gpus:",
            )
        if _is_int(item) or isinstance(item, float):
            item = str(item)
        pairs.append((key, _check_text(host, where, f"environment.{key}", item)))
    return tuple(sorted(pairs))


def _mps(host: str, where: str, value) -> Optional[Mps]:
    if value is None:
        return None
    if value is True:
        return Mps(None, None)
    if not isinstance(value, dict):
        raise _fail(
            host,
            f"{where}.mps: write a mapping like {{active_thread_percentage: 40, "
            "pinned_memory_limit: 8G}} (both optional)",
        )
    unknown = sorted(str(key) for key in value if key not in MPS_KEYS)
    if unknown:
        raise _fail(
            host,
            f"{where}.mps: unknown MPS key {', '.join(repr(k) for k in unknown)}; "
            f"allowed: {', '.join(MPS_KEYS)}",
        )
    pct = value.get("active_thread_percentage")
    if pct is not None and (not _is_int(pct) or not 1 <= pct <= 100):
        raise _fail(
            host,
            f"{where}.mps.active_thread_percentage: {pct!r} is not a percentage 1..100; "
            "write e.g. 40",
        )
    limit = value.get("pinned_memory_limit")
    limit_kb = None if limit is None else _size(host, where, "mps.pinned_memory_limit", limit)
    if limit_kb == 0:
        raise _fail(
            host,
            f"{where}.mps.pinned_memory_limit: {limit!r} pins no device memory at all; write a "
            "size such as 8G, or omit pinned_memory_limit for no limit",
        )
    return Mps(pct, limit_kb)


def _bool(host: str, where: str, key: str, value, default):
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _fail(host, f"{where}.{key}: {value!r} is not a boolean; write true or false")
    return value


def _identity(host: str, where: str, entry: dict) -> tuple:
    exec_text, unit = entry.get("exec"), entry.get("unit")
    if (exec_text is None) == (unit is None):
        raise _fail(
            host,
            f"{where} needs exactly one of exec (a new service) or unit (an existing service "
            f"to pin with a drop-in); it has {'both' if exec_text is not None else 'neither'}",
        )
    user, group = entry.get("user"), entry.get("group")
    hardening = entry.get("hardening")
    if unit is not None:
        for key, value in (("user", user), ("group", group)):
            if value is not None:
                raise _fail(
                    host,
                    f"{where}: {key} only applies to exec placements (user/group with unit:); "
                    f"set {key.capitalize()}= in {unit} itself or remove {key}",
                )
        for key, value in (("description", entry.get("description")), ("hardening", hardening)):
            if value is not None:
                raise _fail(
                    host,
                    f"{where}: {key} only applies to exec placements ({key} with unit:); a "
                    f"drop-in does not change {_UNIT_OWN[key]} of {unit}: remove {key}, or "
                    f"change {unit} itself",
                )
        if not isinstance(unit, str) or not _UNIT.match(unit):
            raise _fail(
                host, f"{where}.unit: {unit!r} is not a service unit name; write e.g. vllm.service"
            )
        if unit.endswith("@.service"):
            raise _fail(
                host,
                f"{where}.unit: {unit} is a template, not a unit that runs; pin an instance "
                f"such as {unit[: -len('.service')]}1.service",
            )
        if unit.startswith(GENERATED_UNIT_PREFIX):
            raise _fail(
                host,
                f"{where}.unit: {unit} is a unit this collection generates "
                f"({GENERATED_UNIT_PREFIX}*.service, one per exec placement); pin your own "
                "service's unit, or give this placement exec: and let the collection write its unit",
            )
        if unit.startswith("nvidia-mps@"):
            raise _fail(
                host,
                f"{where}.unit: {unit} is an MPS control daemon, which this collection runs and "
                "pins itself (numafleet.tuning.nvidia_mps: on its GPU's node, from the clients' "
                "mps: settings); give the placements that use it mps: instead of pinning it",
            )
        return None, (), unit, None, None
    argv = _split_exec(host, where, exec_text)
    for key, value in (("user", user), ("group", group)):
        if value is not None and (not isinstance(value, str) or not _USER.match(value)):
            raise _fail(host, f"{where}.{key}: {value!r} is not a valid {key} name; write e.g. llm")
    return exec_text, argv, None, user, group


def _not_text_name(host: str, here: str, name, example: str) -> PlacementError:
    if isinstance(name, (int, float)) and not isinstance(name, bool):
        return _fail(
            host,
            f'{here}.name: {name!r} is a number, not a string; quote it in YAML (name: "{name}")',
        )
    return _fail(host, f"{here}.name: {name!r} is not a string; write a name such as {example}")


def _placement(host: str, index: int, entry, tenants: dict) -> Placement:
    here = f"{PLACEMENTS_VAR}[{index}]"
    if not isinstance(entry, dict):
        raise _fail(host, f"{here}: {entry!r} is not a mapping; write name:, exec: and cpus:")
    name = entry.get("name")
    if name is None:
        raise _fail(host, f"{here}: name is missing; add name: (it names the unit)")
    if name.__class__ is not str:
        raise _not_text_name(host, here, name, "llm")
    if not _PLACEMENT_NAME.match(name):
        raise _fail(
            host,
            f"{here}.name: {name!r} is not a valid name; use 1-63 of a-z 0-9 _ . - "
            "starting with a letter or digit",
        )
    where = f"{here} ({name})"
    if not _PLACEMENT_KEY_SET.issuperset(entry):
        _check_keys(host, where, entry, PLACEMENT_KEYS)
    tenant = entry.get("tenant")
    if tenant is not None and not isinstance(tenant, str):
        raise _fail(host, f"{where}.tenant: {tenant!r} is not a string; write a tenant's name")
    if tenant is not None and tenant not in tenants:
        known = ", ".join(sorted(tenants)) or "none defined"
        raise _fail(
            host,
            f"{where}.tenant: {tenant!r} is not in {TENANTS_VAR} ({known}); "
            f"add it to {TENANTS_VAR} or fix the name",
        )
    own_priority = parse_priority(host, where, entry.get("priority"))
    exec_text, argv, unit, user, group = _identity(host, where, entry)
    description = entry.get("description")
    if description is None:
        description = f"numafleet placement {name}"
    _check_text(host, where, "description", description)
    gpu_count, gpu_ids = _gpus(host, where, entry.get("gpus"))
    cpu_count, cpu_list = _cpus(host, where, entry.get("cpus"))
    node = entry.get("node")
    if node is not None and (not _is_int(node) or node < 0):
        raise _fail(host, f"{where}.node: {node!r} is not a NUMA node id; write e.g. node: 0")
    near = entry.get("near")
    memory = entry.get("memory")
    if memory is None:
        memory_kb = 0
    else:
        memory_kb = parse_size_kb(memory)
        if memory_kb is None or 0 < memory_kb < _MIB_KB:
            memory_kb = _size(host, where, "memory", memory)  # raises the message
    if own_priority == "high" and not memory_kb:
        raise _fail(
            host,
            f"{where}.priority: high protects the placement's memory budget from reclaim "
            "(MemoryLow=), and this placement has no memory:; add memory: (e.g. memory: 64G), "
            "or write priority: normal",
        )
    mig_profile = entry.get("mig_profile")
    if mig_profile is not None:
        if not isinstance(mig_profile, str) or not mig_profile.strip():
            raise _fail(host, f"{where}.mig_profile: {mig_profile!r} is not a MIG profile name")
        if gpu_ids is None and gpu_count:
            raise _fail(
                host,
                f"{where}: mig_profile asks for one MIG instance; drop gpus: {gpu_count} or "
                "list the one GPU to put the instance on",
            )
        if gpu_ids is not None and len(gpu_ids) != 1:
            raise _fail(
                host,
                f"{where}: mig_profile puts one instance on one GPU; list exactly one GPU in gpus",
            )
    mps = entry.get("mps")
    mps = None if mps is None else _mps(host, where, mps)
    partition = entry.get("partition")
    if partition is not None:
        partition = _partition(host, where, partition, gpu_count, gpu_ids, mig_profile, mps)
    if mps is not None and mig_profile is None and gpu_count != 1:
        raise _fail(
            host,
            f"{where}.mps: an MPS client uses one GPU here (one MPS daemon per device) and this "
            f"placement asks for {gpu_count}; set gpus: 1, list one GPU, or use mig_profile",
        )
    hugepages, environment = entry.get("hugepages"), entry.get("environment")
    allow_span, hardening = entry.get("allow_span"), entry.get("hardening")
    return _placement_record(
        index=index,
        name=name,
        tenant=tenant,
        exec=exec_text,
        argv=argv,
        unit=unit,
        user=user,
        group=group,
        description=description,
        gpu_count=gpu_count,
        gpu_ids=gpu_ids,
        cpu_count=cpu_count,
        cpu_list=cpu_list,
        node=node,
        near=None if near is None else _near(host, where, near),
        memory_kb=memory_kb,
        hugepages=None if hugepages is None else _hugepages(host, where, hugepages),
        environment=() if environment is None else _environment(host, where, environment),
        mig_profile=None if mig_profile is None else mig_profile.strip(),
        mps=mps,
        allow_span=(
            False if allow_span is None else _bool(host, where, "allow_span", allow_span, False)
        ),
        hardening=None if hardening is None else _bool(host, where, "hardening", hardening, None),
        limits=parse_limits(host, where, entry, memory_kb),
        partition=partition,
        priority=resolve(own_priority, None if tenant is None else tenants[tenant]),
    )


def _partition(host: str, where: str, value, gpu_count: int, gpu_ids, mig_profile, mps) -> str:
    """The placement key partition, upper case (CPX); raises PlacementError."""
    modes = ", ".join(mode.lower() for mode in PLACEMENT_PARTITIONS)
    if not isinstance(value, str) or value.strip().upper() not in PLACEMENT_PARTITIONS:
        whole = (
            " (spx is the whole GPU: write gpus: 1 instead)"
            if isinstance(value, str) and value.strip().upper() == "SPX"
            else ""
        )
        raise _fail(
            host,
            f"{where}.partition: {value!r} is not an AMD compute partition mode a placement can "
            f"take{whole}; write one of {modes} (one logical GPU of a GPU in that mode)",
        )
    mode = value.strip().upper()
    if mig_profile is not None:
        raise _fail(
            host,
            f"{where}: partition (AMD) and mig_profile (NVIDIA) both ask for a slot of a GPU; "
            "keep one of them",
        )
    if mps is not None:
        raise _fail(
            host,
            f"{where}.mps: MPS is NVIDIA only; remove mps: (a partition: {mode.lower()} "
            "placement already has a logical GPU of its own)",
        )
    if gpu_ids is None and gpu_count > 1:
        raise _fail(
            host,
            f"{where}: partition asks for one logical GPU; drop gpus: {gpu_count} or list the "
            "one GPU whose logical GPU it takes",
        )
    if gpu_ids is not None and len(gpu_ids) != 1:
        raise _fail(
            host,
            f"{where}: partition takes one logical GPU of one GPU; list exactly one GPU in gpus",
        )
    return mode


def parse_tenants(host: str, raw) -> list:
    """Tenant dataclasses of numafleet_tenants (None = []); raises PlacementError."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _fail(host, f"{TENANTS_VAR} must be a list of {{name: ..., memory_max: ...}}")
    tenants: list = []
    seen: set = set()
    for index, entry in enumerate(raw):
        here = f"{TENANTS_VAR}[{index}]"
        if not isinstance(entry, dict):
            raise _fail(host, f"{here}: {entry!r} is not a mapping; write {{name: team-a}}")
        _check_keys(host, here, entry, TENANT_KEYS)
        name = entry.get("name")
        if name is not None and not isinstance(name, str):
            raise _not_text_name(host, here, name, "team-a")
        if not isinstance(name, str) or not _TENANT_NAME.match(name):
            raise _fail(
                host,
                f"{here}.name: {name!r} is not a valid tenant name; use 1-32 of a-z 0-9 _ - "
                "starting with a letter or digit",
            )
        if name in seen:
            raise _fail(
                host, f"{here}: tenant {name!r} is defined twice; keep one entry per tenant"
            )
        seen.add(name)
        where = f"{here} ({name})"
        memory_max = entry.get("memory_max")
        if memory_max is None or (
            isinstance(memory_max, str) and memory_max.strip().lower() == "infinity"
        ):
            memory_max_kb = None
        else:
            memory_max_kb = _size(host, where, "memory_max", memory_max)
            if memory_max_kb == 0:
                raise _fail(
                    host,
                    f"{where}.memory_max: {memory_max!r} would leave the tenant's slice no "
                    "memory at all; write a size such as 64G, or infinity (or omit memory_max) "
                    "for no limit",
                )
        description = entry.get("description")
        if description is None:
            description = f"numafleet tenant {name}"
        _check_text(host, where, "description", description)
        priority = parse_priority(host, where, entry.get("priority"))
        tenants.append(Tenant(index, name, memory_max_kb, description, priority))
    return tenants


def parse_placements(host: str, raw, tenants: list) -> list:
    """Placement dataclasses of numafleet_placements (None = []); raises PlacementError."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _fail(host, f"{PLACEMENTS_VAR} must be a list of placements (name:, exec:, cpus:)")
    names = {tenant.name: tenant.priority for tenant in tenants}
    placements: list = []
    seen: dict = {}
    units: dict = {}
    for index, entry in enumerate(raw):
        placement = _placement(host, index, entry, names)
        if placement.name in seen:
            raise _fail(
                host,
                f"{placement.where}: the name is already used by {PLACEMENTS_VAR}"
                f"[{seen[placement.name]}]; names must be unique (they name the units)",
            )
        seen[placement.name] = index
        unit = placement.unit
        if unit is not None:
            if unit in units:
                first = placements[units[unit]]
                raise _fail(
                    host,
                    f"{placement.where}.unit: {unit} is already pinned by {first.where}; a unit "
                    "gets one drop-in, so merge the two placements into one or pin another unit",
                )
            units[unit] = index
        placements.append(placement)
    return placements


def _reserved_item(host: str, position: int, cpu) -> int:
    """A CPU number of a numafleet_reserved_cpus list: an int or a string of digits."""
    if _is_int(cpu) and cpu >= 0:
        return cpu
    if isinstance(cpu, str) and cpu.strip().isascii() and cpu.strip().isdigit():
        return int(cpu.strip())
    raise _fail(
        host,
        f"{RESERVED_VAR}[{position}]: {cpu!r} is not a CPU number; list CPU numbers "
        "([0, 64] or ['0', '64']) or write one cpulist string ('0-1,64-65')",
    )


def parse_policy(host: str, raw: Optional[dict]) -> Policy:
    """Policy of {"reserved_cpus": cpulist, "memory_headroom_pct": int}; raises PlacementError."""
    raw = raw or {}
    reserved = raw.get("reserved_cpus")
    if reserved is None:
        reserved = ""
    cpus: Union[list, tuple]
    if isinstance(reserved, list):
        cpus = sorted(
            {_reserved_item(host, position, cpu) for position, cpu in enumerate(reserved)}
        )
    elif _is_int(reserved) and reserved >= 0:
        cpus = [reserved]
    elif isinstance(reserved, str):
        try:
            cpus = parse_cpulist(reserved)
        except CpulistError as exc:
            raise _fail(
                host, f"{RESERVED_VAR}: {exc}; write a cpulist such as '0-1' or '' for none"
            ) from None
    else:
        raise _fail(host, f"{RESERVED_VAR}: {reserved!r} is not a cpulist; write e.g. '0-1'")
    headroom = raw.get("memory_headroom_pct")
    if headroom is None:
        headroom = DEFAULT_HEADROOM_PCT
    if isinstance(headroom, float):
        example = int(headroom) if math.isfinite(headroom) and 0 <= headroom <= 90 else 15
        raise _fail(
            host,
            f"{HEADROOM_VAR}: {headroom!r} must be a whole number (a percentage 0..90 without a "
            f"decimal point); write e.g. {example}",
        )
    if not _is_int(headroom) or not 0 <= headroom <= 90:
        raise _fail(
            host,
            f"{HEADROOM_VAR}: {headroom!r} is not a percentage 0..90; write e.g. 15 "
            "(memory per node kept free when planning)",
        )
    return Policy(tuple(cpus), headroom)


def _extra_size_kb(value) -> Optional[int]:
    """kB of a numafleet_hugepages_extra size: 2M, 1G, '2048kB', or a number of kB (2048)."""
    if _is_int(value):
        value = f"{value}K"
    elif isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        value = f"{value.strip()}K"  # a quoted number: kB as well, as the unquoted one
    return _hugepage_size_kb(value)


def parse_hugepages_extra(host: str, raw) -> list:
    """HugepagesExtra dataclasses of numafleet_hugepages_extra (None = []); raises PlacementError.

    Only the shape is checked here; the node and the page size are checked against the host's
    facts by the planner.
    """
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _fail(
            host,
            f"{HUGEPAGES_EXTRA_VAR}: {raw!r} is not a list; write a list of "
            "{node: 0, size: 2M, count: 512}",
        )
    extras = []
    for index, entry in enumerate(raw):
        where = f"{HUGEPAGES_EXTRA_VAR}[{index}]"
        if not isinstance(entry, dict):
            raise _fail(
                host,
                f"{where}: {entry!r} is not a mapping; write {{node: 0, size: 2M, count: 512}}",
            )
        _check_keys(host, where, entry, HUGEPAGES_EXTRA_KEYS)
        node = entry.get("node")
        if not _is_int(node) or node < 0:
            raise _fail(host, f"{where}.node: {node!r} is not a NUMA node id; write e.g. node: 0")
        size = entry.get("size")
        size_kb = _extra_size_kb(size)
        if size_kb is None:
            raise _fail(
                host,
                f"{where}.size: {size!r} is not a hugepage size; write 2M, 1G or the page size "
                "in kB (2048)",
            )
        count = entry.get("count")
        if not _is_int(count) or count < 0:
            raise _fail(
                host, f"{where}.count: {count!r} is not a count >= 0; write e.g. count: 512"
            )
        extras.append(HugepagesExtra(index, node, size_kb, count))
    return extras


def _mig_instance(host: str, where: str, entry) -> MigInstance:
    example = "{profile: 3g.40gb, start: 4}"
    if isinstance(entry, str):
        entry = {"profile": entry}
    if not isinstance(entry, dict):
        raise _fail(
            host, f"{where}: {entry!r} is neither a profile name nor a mapping; write {example}"
        )
    _check_keys(host, where, entry, MIG_INSTANCE_KEYS)
    profile = entry.get("profile")
    if profile is None:
        raise _fail(host, f"{where}: profile is missing; write {example}")
    if not isinstance(profile, str) or not _MIG_PROFILE.match(profile):
        raise _fail(
            host,
            f"{where}.profile: {profile!r} is not a GPU-instance profile name; write it as "
            "nvidia-smi mig -lgip prints it without 'MIG ', e.g. 3g.40gb or 1g.10gb",
        )
    start = entry.get("start")
    if start is not None and (not _is_int(start) or start < 0):
        raise _fail(host, f"{where}.start: {start!r} is not a placement start (a slice index >= 0)")
    compute = entry.get("compute_profile")
    if compute is not None:
        if not isinstance(compute, str) or not _MIG_CI_PROFILE.match(compute):
            raise _fail(
                host,
                f"{where}.compute_profile: {compute!r} is not a compute-instance profile name; "
                f"write e.g. 1c.{profile} (1 slice of the instance) or leave it out for one "
                "compute instance over the whole GPU instance",
            )
        if compute != profile and not compute.endswith(f"c.{profile}"):
            raise _fail(
                host,
                f"{where}.compute_profile: {compute!r} is not a compute-instance profile of "
                f"{profile}; write Nc.{profile} (N slices of it) or leave it out",
            )
        if compute == profile:
            compute = None
    return MigInstance(profile, start, compute)


def _mig_gpu(host: str, index: int, entry: dict, var: str) -> MigGpu:
    """The MigGpu of one checked mapping of var (its NVIDIA keys); raises PlacementError."""
    where = f"{var}[{index}]"
    ident = _gpu_ident(host, where, entry.get("gpu"))
    mode = entry.get("mode", "enabled")
    if mode not in MIG_MODES:
        raise _fail(
            host,
            f"{where}.mode: {mode!r} is not one of enabled, disabled; write mode: enabled or "
            "mode: disabled (YAML reads a bare on/off/yes/no as true/false)",
        )
    layout = entry.get("layout")
    if layout is not None:
        if not isinstance(layout, list):
            raise _fail(
                host,
                f"{where}.layout: {layout!r} is not a list; write e.g. [3g.40gb, "
                "{profile: 1g.10gb, start: 6}]",
            )
        if mode == "disabled" and layout:
            raise _fail(
                host,
                f"{where}.layout: a GPU with mode: disabled has no MIG instances; remove "
                "layout or set mode: enabled",
            )
        layout = tuple(
            _mig_instance(host, f"{where}.layout[{position}]", item)
            for position, item in enumerate(layout)
        )
    return MigGpu(index, ident, mode, layout, var)


def _gpu_ident(host: str, where: str, ident) -> str:
    """The gpu key of an entry: PCI address (lower case) or UUID; raises PlacementError."""
    if not isinstance(ident, str) or not ident.strip():
        raise _fail(
            host,
            f"{where}.gpu: {ident!r} is not a GPU; write its PCI address (0000:17:00.0) or "
            "UUID (GPU-...)",
        )
    ident = ident.strip()
    if _CONTROL.search(ident):
        raise _fail(host, f"{where}.gpu: {ident!r} has a control character; write the address")
    return _pci_address(ident) or ident


def _amd_mode(host: str, where: str, key: str, value, choices: tuple) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, str) or value.strip().upper() not in choices:
        raise _fail(
            host,
            f"{where}.{key}: {value!r} is not one of {', '.join(choices)}; write e.g. "
            f"{key}: {choices[0]}",
        )
    return value.strip().upper()


def _once(host: str, where: str, ident: str, out: list) -> None:
    for earlier in out:
        if earlier.gpu == ident:
            raise _fail(
                host, f"{where}.gpu: {ident} is also {earlier.where}; declare each GPU once"
            )


def parse_mig_gpus(host: str, raw, var: str = MIG_GPUS_VAR) -> list:
    """MigGpu dataclasses of numafleet_mig_gpus (None = []); raises PlacementError.

    Only the shape is checked here; the GPU, its profiles and whether the layout fits are checked
    against the host's facts by the planner. AMD entries (compute_partition/memory_partition) are
    refused: parse_gpu_partitions takes both vendors.
    """
    return parse_gpu_partitions(host, raw, var, amd_ok=var == GPU_PARTITIONS_VAR)[0]


def parse_gpu_partitions(
    host: str, raw, var: str = GPU_PARTITIONS_VAR, amd_ok: bool = True
) -> tuple:
    """(MigGpu list, AmdPartitionDecl list) of numafleet_gpu_partitions (None = no entries), the
    declared partition state per GPU for both vendors; raises PlacementError.

    An entry with NVIDIA keys (mode, layout) and AMD keys (compute_partition, memory_partition)
    at once is refused; an entry with neither is NVIDIA's (mode: enabled, as MIG always had).
    Whether the GPU is of that vendor and whether the modes are available is checked against
    the facts by the planner.
    """
    if raw is None:
        return [], []
    example = "{gpu: 0000:17:00.0, mode: enabled, layout: [3g.40gb, 2g.20gb]}"
    if amd_ok:
        example += " or {gpu: 0000:43:00.0, compute_partition: CPX, memory_partition: NPS4}"
    if not isinstance(raw, list):
        raise _fail(host, f"{var}: {raw!r} is not a list; write a list of {example}")
    keys = GPU_PARTITION_KEYS if amd_ok else MIG_GPU_KEYS
    nvidia, amd = [], []
    for index, entry in enumerate(raw):
        where = f"{var}[{index}]"
        if not isinstance(entry, dict):
            raise _fail(host, f"{where}: {entry!r} is not a mapping; write {example}")
        _check_keys(host, where, entry, keys)
        amd_keys = [key for key in AMD_PARTITION_KEYS if key in entry]
        mig_keys = [key for key in ("mode", "layout") if key in entry]
        if amd_keys and mig_keys:
            raise _fail(
                host,
                f"{where}: {', '.join(mig_keys)} (NVIDIA MIG) and {', '.join(amd_keys)} (AMD) "
                "in one entry; an entry declares one GPU: keep the keys of its vendor",
            )
        if amd_keys:
            ident = _gpu_ident(host, where, entry.get("gpu"))
            compute = _amd_mode(
                host,
                where,
                "compute_partition",
                entry.get("compute_partition"),
                AMD_COMPUTE_PARTITIONS,
            )
            memory = _amd_mode(
                host,
                where,
                "memory_partition",
                entry.get("memory_partition"),
                AMD_MEMORY_PARTITIONS,
            )
            _once(host, where, ident, nvidia + amd)
            amd.append(AmdPartitionDecl(index, ident, compute, memory, var))
        else:
            declared = _mig_gpu(host, index, entry, var)
            _once(host, where, declared.gpu, nvidia + amd)
            nvidia.append(declared)
    return nvidia, amd


def gpu_partitions_input(host: str, gpu_partitions, mig_gpus) -> tuple:
    """(the one list the planner gets, warnings) of numafleet_gpu_partitions and the deprecated
    numafleet_mig_gpus (None or [] = unset); raises PlacementError when both are set or an entry
    is malformed (parse_gpu_partitions, parse_mig_gpus)."""
    partitions = [] if gpu_partitions is None else gpu_partitions
    legacy = [] if mig_gpus is None else mig_gpus
    if partitions and legacy:
        raise _fail(
            host,
            f"{GPU_PARTITIONS_VAR} and {MIG_GPUS_VAR} are both set; {MIG_GPUS_VAR} is the old "
            f"name of {GPU_PARTITIONS_VAR} (same keys): move its entries into "
            f"{GPU_PARTITIONS_VAR} and remove {MIG_GPUS_VAR}",
        )
    # The shape of every entry, both vendors, before any planning (the planner checks the GPUs).
    if legacy:
        parse_mig_gpus(host, legacy)
        return legacy, [MIG_GPUS_DEPRECATED]
    parse_gpu_partitions(host, partitions)
    return partitions, []
