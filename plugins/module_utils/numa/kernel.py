# Private to this collection: may change in any release.
"""Kernel NUMA behaviour: sysctl/THP knobs, numad, irqbalance's banned CPUs and IRQ affinity.

``parse_options`` validates the wanted state (module options), ``read_state`` reads the host
below its roots, ``plan_change`` decides every runtime write, file change and systemctl command
without I/O, and ``write_runtime`` / ``write_files`` apply a change (runtime values read back).

Runtime values live under ``procfs_root`` (``sys/kernel/numa_balancing``, ``sys/vm/zone_reclaim_mode``,
``irq/N/smp_affinity_list``) and ``sysfs_root`` (``kernel/mm/transparent_hugepage/{enabled,defrag}``,
``bus/pci/devices/<address>/msi_irqs``); files are written below ``root``:
``/etc/sysctl.d/60-numafleet-numa.conf``, ``/etc/tmpfiles.d/numafleet-thp.conf``, the
``IRQBALANCE_BANNED_CPULIST=`` line of ``/etc/default/irqbalance`` (or ``/etc/sysconfig/irqbalance``)
and, in render mode, the ``numad.service`` mask link.

A knob whose kernel file is absent (a kernel built without the feature) behaves as "off"
(``KNOBS[...].off``): asking for "off" is a warning, asking for anything else fails.
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import stat
from dataclasses import dataclass
from typing import Optional

from . import files as fs
from .cpulist import format_cpulist, parse_cpulist
from .errors import CpulistError, NumaTuneError
from .sysfs import Reader, parse_int
from .topology import parse_selected

SYSCTL_FILE = "/etc/sysctl.d/60-numafleet-numa.conf"
TMPFILES_FILE = "/etc/tmpfiles.d/numafleet-thp.conf"
# Debian/Ubuntu first, then RHEL; a host with neither gets the Debian path.
IRQBALANCE_FILES = ("/etc/default/irqbalance", "/etc/sysconfig/irqbalance")
IRQBALANCE_KEY = "IRQBALANCE_BANNED_CPULIST"
# Deprecated hex mask; irqbalance >= 1.8 still reads it first and then ignores the cpulist.
IRQBALANCE_OLD_KEY = "IRQBALANCE_BANNED_CPUS"
IRQBALANCE_UNIT = "irqbalance.service"
NUMAD_UNIT = "numad.service"
# Where numad.service may be installed; a mask is a link to /dev/null in the first one.
UNIT_DIRS = ("/etc/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system")
MASK_TARGET = "/dev/null"
HEADER = "# Managed by numafleet.tuning (numa_kernel); edits to this file are overwritten."
# A new irqbalance file: only its one line is ours, the admin may add the others.
IRQBALANCE_HEADER = (
    f"# {IRQBALANCE_KEY} is set by numafleet.tuning (numa_kernel); other lines are kept."
)
THP_ENABLED = ("always", "madvise", "never")
THP_DEFRAG = ("always", "defer", "defer+madvise", "madvise", "never")
NUMAD_CHOICES = ("masked", "leave")
SERVICE_MANAGERS = ("systemd", "none")
ZONE_RECLAIM_MAX = 7
FILE_MODE = 0o644
DIR_MODE = 0o755
# systemctl under coreutils timeout: disable --now waits for the unit to stop.
COMMAND_TIMEOUT_S = 300
QUERY_TIMEOUT_S = 30
_KILL_AFTER_S = 10
# is-active states in which the daemon runs (or is about to).
RUNNING = ("active", "activating", "reloading", "refreshing")
_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z")
_ASSIGN = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=(.*)\Z")


class KernelSettingError(NumaTuneError):
    """An option of numa_kernel, or the host state it meets, cannot work; str() names it and the fix."""


@dataclass(frozen=True)
class Knob:
    """A kernel setting: where it lives, how it is persisted, and what its absence means."""

    name: str
    tree: str  # "proc" or "sys"
    parts: tuple
    key: str  # sysctl key, or the host path in a tmpfiles.d line
    off: object  # the value a kernel without this file behaves as
    feature: str  # what the kernel lacks when the file is absent
    persist: str


KNOBS = (
    Knob(
        "numa_balancing",
        "proc",
        ("sys", "kernel", "numa_balancing"),
        "kernel.numa_balancing",
        0,
        "automatic NUMA balancing (CONFIG_NUMA_BALANCING)",
        SYSCTL_FILE,
    ),
    Knob(
        "zone_reclaim_mode",
        "proc",
        ("sys", "vm", "zone_reclaim_mode"),
        "vm.zone_reclaim_mode",
        0,
        "NUMA zone reclaim (CONFIG_NUMA)",
        SYSCTL_FILE,
    ),
    Knob(
        "thp_enabled",
        "sys",
        ("kernel", "mm", "transparent_hugepage", "enabled"),
        "/sys/kernel/mm/transparent_hugepage/enabled",
        "never",
        "transparent hugepages (CONFIG_TRANSPARENT_HUGEPAGE)",
        TMPFILES_FILE,
    ),
    Knob(
        "thp_defrag",
        "sys",
        ("kernel", "mm", "transparent_hugepage", "defrag"),
        "/sys/kernel/mm/transparent_hugepage/defrag",
        "never",
        "transparent hugepages (CONFIG_TRANSPARENT_HUGEPAGE)",
        TMPFILES_FILE,
    ),
)
KNOB = {knob.name: knob for knob in KNOBS}


# --- wanted state ------------------------------------------------------------------------------


@dataclass(frozen=True)
class IrqRequest:
    """One irq_affinity entry: an IRQ number or a PCI address (all its MSI IRQs), and CPUs."""

    where: str
    irq: Optional[int]
    address: Optional[str]
    cpus: tuple


@dataclass(frozen=True)
class Desired:
    """The validated options: knob values (only those to set), numad, banned CPUs, IRQ requests."""

    knobs: dict
    numad: str
    banned_cpus: Optional[tuple]
    irqs: tuple
    service_manager: str = "systemd"


def _int_option(name: str, value, low: int, high: int, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value.strip())
        else:
            raise KernelSettingError(f"{name} is {value!r}, not an integer; {fix}")
    if not low <= value <= high:
        raise KernelSettingError(f"{name} is {value}, outside {low}-{high}; {fix}")
    return value


def _choice(name: str, value, choices: tuple) -> str:
    if value not in choices:
        raise KernelSettingError(
            f"{name} is {value!r}; use one of {', '.join(choices)}, or null to leave it alone"
        )
    return value


def _cpus_option(name: str, value) -> tuple:
    if not isinstance(value, str):
        raise KernelSettingError(
            f"{name} is {value!r}; give a cpulist string such as '0-1,8' (the "
            "numafleet.tuning.cpulist filter makes one from a list)"
        )
    try:
        cpus = parse_cpulist(value)
    except CpulistError as exc:
        raise KernelSettingError(f"{name}: {exc}; write it like '0-1,8'") from None
    if not cpus:
        raise KernelSettingError(
            f"{name} is empty; give at least one CPU ('0-1,8'), or null to leave it alone"
        )
    return tuple(cpus)


def _irq_requests(entries) -> tuple:
    if entries is None:
        return ()
    if not isinstance(entries, list):
        raise KernelSettingError(
            f"irq_affinity is {type(entries).__name__}; give a list of {{irq, cpus}} or "
            "{address, cpus} entries ([] for none)"
        )
    requests = []
    for index, entry in enumerate(entries):
        where = f"irq_affinity[{index}]"
        if not isinstance(entry, dict):
            raise KernelSettingError(f"{where} is {entry!r}; give {{irq: N, cpus: '0-3'}}")
        irq, address = entry.get("irq"), entry.get("address")
        if (irq is None) == (address is None):
            raise KernelSettingError(
                f"{where} needs exactly one of irq (an IRQ number) and address (a PCI "
                "address such as 0000:17:00.0, for all its MSI IRQs)"
            )
        if irq is not None:
            irq = _int_option(f"{where}.irq", irq, 0, (1 << 31) - 1, "give an IRQ number")
        if address is not None:
            text = str(address).strip().lower()
            if not _PCI_ADDRESS.match(text):
                raise KernelSettingError(
                    f"{where}.address is {address!r}, not a PCI address; write it as lspci -D "
                    "prints it, e.g. 0000:17:00.0"
                )
            address = text
        cpus = _cpus_option(f"{where}.cpus", entry.get("cpus"))
        requests.append(IrqRequest(where, irq, address, cpus))
    return tuple(requests)


def parse_options(params: dict) -> Desired:
    """The validated wanted state of the module options (None = leave alone); raises KernelSettingError."""
    knobs: dict = {}
    value = params.get("numa_balancing")
    if value is not None:
        knobs["numa_balancing"] = _int_option(
            "numa_balancing", value, 0, 1, "use 0 (off) or 1 (on), or null to leave it alone"
        )
    value = params.get("zone_reclaim_mode")
    if value is not None:
        knobs["zone_reclaim_mode"] = _int_option(
            "zone_reclaim_mode",
            value,
            0,
            ZONE_RECLAIM_MAX,
            "it is a bitmask of 1 (reclaim), 2 (write dirty pages) and 4 (swap); 0 is off",
        )
    for name, choices in (("thp_enabled", THP_ENABLED), ("thp_defrag", THP_DEFRAG)):
        value = params.get(name)
        if value is not None:
            knobs[name] = _choice(name, value, choices)
    numad = _choice("numad", params.get("numad") or "leave", NUMAD_CHOICES)
    banned = params.get("irqbalance_banned_cpus")
    banned_cpus = None if banned is None else _cpus_option("irqbalance_banned_cpus", banned)
    manager = _choice(
        "service_manager", params.get("service_manager") or "systemd", SERVICE_MANAGERS
    )
    root = params.get("root", "/")
    if not isinstance(root, str) or not root.startswith("/"):
        raise KernelSettingError(
            f"root is {root!r}; give an absolute directory (/ for the host itself)"
        )
    return Desired(knobs, numad, banned_cpus, _irq_requests(params.get("irq_affinity")), manager)


# --- current state -----------------------------------------------------------------------------


@dataclass(frozen=True)
class KnobState:
    """A knob's runtime file: its path, whether it exists, its value and the values it offers."""

    path: str
    exists: bool
    value: object
    choices: tuple = ()


@dataclass(frozen=True)
class IrqState:
    """An IRQ's smp_affinity_list: path, CPUs (None when absent) and the entries asking for it."""

    irq: int
    path: str
    cpus: Optional[tuple]
    wanted: tuple
    wheres: tuple
    explicit: bool


@dataclass(frozen=True)
class State:
    """What read_state found: knobs, CPU sets, managed files, numad's unit and the IRQs."""

    knobs: dict
    online: Optional[tuple]
    possible: Optional[tuple]
    files: dict  # host path -> text, or None when absent
    irqbalance_file: str
    numad_unit: Optional[str]  # host path of the unit file found, None when none
    numad_etc: str  # "absent", "masked" or "file" (a unit of its own in /etc)
    irqs: tuple
    warnings: tuple


def under_root(root: str, path: str) -> str:
    """Where the host path ``path`` lies below ``root`` ("/" = the host itself)."""
    return os.path.join(root, path.lstrip("/"))


def _read(path: str) -> Optional[str]:
    """Text of a file (NULs and surrounding whitespace removed), None when it does not exist."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO or device would block or stream
            raise KernelSettingError(
                f"{path} is not a regular file; point sysfs_root and procfs_root at the host's "
                "/sys and /proc, or at a recording"
            )
        with open(path, "rb") as handle:
            raw = handle.read(1 << 20)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise KernelSettingError(
            f"{path}: {exc.strerror or 'cannot be read'}; run as root, or point the root "
            "options at a readable tree"
        ) from None
    return raw.decode("utf-8", errors="replace").replace("\0", "").strip()


def _fail_read(path: str, reason: str) -> KernelSettingError:
    if "regular file" in reason:
        return KernelSettingError(
            f"{path} is not a regular file; move it away, numa_kernel writes a file there"
        )
    if "symbolic link" in reason:
        return KernelSettingError(f"{path}: {reason}")
    return KernelSettingError(f"{path}: {reason}; check its permissions")


def _read_file(root: str, path: str) -> Optional[str]:
    """Text of ``path`` below ``root``, None when absent; no component followed through a link
    (a link at the file itself reads as absent and is replaced by the write)."""
    return fs.read_text(root, path, _fail_read, link_as_absent=True)


def selector_choices(text: str) -> tuple:
    """Every value a sysfs selector offers ("always [madvise] never" -> all three words)."""
    return tuple(word.strip("[]") for word in text.split())


def _read_knob(reader: Reader, knob: Knob) -> KnobState:
    path = reader.proc(*knob.parts) if knob.tree == "proc" else reader.sys(*knob.parts)
    text = _read(path)
    if text is None:
        return KnobState(path, False, None)
    try:
        if knob.tree == "proc":
            return KnobState(path, True, parse_int(text))
        return KnobState(path, True, parse_selected(text), selector_choices(text))
    except ValueError:
        raise KernelSettingError(
            f"{path} reads {text[:80]!r}, which is not a {knob.name} value; check that "
            "sysfs_root and procfs_root point at the host's /sys and /proc"
        ) from None


def _cpu_set(reader: Reader, name: str) -> Optional[tuple]:
    path = reader.sys("devices", "system", "cpu", name)
    text = _read(path)
    if text is None:
        return None
    try:
        return tuple(parse_cpulist(text))
    except CpulistError as exc:
        raise KernelSettingError(f"{path}: {exc}") from None


def _numad(root: str) -> tuple:
    """(host path of numad.service or None, state of its /etc entry: absent, masked or file)."""
    etc = under_root(root, posixpath.join(UNIT_DIRS[0], NUMAD_UNIT))
    state = "absent"
    if os.path.islink(etc):
        state = "masked" if os.readlink(etc) == MASK_TARGET else "file"
    elif os.path.lexists(etc):
        state = "masked" if os.path.isfile(etc) and os.path.getsize(etc) == 0 else "file"
    for directory in UNIT_DIRS:
        path = posixpath.join(directory, NUMAD_UNIT)
        if os.path.lexists(under_root(root, path)):
            return path, state
    return None, state


def _msi_irqs(reader: Reader, request: IrqRequest) -> list:
    device = reader.sys("bus", "pci", "devices", request.address)
    if not os.path.exists(device):
        raise KernelSettingError(
            f"{request.where}.address: no PCI device {request.address} under "
            f"{reader.sys('bus', 'pci', 'devices')}; use an address from lspci -D or "
            "ansible_facts.numa.pci_devices"
        )
    try:
        names = os.listdir(os.path.join(device, "msi_irqs"))
    except OSError:
        names = []
    return sorted(int(name) for name in names if name.isdigit())


def _read_irqs(reader: Reader, requests: tuple, warnings: list) -> tuple:
    wanted: dict = {}  # irq -> (cpus, [where...], explicit)
    without_msi = []
    for request in requests:
        irqs = [request.irq] if request.irq is not None else _msi_irqs(reader, request)
        if not irqs:
            without_msi.append(request.address)
        for irq in irqs:
            where = (
                request.where
                if request.irq is not None
                else (f"{request.where} ({request.address} IRQ {irq})")
            )
            if irq in wanted and wanted[irq][0] != request.cpus:
                raise KernelSettingError(
                    f"{where} pins IRQ {irq} to CPUs {format_cpulist(request.cpus)} but "
                    f"{wanted[irq][1][0]} pins it to {format_cpulist(wanted[irq][0])}; "
                    "give each IRQ one CPU set"
                )
            entry = wanted.setdefault(irq, (request.cpus, [], False))
            entry[1].append(where)
            wanted[irq] = (entry[0], entry[1], entry[2] or request.irq is not None)
    if without_msi:
        warnings.append(
            f"irq_affinity: PCI device{'s' if len(without_msi) > 1 else ''} "
            f"{', '.join(without_msi)} list no MSI/MSI-X IRQs in "
            f"{reader.sys('bus', 'pci', 'devices', '<address>', 'msi_irqs')} (no driver bound, "
            "or legacy INTx); nothing pinned for them"
        )
    states = []
    for irq in sorted(wanted):
        cpus, wheres, explicit = wanted[irq]
        path = reader.proc("irq", str(irq), "smp_affinity_list")
        text = _read(path)
        current = None
        if text is not None:
            try:
                current = tuple(parse_cpulist(text))
            except CpulistError as exc:
                raise KernelSettingError(f"{path}: {exc}") from None
        states.append(IrqState(irq, path, current, cpus, tuple(wheres), explicit))
    return tuple(states)


def read_state(
    desired: Desired, sysfs_root: str = "/sys", procfs_root: str = "/proc", root: str = "/"
) -> State:
    """Current values of everything ``desired`` manages; raises KernelSettingError or TopologyError."""
    reader = Reader(sysfs_root, procfs_root)
    reader.check_roots()
    warnings: list = []
    knobs = {name: _read_knob(reader, KNOB[name]) for name in desired.knobs}
    irqbalance_file = IRQBALANCE_FILES[0]
    for path in IRQBALANCE_FILES:
        if os.path.lexists(under_root(root, path)):
            irqbalance_file = path
            break
    files = {}
    if any(KNOB[name].persist == SYSCTL_FILE for name in desired.knobs):
        files[SYSCTL_FILE] = _read_file(root, SYSCTL_FILE)
    if any(KNOB[name].persist == TMPFILES_FILE for name in desired.knobs):
        files[TMPFILES_FILE] = _read_file(root, TMPFILES_FILE)
    if desired.banned_cpus is not None:
        files[irqbalance_file] = _read_file(root, irqbalance_file)
    numad_unit, numad_etc = _numad(root) if desired.numad == "masked" else (None, "absent")
    return State(
        knobs=knobs,
        online=_cpu_set(reader, "online"),
        possible=_cpu_set(reader, "possible") or _cpu_set(reader, "present"),
        files=files,
        irqbalance_file=irqbalance_file,
        numad_unit=numad_unit,
        numad_etc=numad_etc,
        irqs=_read_irqs(reader, desired.irqs, warnings),
        warnings=tuple(warnings),
    )


# --- services ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServiceState:
    """``systemctl is-enabled`` and ``is-active`` answers for one unit."""

    enabled: str
    active: str


def units_to_query(desired: Desired, state: State) -> list:
    """Units whose enablement and activity the plan needs from systemctl (systemd mode only)."""
    units = []
    if desired.numad == "masked" and (state.numad_unit or state.numad_etc == "masked"):
        units.append(NUMAD_UNIT)
    if state.irqs or desired.banned_cpus is not None:
        units.append(IRQBALANCE_UNIT)
    return units


def query_argvs(systemctl: str, timeout: Optional[str], unit: str) -> list:
    """argv of ``systemctl is-enabled UNIT`` and ``systemctl is-active UNIT``, under timeout."""
    return [
        command_argv(systemctl, timeout, ("is-enabled", unit), QUERY_TIMEOUT_S),
        command_argv(systemctl, timeout, ("is-active", unit), QUERY_TIMEOUT_S),
    ]


def parse_service_state(enabled_out: str, active_out: str) -> ServiceState:
    """ServiceState of the stdout of is-enabled and is-active (their exit codes carry no error)."""

    def first(text: str) -> str:
        lines = (text or "").strip().splitlines()
        return lines[0].strip() if lines else "unknown"

    return ServiceState(first(enabled_out), first(active_out))


def command_argv(
    systemctl: str, timeout: Optional[str], args: tuple, seconds: int = COMMAND_TIMEOUT_S
) -> list:
    """argv of ``systemctl ARGS``, under coreutils ``timeout`` when given."""
    command = [systemctl, *args]
    if timeout is None:
        return command
    return [timeout, f"--kill-after={_KILL_AFTER_S}", str(seconds), *command]


# --- the change --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One managed setting: value before and after, the file it is read from, where it persists."""

    name: str
    before: object
    after: object
    source: Optional[str]
    file: Optional[str]

    @property
    def changed(self) -> bool:
        """Whether the value changes."""
        return self.before != self.after

    def as_dict(self) -> dict:
        """The module's ``settings`` entry."""
        return {
            "name": self.name,
            "before": self.before,
            "after": self.after,
            "source": self.source,
            "file": self.file,
            "changed": self.changed,
        }


@dataclass(frozen=True)
class RuntimeWrite:
    """A value to write into a kernel file and what it must read back as."""

    name: str
    path: str
    text: str
    expect: object
    kind: str  # "int", "selector" or "cpulist"
    choices: tuple = ()  # a selector's values, in the kernel's order


@dataclass(frozen=True)
class FileChange:
    """A file (or, with ``link``, a symlink) below root: create, update or unchanged."""

    path: str
    state: str
    before: Optional[str]
    after: Optional[str]
    link: bool = False

    def as_dict(self) -> dict:
        """{"path", "state"} for the module's result."""
        return {"path": self.path, "state": self.state}

    def as_diff(self) -> dict:
        """One entry of Ansible's diff list."""
        after = f"symlink -> {self.after}\n" if self.link else self.after or ""
        return {
            "before_header": self.path,
            "after_header": self.path,
            "before": self.before or "",
            "after": after,
        }


@dataclass(frozen=True)
class Change:
    """Everything plan_change decided: settings, runtime writes, files, commands, warnings."""

    settings: tuple
    runtime: tuple
    files: tuple
    commands: tuple
    warnings: tuple

    @property
    def changed(self) -> bool:
        """Whether anything is (or would be) written or run."""
        return bool(
            self.runtime
            or self.commands
            or any(change.state != "unchanged" for change in self.files)
        )

    def would_run(self) -> list:
        """The systemctl command lines, in the order they run."""
        return [" ".join(("systemctl", *args)) for args in self.commands]

    def as_diff(self) -> list:
        """Ansible's diff list: the changed settings, then every file that changes."""
        diff = []
        changed = [setting for setting in self.settings if setting.changed]
        if changed:
            diff.append(
                {
                    "before_header": "kernel settings",
                    "after_header": "kernel settings",
                    "before": "".join(f"{s.name}: {_show(s.before)}\n" for s in changed),
                    "after": "".join(f"{s.name}: {_show(s.after)}\n" for s in changed),
                }
            )
        diff.extend(change.as_diff() for change in self.files if change.state != "unchanged")
        return diff


def _show(value) -> str:
    return "(absent)" if value is None else str(value)


def _file_change(path: str, before: Optional[str], after: Optional[str]) -> Optional[FileChange]:
    if after is None:
        return None if before is None else FileChange(path, "unchanged", before, before)
    if before is None:
        return FileChange(path, "create", None, after)
    return FileChange(path, "unchanged" if before == after else "update", before, after)


def parse_sysctl(text: Optional[str]) -> dict:
    """{key: value text} of the ``key = value`` lines of a sysctl.d file; comments skipped."""
    values: dict = {}
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line[0] in "#;" or "=" not in line:
            continue
        key, dummy, value = line.partition("=")
        values[key.strip().lstrip("-")] = value.strip()
    return values


def parse_tmpfiles_writes(text: Optional[str]) -> dict:
    """{path: argument} of the ``w`` lines of a tmpfiles.d file."""
    values: dict = {}
    for line in (text or "").splitlines():
        parts = line.split(None, 6)
        if len(parts) == 7 and parts[0] in ("w", "w+"):
            values[parts[1]] = parts[6].strip()
    return values


def render_sysctl(values: dict) -> Optional[str]:
    """sysctl.d text of ``{key: value}`` in KNOBS order; None when there is nothing to persist."""
    lines = [
        f"{k.key} = {values[k.key]}" for k in KNOBS if k.persist == SYSCTL_FILE and k.key in values
    ]
    return "\n".join([HEADER, *lines]) + "\n" if lines else None


def render_tmpfiles(values: dict) -> Optional[str]:
    """tmpfiles.d text writing ``{sysfs path: value}`` at boot; None when there is nothing."""
    lines = [
        f"w {k.key} - - - - {values[k.key]}"
        for k in KNOBS
        if k.persist == TMPFILES_FILE and k.key in values
    ]
    return "\n".join([HEADER, *lines]) + "\n" if lines else None


def _plan_knob(knob: Knob, want, current: KnobState, settings, runtime, persist, warnings):
    if not current.exists:
        if want != knob.off:
            raise KernelSettingError(
                f"{knob.name}={want}: {current.path} is absent, so this kernel has no "
                f"{knob.feature}. Set {knob.name} to {knob.off} or null (leave), or boot a "
                "kernel that has it"
            )
        warnings.append(
            f"{knob.name}: {current.path} is absent: this kernel has no {knob.feature}, which "
            f"is what {knob.name}={knob.off} asks for; nothing written or persisted"
        )
        settings.append(Setting(knob.name, None, None, current.path, None))
        return
    if current.choices and want not in current.choices:
        raise KernelSettingError(
            f"{knob.name}={want}: this kernel offers {', '.join(current.choices)} in "
            f"{current.path}; pick one of those"
        )
    settings.append(Setting(knob.name, current.value, want, current.path, knob.persist))
    if current.value != want:
        kind = "int" if knob.tree == "proc" else "selector"
        runtime.append(
            RuntimeWrite(knob.name, current.path, str(want), want, kind, current.choices)
        )
    persist[knob.key] = str(want)


def plan_banned_line(text: Optional[str], cpus: tuple, path: str) -> tuple:
    """(before value, new text or None when unchanged) of the irqbalance file for banned ``cpus``.

    Only ``IRQBALANCE_BANNED_CPULIST=`` lines change: the first active one is rewritten, later
    active ones (which would win) are dropped, and the line is appended when there is none.
    Raises KernelSettingError when an active ``IRQBALANCE_BANNED_CPUS=`` would override it.
    """
    lines = (text or "").splitlines(keepends=True)
    found, before = [], None
    for index, line in enumerate(lines):
        match = _ASSIGN.match(line.rstrip("\r\n"))
        if not match:
            continue
        key, value = match.group(1), match.group(2).strip().strip("\"'").strip()
        if key == IRQBALANCE_OLD_KEY and value:
            raise KernelSettingError(
                f"{path} line {index + 1} sets the deprecated {IRQBALANCE_OLD_KEY}={value}, which "
                f"irqbalance reads before {IRQBALANCE_KEY} and which then wins; delete or comment "
                f"out that line (numa_kernel writes only {IRQBALANCE_KEY}), or leave "
                "irqbalance_banned_cpus null"
            )
        if key == IRQBALANCE_KEY:
            found.append(index)
            before = value
    want = format_cpulist(cpus)
    if before is not None:
        try:
            before = format_cpulist(parse_cpulist(before)) if before else ""
        except CpulistError:
            pass  # unparseable: reported as it is and rewritten
    if len(found) == 1 and before == want:
        return before, None
    new_line = f"{IRQBALANCE_KEY}={want}\n"
    if found:
        out = [line for index, line in enumerate(lines) if index not in found[1:]]
        out[found[0]] = new_line
    else:
        out = list(lines) if text is not None else [IRQBALANCE_HEADER + "\n"]
        if out and not out[-1].endswith("\n"):
            out[-1] += "\n"
        out.append(new_line)
    return before, "".join(out)


def _plan_numad(desired: Desired, state: State, services: dict, settings, commands, files):
    if desired.numad != "masked":
        return
    etc_path = posixpath.join(UNIT_DIRS[0], NUMAD_UNIT)
    if state.numad_etc == "file":
        raise KernelSettingError(
            f"{etc_path} (below root) is a unit file of its own, not a link to {MASK_TARGET}; "
            "systemctl mask cannot replace it. Move it to /usr/local/lib/systemd/system, or set "
            "numad to leave"
        )
    service = services.get(NUMAD_UNIT)
    active = service.active if service else None
    if state.numad_etc == "masked":
        running = active in RUNNING
        before = "masked, active" if running else "masked"
        settings.append(Setting("numad", before, "masked", state.numad_unit or etc_path, etc_path))
        if running:
            commands.append(("stop", NUMAD_UNIT))
        return
    if state.numad_unit is None:
        settings.append(Setting("numad", "absent", "absent", None, None))
        return
    before = f"{service.enabled}, {service.active}" if service else "present"
    settings.append(Setting("numad", before, "masked", state.numad_unit, etc_path))
    commands.append(("disable", "--now", NUMAD_UNIT))
    commands.append(("mask", NUMAD_UNIT))
    if desired.service_manager == "none":  # render mode: the link systemctl mask would make
        files.append(FileChange(etc_path, "create", None, MASK_TARGET, link=True))


def _check_cpus(cpus: tuple, what: str, state: State, need_online: bool) -> None:
    known = state.online if need_online else state.possible
    if known is None:
        return
    missing = sorted(set(cpus) - set(known))
    if missing:
        kind = "online" if need_online else "present"
        raise KernelSettingError(
            f"{what} names CPUs {format_cpulist(missing)}, which are not {kind} on this host "
            f"(it has {format_cpulist(known)}); use CPUs of this host"
        )


def plan_change(desired: Desired, state: State, services: Optional[dict] = None) -> Change:
    """Every setting, runtime write, file change and command for ``desired``; no I/O.

    ``services`` maps units to their ServiceState (systemd mode; {} in render mode). Raises
    KernelSettingError when a wanted value cannot be had on this host.
    """
    services = services or {}
    settings: list = []
    runtime: list = []
    files: list = []
    commands: list = []
    warnings = list(state.warnings)
    persist: dict = {}
    for knob in KNOBS:
        if knob.name in desired.knobs:
            want = desired.knobs[knob.name]
            _plan_knob(knob, want, state.knobs[knob.name], settings, runtime, persist, warnings)
    if SYSCTL_FILE in state.files:
        text = state.files[SYSCTL_FILE]
        values = {**parse_sysctl(text), **persist}
        change = _file_change(SYSCTL_FILE, text, render_sysctl(values) or text)
        files.extend([change] if change else [])
    if TMPFILES_FILE in state.files:
        text = state.files[TMPFILES_FILE]
        values = {**parse_tmpfiles_writes(text), **persist}
        change = _file_change(TMPFILES_FILE, text, render_tmpfiles(values) or text)
        files.extend([change] if change else [])
    _plan_numad(desired, state, services, settings, commands, files)
    if desired.banned_cpus is not None:
        _check_cpus(desired.banned_cpus, "irqbalance_banned_cpus", state, need_online=False)
        if state.online is not None and set(state.online) <= set(desired.banned_cpus):
            raise KernelSettingError(
                f"irqbalance_banned_cpus {format_cpulist(desired.banned_cpus)} bans every online "
                "CPU, leaving irqbalance nowhere to put interrupts; leave at least one CPU out"
            )
        path = state.irqbalance_file
        text = state.files.get(path)
        before, after = plan_banned_line(text, desired.banned_cpus, path)
        change = _file_change(path, text, text if after is None else after)
        files.append(change)
        want = format_cpulist(desired.banned_cpus)
        settings.append(Setting("irqbalance_banned_cpus", before, want, path, path))
        irqbalance = services.get(IRQBALANCE_UNIT)
        # Only a running irqbalance re-reads the file; without service state (render mode) the
        # restart is listed as what a running one would need.
        if change.state != "unchanged" and (irqbalance is None or irqbalance.active in RUNNING):
            commands.append(("try-restart", IRQBALANCE_UNIT))
    for irq in state.irqs:
        _plan_irq(irq, state, settings, runtime, warnings)
    irqbalance = services.get(IRQBALANCE_UNIT)
    if state.irqs and irqbalance and irqbalance.active in RUNNING:
        warnings.append(
            "irqbalance is running and moves IRQs it was not told to leave alone: ban the "
            "pinned IRQs with IRQBALANCE_ARGS=--banirq=N in its environment file, or stop it, "
            "or their affinity will drift"
        )
    commands = _order_commands(commands)
    return Change(tuple(settings), tuple(runtime), tuple(files), tuple(commands), tuple(warnings))


def _order_commands(commands: list) -> list:
    # numad first (stop it before it migrates anything more), irqbalance last (it reads the file).
    return sorted(commands, key=lambda args: args[-1] == IRQBALANCE_UNIT)


def _plan_irq(irq: IrqState, state: State, settings, runtime, warnings) -> None:
    name = f"irq_affinity[{irq.irq}]"
    where = irq.wheres[0]
    if irq.cpus is None:
        if irq.explicit:
            raise KernelSettingError(
                f"{where}: IRQ {irq.irq} has no {irq.path}; use an IRQ listed in /proc/interrupts"
            )
        warnings.append(f"{where}: {irq.path} is absent; IRQ {irq.irq} left alone")
        return
    _check_cpus(irq.wanted, f"{where}.cpus", state, need_online=True)
    before, after = format_cpulist(irq.cpus), format_cpulist(irq.wanted)
    settings.append(Setting(name, before, after, irq.path, None))
    if before != after:
        runtime.append(RuntimeWrite(name, irq.path, after, irq.wanted, "cpulist"))


# --- writes ------------------------------------------------------------------------------------


def _read_back(write: RuntimeWrite, text: str):
    if write.kind == "int":
        return parse_int(text)
    if write.kind == "selector":
        return parse_selected(text)
    return tuple(parse_cpulist(text))


def write_runtime(writes) -> list:
    """Write each value and read it back; the warnings of IRQs the kernel will not move.

    Raises KernelSettingError when a write fails or reads back other than asked.
    """
    warnings = []
    for write in writes:
        try:
            with open(write.path, "w", encoding="ascii") as handle:
                handle.write(write.text + "\n")
        except OSError as exc:
            if write.kind == "cpulist" and exc.errno == errno.EIO:
                warnings.append(
                    f"{write.name}: the kernel refused {write.path} (EIO): its affinity is "
                    "managed by the kernel (or the IRQ cannot be moved); left as it is"
                )
                continue
            raise KernelSettingError(
                f"{write.name}: writing {write.text!r} to {write.path} failed: "
                f"{exc.strerror or exc}; run as root (on a container, with /proc/sys and /sys "
                "writable)"
            ) from None
        text = _read(write.path) or ""
        if write.kind == "selector" and text == write.text:
            # A plain file (a recorded tree in render mode) echoes the word; keep the kernel's
            # own "a [b] c" format so later readers (numa_facts) see what a kernel shows.
            text = _emulate_selector(write, text)
        try:
            got = _read_back(write, text)
        except (ValueError, CpulistError):
            got = text
        if got != write.expect:
            raise KernelSettingError(
                f"{write.name}: wrote {write.text!r} to {write.path} but it reads back "
                f"{text!r}; the kernel did not take the value (check dmesg)"
            )
    return warnings


def _emulate_selector(write: RuntimeWrite, text: str) -> str:
    shown = " ".join(f"[{c}]" if c == text else c for c in write.choices)
    with open(write.path, "w", encoding="ascii") as handle:
        handle.write(shown + "\n")
    return shown


def _fail_write(path: str, reason: str) -> KernelSettingError:
    return KernelSettingError(
        f"{path}: {reason}; check that the directory is writable, or set root to one that is"
    )


def write_files(root: str, changes) -> None:
    """Apply file changes below ``root``: atomic writes (mode 0644) and mask links.

    Nothing is written through a link, and directories made get mode 0755 whatever the umask
    (files.py). Raises KernelSettingError.
    """
    for change in changes:
        if change.state not in ("create", "update"):
            continue
        if change.link:
            fs.write_link(root, change.path, change.after, _fail_write, DIR_MODE)
        else:
            fs.write_file(root, change.path, change.after or "", FILE_MODE, _fail_write, DIR_MODE)
