# Private to this collection: may change in any release.
"""NVIDIA GPU baseline settings: persistence mode, compute mode, application clocks, power limit.

Each declared GPU ({gpu, persistence, compute_mode, application_clocks, power_limit_w}; a key left
out is left alone) is read, compared, changed and read back. Sources (NVML API reference, "Device
Commands" and "Device Queries"; nvidia-smi(1); NVIDIA's "Driver Persistence" guide):

- persistence: nvmlDeviceGet/SetPersistenceMode, ``nvidia-smi -i GPU -pm 1|0``. NVIDIA calls this
  legacy and points to the nvidia-persistenced daemon, which keeps every GPU initialised; where its
  unit (nvidia-persistenced.service) is installed, the daemon is enabled (``systemctl enable
  --now``) or disabled instead, so the setting is host-wide there and survives a reboot. Either
  way harmless to running processes: it only decides whether the driver tears the GPU's state
  down after the last client exits.
- compute mode: nvmlDeviceGet/SetComputeMode, ``nvidia-smi -i GPU -c DEFAULT|EXCLUSIVE_PROCESS``.
  DEFAULT only widens who may create contexts: allowed on a busy GPU. EXCLUSIVE_PROCESS lets one
  process hold contexts: refused while any process has the GPU's device file (/dev/nvidiaN) open.
  Not on a GPU an MPS daemon shares (the daemon's unit owns it: mps.py) nor in MIG mode.
- application clocks: nvmlDeviceGetApplicationsClock (NVML_CLOCK_MEM, NVML_CLOCK_GRAPHICS),
  nvmlDeviceSetApplicationsClocks, ``nvidia-smi -i GPU -ac MEM,GRAPHICS`` (MHz); the pair must be
  one nvmlDeviceGetSupportedMemoryClocks/GraphicsClocks list.
- power limit: nvmlDeviceGetPowerManagementLimit (milliwatts), ...LimitConstraints (min, max),
  nvmlDeviceSetPowerManagementLimit, ``nvidia-smi -i GPU -pl WATTS``.
  Clocks and power limit apply live and change how fast work runs, never whether it runs: allowed
  on busy GPUs and listed in the change.

Compute mode, clocks and power limit are lost at a reboot or driver reload (NVML API reference);
the drift check reports them and the next site.yml run sets them again.

Backends: NvmlBackend (a pynvml-like object), SmiBackend (``nvidia-smi -q -x`` and the set
options) and SnapshotBackend (render mode: a gpu_topology snapshot, into which a render apply
writes what it set). ``run`` is the nvidia_gpu_settings module's body.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Optional
from xml.etree import ElementTree

from .backends import NVML_MISSING, SMI_MISSING, Way, pick_backend
from .errors import GpuSettingsError

SETTINGS = ("persistence", "compute_mode", "application_clocks", "power_limit_w")
COMPUTE_MODES = ("DEFAULT", "EXCLUSIVE_PROCESS")
PERSISTENCED = "nvidia-persistenced.service"
_KEYS = ("gpu",) + SETTINGS
_CLOCK_KEYS = ("memory_mhz", "graphics_mhz")
_SMI_MODES = {
    "default": "DEFAULT",
    "exclusive_process": "EXCLUSIVE_PROCESS",
    "exclusive_thread": "EXCLUSIVE_THREAD",
    "prohibited": "PROHIBITED",
}
_MHZ = re.compile(r"^\s*([0-9]+)\s*MHz\s*$")
_WATTS = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*W\s*$")
_ADDRESS = re.compile(r"^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_NVML_FIXES = {
    "NVML_ERROR_NO_PERMISSION": "run the module as root (become: true)",
    "NVML_ERROR_NOT_SUPPORTED": "this GPU does not offer the setting: leave it out for this GPU",
    "NVML_ERROR_INVALID_ARGUMENT": "give a value the GPU lists (nvidia-smi -q -d "
    "SUPPORTED_CLOCKS,POWER)",
}


@dataclass(frozen=True)
class Desired:
    """One declared GPU: ``gpu`` as given (PCI address or UUID); None = leave the setting alone.

    ``application_clocks`` is (memory MHz, graphics MHz); ``power_limit_w`` watts.
    """

    gpu: str
    persistence: Optional[bool] = None
    compute_mode: Optional[str] = None
    application_clocks: Optional[tuple] = None
    power_limit_w: Optional[int] = None


@dataclass(frozen=True)
class GpuNow:
    """What one GPU reports. Unknown values are None; ``supported_clocks`` {memory MHz: (graphics
    MHz, ...)} is None where the source does not list them; ``processes`` are the PIDs the
    source lists (the snapshot's; live holders come from /proc, mig_holders)."""

    address: str
    uuid: Optional[str] = None
    name: Optional[str] = None
    persistence: Optional[bool] = None
    compute_mode: Optional[str] = None
    application_clocks: Optional[tuple] = None
    default_application_clocks: Optional[tuple] = None
    supported_clocks: Optional[dict] = None
    power_limit_w: Optional[int] = None
    power_default_w: Optional[int] = None
    power_min_w: Optional[int] = None
    power_max_w: Optional[int] = None
    mig_enabled: bool = False
    processes: tuple = ()


@dataclass(frozen=True)
class Change:
    """One setting of one GPU to change: ``before``/``after`` as shown, ``value`` as set."""

    address: str
    setting: str
    before: str
    after: str
    value: object
    line: str  # the command a person would type for it

    def as_dict(self) -> dict:
        """{gpu, setting, before, after, command}, JSON-ready."""
        return {
            "gpu": self.address,
            "setting": self.setting,
            "before": self.before,
            "after": self.after,
            "command": self.line,
        }


# --- input ---------------------------------------------------------------------------------------


def _where(index: int, key: str = "") -> str:
    return f"gpus[{index}]" + (f".{key}" if key else "")


def _positive_int(value, where: str, unit: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise GpuSettingsError(f"{where}: {value!r} is not a positive whole number of {unit}")
    return value


def parse_settings(entries) -> list:
    """Desired entries of the ``gpus`` option, in the given order; raises GpuSettingsError."""
    if not isinstance(entries, list):
        raise GpuSettingsError(
            "gpus: give a list of {gpu, persistence, compute_mode, application_clocks, "
            "power_limit_w} dictionaries"
        )
    out, seen = [], set()
    for index, item in enumerate(entries):
        if not isinstance(item, dict):
            raise GpuSettingsError(f"{_where(index)}: {item!r} is not a dictionary")
        unknown = sorted(str(key) for key in item if key not in _KEYS)
        if unknown:
            raise GpuSettingsError(
                f"{_where(index)}: unknown key(s) {', '.join(unknown)}; the keys are "
                f"{', '.join(_KEYS)}"
            )
        gpu = item.get("gpu")
        if not isinstance(gpu, str) or not gpu.strip():
            raise GpuSettingsError(
                f"{_where(index, 'gpu')}: give the GPU's PCI address (0000:17:00.0) or UUID "
                "(GPU-...)"
            )
        gpu = gpu.strip()
        if gpu.lower() in seen:
            raise GpuSettingsError(f"{_where(index, 'gpu')}: GPU {gpu} is declared twice")
        seen.add(gpu.lower())
        persistence = item.get("persistence")
        if persistence is not None and not isinstance(persistence, bool):
            raise GpuSettingsError(f"{_where(index, 'persistence')}: give true or false")
        mode = item.get("compute_mode")
        if mode is not None:
            if not isinstance(mode, str) or mode.strip().upper() not in COMPUTE_MODES:
                raise GpuSettingsError(
                    f"{_where(index, 'compute_mode')}: {mode!r} is not one of "
                    f"{', '.join(COMPUTE_MODES)}"
                )
            mode = mode.strip().upper()
        clocks = item.get("application_clocks")
        if clocks is not None:
            if not isinstance(clocks, dict) or sorted(clocks) != sorted(_CLOCK_KEYS):
                raise GpuSettingsError(
                    f"{_where(index, 'application_clocks')}: give {{memory_mhz, graphics_mhz}}"
                )
            clocks = tuple(
                _positive_int(clocks[key], _where(index, f"application_clocks.{key}"), "MHz")
                for key in _CLOCK_KEYS
            )
        power = item.get("power_limit_w")
        if power is not None:
            power = _positive_int(power, _where(index, "power_limit_w"), "watts")
        out.append(Desired(gpu, persistence, mode, clocks, power))
    return out


def normalise_address(text: str) -> Optional[str]:
    """``0000:17:00.0`` for a PCI address written with or without (4 or 8 digit) domain, else None."""
    match = _ADDRESS.match(text.strip())
    if not match:
        return None
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):04x}:{bus.lower()}:{device.lower()}.{function}"


def resolve(desired: list, gpus: list) -> list:
    """[(Desired, GpuNow)] with each declared GPU found by address or UUID; GpuSettingsError."""
    by_address = {gpu.address: gpu for gpu in gpus}
    by_uuid = {gpu.uuid.lower(): gpu for gpu in gpus if gpu.uuid}
    out, seen = [], {}
    for index, item in enumerate(desired):
        address = normalise_address(item.gpu)
        found = by_address.get(address) if address else by_uuid.get(item.gpu.lower())
        if found is None:
            known = ", ".join(sorted(by_address)) or "none"
            raise GpuSettingsError(
                f"{_where(index, 'gpu')}: GPU {item.gpu} is not on this host (NVIDIA GPUs: "
                f"{known}); give one of their PCI addresses or UUIDs"
            )
        if found.address in seen:
            raise GpuSettingsError(
                f"{_where(index, 'gpu')}: GPU {item.gpu} is {found.address}, which "
                f"gpus[{seen[found.address]}] declares already"
            )
        seen[found.address] = index
        out.append((item, found))
    return out


# --- showing values ------------------------------------------------------------------------------


def show(setting: str, value) -> str:
    """How ``value`` of ``setting`` is shown in diff, drift and result ("unknown" for None)."""
    if value is None:
        return "unknown"
    if setting == "persistence":
        return "enabled" if value else "disabled"
    if setting == "application_clocks":
        return f"memory {value[0]} MHz, graphics {value[1]} MHz"
    if setting == "power_limit_w":
        return f"{value} W"
    return str(value)


def _current(gpu: GpuNow, setting: str):
    return getattr(gpu, setting)


def _wanted(item: Desired, setting: str):
    return getattr(item, setting)


# --- planning ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Daemon:
    """nvidia-persistenced.service as systemd shows it (``systemctl show``)."""

    installed: bool
    enabled: bool = False
    active: bool = False


def parse_daemon(text: str) -> Daemon:
    """Daemon of ``systemctl show -p LoadState,UnitFileState,ActiveState`` output."""
    values = {}
    for line in text.splitlines():
        key, dummy, value = line.partition("=")
        values[key.strip()] = value.strip()
    installed = values.get("LoadState") == "loaded"
    return Daemon(
        installed,
        enabled=installed and values.get("UnitFileState") in ("enabled", "enabled-runtime"),
        active=installed and values.get("ActiveState") in ("active", "activating", "reloading"),
    )


@dataclass(frozen=True)
class Plan:
    """The change: per-GPU ``changes``, ``daemon_action`` (``enable``/``disable``/None),
    ``busy`` {address: [holder text]} refusals, and ``warnings``."""

    pairs: tuple
    changes: tuple
    daemon_action: Optional[str]
    busy: dict
    warnings: tuple


def _smi_line(address: str, setting: str, value) -> str:
    if setting == "persistence":
        return f"nvidia-smi -i {address} -pm {1 if value else 0}"
    if setting == "compute_mode":
        return f"nvidia-smi -i {address} -c {value}"
    if setting == "application_clocks":
        return f"nvidia-smi -i {address} -ac {value[0]},{value[1]}"
    return f"nvidia-smi -i {address} -pl {value}"


def _check_value(index: int, item: Desired, gpu: GpuNow, mps_gpus: set) -> None:
    """Refuse a value this GPU cannot take (MPS-shared or MIG compute mode, clocks it does not
    list, a power limit outside its constraints); raises GpuSettingsError."""
    where = f"GPU {gpu.address} ({_where(index)})"
    if item.compute_mode is not None and gpu.address in mps_gpus:
        raise GpuSettingsError(
            f"{where}: compute_mode is declared, but an MPS daemon of the plan shares this GPU "
            "and its unit sets the compute mode; leave compute_mode out for this GPU"
        )
    if item.compute_mode is not None and gpu.mig_enabled:
        raise GpuSettingsError(
            f"{where}: compute_mode is declared, but the GPU is in MIG mode (NVML sets a compute "
            "mode per MIG device there); leave compute_mode out for this GPU"
        )
    if item.application_clocks is not None and gpu.supported_clocks is not None:
        memory, graphics = item.application_clocks
        if graphics not in gpu.supported_clocks.get(memory, ()):
            pairs = "; ".join(
                f"memory {m} MHz: graphics {min(g)}-{max(g)} MHz"
                for m, g in sorted(gpu.supported_clocks.items(), reverse=True)
                if g
            )
            raise GpuSettingsError(
                f"{where}: application_clocks memory {memory} MHz, graphics {graphics} MHz is "
                f"not a pair the GPU supports ({pairs or 'it lists none'}); give a listed pair "
                "(nvidia-smi -q -d SUPPORTED_CLOCKS)"
            )
    if item.power_limit_w is not None and None not in (gpu.power_min_w, gpu.power_max_w):
        if not gpu.power_min_w <= item.power_limit_w <= gpu.power_max_w:
            raise GpuSettingsError(
                f"{where}: power_limit_w {item.power_limit_w} is outside the GPU's "
                f"{gpu.power_min_w}-{gpu.power_max_w} W; give a limit in that range"
            )


def plan(
    desired: list,
    gpus: list,
    daemon: Daemon,
    holders_of,
    mps_gpus=(),
    via_daemon: bool = True,
) -> Plan:
    """The change for ``desired`` (parse_settings) on ``gpus`` (GpuNow); raises GpuSettingsError.

    ``holders_of(address)`` lists the texts of the processes with the GPU open (its compute
    mode may only go to EXCLUSIVE_PROCESS without them). ``mps_gpus``: addresses an MPS daemon
    of the plan shares. ``daemon``: nvidia-persistenced; with ``via_daemon`` and the daemon
    installed, persistence is the daemon's (the same value must be declared for every GPU that
    declares it). A busy GPU is not refused here: Plan.busy lists it (``refuse`` raises).
    """
    pairs = resolve(desired, gpus)
    mps = set(mps_gpus)
    for index, (item, gpu) in enumerate(pairs):
        _check_value(index, item, gpu, mps)
    warnings, busy, changes = [], {}, []
    daemon_action = None
    persistence = {item.persistence for item, dummy in pairs if item.persistence is not None}
    use_daemon = via_daemon and daemon.installed and bool(persistence)
    if use_daemon:
        if len(persistence) > 1:
            raise GpuSettingsError(
                f"gpus: persistence is true for some GPUs and false for others, but "
                f"{PERSISTENCED} keeps every GPU of the host alike; declare the same "
                "persistence for every GPU"
            )
        wanted = persistence.pop()
        if wanted and not (daemon.enabled and daemon.active):
            daemon_action = "enable"
        elif not wanted and (daemon.enabled or daemon.active):
            daemon_action = "disable"
    elif persistence and not daemon.installed:
        if any(
            item.persistence is not None and item.persistence != gpu.persistence
            for item, gpu in pairs
        ):
            warnings.append(
                f"{PERSISTENCED} is not installed: persistence mode is set per GPU through "
                "NVML (nvidia-smi -pm), which NVIDIA calls legacy and which a reboot or driver "
                "reload undoes; install the nvidia-persistenced daemon of the driver"
            )
    for item, gpu in pairs:
        for setting in SETTINGS:
            wanted = _wanted(item, setting)
            if wanted is None or wanted == _current(gpu, setting):
                continue
            changes.append(
                Change(
                    gpu.address,
                    setting,
                    show(setting, _current(gpu, setting)),
                    show(setting, wanted),
                    wanted,
                    _smi_line(gpu.address, setting, wanted),
                )
            )
            if setting == "compute_mode" and wanted == "EXCLUSIVE_PROCESS":
                held = list(holders_of(gpu.address))
                if held:
                    busy[gpu.address] = held
    return Plan(tuple(pairs), tuple(changes), daemon_action, busy, tuple(warnings))


def refuse(busy: dict) -> None:
    """Raise GpuSettingsError naming every busy GPU and its holders (``busy`` from Plan)."""
    if not busy:
        return
    lines = "; ".join(
        f"GPU {address} (compute mode to EXCLUSIVE_PROCESS) is in use by {', '.join(held)}"
        for address, held in sorted(busy.items())
    )
    raise GpuSettingsError(
        f"the GPU settings change is refused, nothing was changed: {lines}. EXCLUSIVE_PROCESS "
        "would leave one process the GPU: stop these processes (systemctl stop their unit) "
        "and run again, or declare compute_mode DEFAULT"
    )


def daemon_line(action: str) -> str:
    """The systemctl line for a daemon action (``enable``/``disable``)."""
    return f"systemctl {action} --now {PERSISTENCED}"


def would_run(result_plan: Plan) -> list:
    """The commands the change runs, in order: the daemon first, then per GPU and setting."""
    lines = [daemon_line(result_plan.daemon_action)] if result_plan.daemon_action else []
    for change in result_plan.changes:
        if change.setting == "persistence" and result_plan.daemon_action:
            continue  # the daemon sets it
        lines.append(change.line)
    return lines


# --- holders -------------------------------------------------------------------------------------


def context_holders(holders: list, minors: dict, address: str, listed=(), source="") -> list:
    """Texts of the processes (mig_holders.Holder, kind process) with GPU ``address``'s device
    file /dev/nvidiaN open, N its minor (``minors`` {address: minor}); a GPU whose minor is not
    known counts every process holder. Daemons (nvidia-persistenced, DCGM) and nvidia_drm hold
    no compute context and do not count. ``listed``: PIDs the driver lists on the GPU (NVML's
    compute and graphics processes, nvidia-smi's processes), added as "pid N (listed by
    ``source``)" when /proc did not show them (another PID namespace)."""
    minor = minors.get(address)
    out, seen = [], set()
    for holder in holders:
        if holder.kind != "process":
            continue
        if minor is None:
            hit = holder.holds(address)
        else:
            hit = f"/dev/nvidia{minor}" in holder.devices
        if hit:
            out.append(holder.text())
            seen.add(holder.pid)
    out += [f"pid {pid} (listed by {source})" for pid in listed if pid not in seen]
    return out


# --- backends ------------------------------------------------------------------------------------


class NvmlBackend:
    """Reads and sets through a pynvml-like object (``nvmlInit`` at construction)."""

    name = "nvml"

    def __init__(self, nvml) -> None:
        self.nvml = nvml
        self.failures = (nvml.NVMLError,)
        try:
            nvml.nvmlInit()
        except self.failures as exc:
            raise GpuSettingsError(f"NVML: nvmlInit failed: {exc}") from None
        self.handles: dict = {}

    def close(self) -> None:
        """nvmlShutdown (errors ignored: nothing is left to undo)."""
        try:
            self.nvml.nvmlShutdown()
        except self.failures:
            pass

    def _try(self, name: str, *args):
        try:
            return getattr(self.nvml, name)(*args)
        except self.failures:
            return None

    def read(self) -> list:
        """GpuNow of every GPU NVML enumerates; raises GpuSettingsError when it cannot count."""
        from .gpu import normalise_bus_id

        nvml = self.nvml
        try:
            count = nvml.nvmlDeviceGetCount()
        except self.failures as exc:
            raise GpuSettingsError(f"NVML: nvmlDeviceGetCount failed: {exc}") from None
        out, self.handles = [], {}
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                address = normalise_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId)
            except self.failures + (ValueError,) as exc:
                raise GpuSettingsError(f"NVML: GPU index {index}: {exc}") from None
            self.handles[address] = handle
            out.append(self._read_one(handle, address))
        return out

    def _read_one(self, handle, address: str) -> GpuNow:
        nvml = self.nvml
        uuid = self._try("nvmlDeviceGetUUID", handle)
        persistence = self._try("nvmlDeviceGetPersistenceMode", handle)
        mode = self._try("nvmlDeviceGetComputeMode", handle)
        modes = {
            getattr(nvml, f"NVML_COMPUTEMODE_{name}", None): name
            for name in ("DEFAULT", "EXCLUSIVE_THREAD", "PROHIBITED", "EXCLUSIVE_PROCESS")
        }
        clocks = self._clock_pair("nvmlDeviceGetApplicationsClock", handle)
        default = self._clock_pair("nvmlDeviceGetDefaultApplicationsClock", handle)
        supported = None
        memories = self._try("nvmlDeviceGetSupportedMemoryClocks", handle)
        if memories:
            supported = {}
            for memory in memories:
                graphics = self._try("nvmlDeviceGetSupportedGraphicsClocks", handle, memory)
                supported[int(memory)] = tuple(sorted(int(g) for g in graphics or ()))
        limit = self._try("nvmlDeviceGetPowerManagementLimit", handle)
        default_limit = self._try("nvmlDeviceGetPowerManagementDefaultLimit", handle)
        constraints = self._try("nvmlDeviceGetPowerManagementLimitConstraints", handle)
        mig = self._try("nvmlDeviceGetMigMode", handle)
        pids = set()
        for name in (
            "nvmlDeviceGetComputeRunningProcesses",
            "nvmlDeviceGetGraphicsRunningProcesses",
        ):
            pids.update(int(process.pid) for process in self._try(name, handle) or ())
        return GpuNow(
            address=address,
            uuid=_text(uuid),
            persistence=None if persistence is None else persistence == nvml.NVML_FEATURE_ENABLED,
            compute_mode=None if mode is None else modes.get(mode, f"UNKNOWN ({mode})"),
            application_clocks=clocks,
            default_application_clocks=default,
            supported_clocks=supported,
            power_limit_w=_watts(limit),
            power_default_w=_watts(default_limit),
            power_min_w=_watts(constraints[0]) if constraints else None,
            power_max_w=_watts(constraints[1]) if constraints else None,
            mig_enabled=bool(mig) and mig[0] == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1),
            processes=tuple(sorted(pids)),
        )

    def _clock_pair(self, name: str, handle) -> Optional[tuple]:
        memory = self._try(name, handle, self.nvml.NVML_CLOCK_MEM)
        graphics = self._try(name, handle, self.nvml.NVML_CLOCK_GRAPHICS)
        return None if memory is None or graphics is None else (int(memory), int(graphics))

    def set(self, address: str, setting: str, value) -> str:
        """Set one setting through NVML; returns the call as run; raises GpuSettingsError."""
        nvml, handle = self.nvml, self.handles[address]
        if setting == "persistence":
            call = (
                "nvmlDeviceSetPersistenceMode",
                handle,
                nvml.NVML_FEATURE_ENABLED if value else nvml.NVML_FEATURE_DISABLED,
            )
        elif setting == "compute_mode":
            call = ("nvmlDeviceSetComputeMode", handle, getattr(nvml, f"NVML_COMPUTEMODE_{value}"))
        elif setting == "application_clocks":
            call = ("nvmlDeviceSetApplicationsClocks", handle, value[0], value[1])
        else:
            call = ("nvmlDeviceSetPowerManagementLimit", handle, value * 1000)
        shown = f"{call[0]}({', '.join(str(arg) for arg in call[2:])})"
        try:
            getattr(nvml, call[0])(*call[1:])
        except self.failures as exc:
            code = _code_name(nvml, getattr(exc, "value", None))
            fix = _NVML_FIXES.get(code, "read the GPU's state (nvidia-smi -q) and run again")
            raise GpuSettingsError(f"GPU {address}: {shown} failed: {exc}; {fix}") from None
        return f"GPU {address}: {shown}"


def _code_name(nvml, value) -> str:
    for name in dir(nvml):
        if name.startswith("NVML_ERROR_") and getattr(nvml, name) == value:
            return name
    return ""


def _text(value) -> Optional[str]:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value.strip() if isinstance(value, str) and value.strip() else None


def _watts(milliwatts) -> Optional[int]:
    return None if milliwatts is None else int(round(int(milliwatts) / 1000))


def _tag_int(node, path: str, pattern) -> Optional[int]:
    found = node.find(path) if node is not None else None
    match = pattern.match(found.text or "") if found is not None else None
    return int(round(float(match.group(1)))) if match else None


def parse_smi_xml(text: str) -> list:
    """GpuNow of every ``<gpu>`` of ``nvidia-smi -q -x`` output; raises GpuSettingsError.

    Fields: persistence_mode, compute_mode, applications_clocks and default_applications_clocks
    (mem_clock, graphics_clock), gpu_power_readings (power_readings on older drivers):
    current/default/min/max_power_limit, mig_mode/current_mig, processes/process_info/pid.
    """
    from .gpu import normalise_bus_id

    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError as exc:
        raise GpuSettingsError(f"nvidia-smi -q -x: the output is not XML ({exc})") from None
    out = []
    for node in root.findall("gpu"):
        try:
            address = normalise_bus_id(node.get("id") or "")
        except ValueError as exc:
            raise GpuSettingsError(f"nvidia-smi -q -x: {exc}") from None
        persistence = (node.findtext("persistence_mode") or "").strip().lower()
        mode = (node.findtext("compute_mode") or "").strip().lower().replace(" ", "_")
        power = node.find("gpu_power_readings")
        if power is None:
            power = node.find("power_readings")

        def pair(tag: str, gpu=node) -> Optional[tuple]:
            memory = _tag_int(gpu, f"{tag}/mem_clock", _MHZ)
            graphics = _tag_int(gpu, f"{tag}/graphics_clock", _MHZ)
            return None if memory is None or graphics is None else (memory, graphics)

        pids = tuple(
            int(pid.text)
            for pid in node.findall("processes/process_info/pid")
            if (pid.text or "").strip().isdigit()
        )
        out.append(
            GpuNow(
                address=address,
                uuid=(node.findtext("uuid") or "").strip() or None,
                name=(node.findtext("product_name") or "").strip() or None,
                persistence={"enabled": True, "disabled": False}.get(persistence),
                compute_mode=_SMI_MODES.get(mode),
                application_clocks=pair("applications_clocks"),
                default_application_clocks=pair("default_applications_clocks"),
                power_limit_w=_tag_int(power, "current_power_limit", _WATTS),
                power_default_w=_tag_int(power, "default_power_limit", _WATTS),
                power_min_w=_tag_int(power, "min_power_limit", _WATTS),
                power_max_w=_tag_int(power, "max_power_limit", _WATTS),
                mig_enabled=(node.findtext("mig_mode/current_mig") or "").strip().lower()
                == "enabled",
                processes=pids,
            )
        )
    return sorted(out, key=lambda gpu: gpu.address)


class SmiBackend:
    """Reads ``nvidia-smi -q -x``; sets with ``nvidia-smi -i ADDRESS -pm/-c/-ac/-pl``."""

    name = "nvidia-smi"

    def __init__(self, runner, path: str) -> None:
        self.runner = runner
        self.path = path

    def close(self) -> None:
        """Nothing to close."""

    def _run(self, argv: list) -> str:
        rc, out, err = self.runner(argv)
        if rc != 0:
            text = " ".join(["nvidia-smi"] + argv[1:])
            raise GpuSettingsError(
                f"{text} failed (rc {rc}): {(err or out).strip()[:200]}; run it by hand as root "
                "to see why, fix that and run again"
            )
        return out

    def read(self) -> list:
        """GpuNow of every GPU nvidia-smi lists; raises GpuSettingsError."""
        return parse_smi_xml(self._run([self.path, "-q", "-x"]))

    def set(self, address: str, setting: str, value) -> str:
        """Run the nvidia-smi set option; returns the line run; raises GpuSettingsError."""
        line = _smi_line(address, setting, value)
        self._run([self.path] + line.split()[1:])
        return line


class SnapshotBackend:
    """Render mode: reads a gpu_topology snapshot; ``set`` changes the copy in memory and
    ``save`` writes it back (persistence_mode, compute_mode and, in the optional keys
    ``application_clocks`` and ``power_limit`` of each GPU record, clocks and power limit)."""

    name = "snapshot"

    def __init__(self, path: str) -> None:
        from . import gpu_snapshot

        self.path = path
        self.state = gpu_snapshot.read_snapshot(path)
        self.dirty = False

    def close(self) -> None:
        """Nothing to close."""

    def read(self) -> list:
        """GpuNow of every GPU in the snapshot."""
        out = []
        for address, record in sorted(self.state.gpus.items()):
            clocks = record.get("application_clocks") or {}
            power = record.get("power_limit") or {}
            mode = record.get("compute_mode")
            persistence = record.get("persistence_mode")
            supported = clocks.get("supported")
            out.append(
                GpuNow(
                    address=address,
                    uuid=record.get("uuid"),
                    name=record.get("name"),
                    persistence=None if persistence is None else persistence == "enabled",
                    compute_mode=None if mode is None else _SMI_MODES.get(mode, mode.upper()),
                    application_clocks=_pair(clocks, "memory_mhz", "graphics_mhz"),
                    default_application_clocks=_pair(
                        clocks, "default_memory_mhz", "default_graphics_mhz"
                    ),
                    supported_clocks=None
                    if supported is None
                    else {int(i["memory_mhz"]): tuple(i["graphics_mhz"]) for i in supported},
                    power_limit_w=power.get("current_w"),
                    power_default_w=power.get("default_w"),
                    power_min_w=power.get("min_w"),
                    power_max_w=power.get("max_w"),
                    mig_enabled=((record.get("mig") or {}).get("mode_current") == "enabled"),
                    processes=tuple(record.get("processes") or ()),
                )
            )
        return out

    def set(self, address: str, setting: str, value) -> str:
        """Record the setting in the snapshot copy; returns what a host would run."""
        record = self.state.gpus[address]
        if setting == "persistence":
            record["persistence_mode"] = "enabled" if value else "disabled"
        elif setting == "compute_mode":
            record["compute_mode"] = value.lower()
        elif setting == "application_clocks":
            clocks = dict(record.get("application_clocks") or {})
            clocks.update(memory_mhz=value[0], graphics_mhz=value[1])
            record["application_clocks"] = clocks
        else:
            power = dict(record.get("power_limit") or {})
            power["current_w"] = value
            record["power_limit"] = power
        self.dirty = True
        return _smi_line(address, setting, value)

    def save(self) -> bool:
        """Write the snapshot back when a setting was recorded; whether it was written."""
        from . import gpu_snapshot

        if self.dirty:
            gpu_snapshot.write_snapshot(self.path, self.state)
        return self.dirty


def _pair(values: dict, memory: str, graphics: str) -> Optional[tuple]:
    if values.get(memory) is None or values.get(graphics) is None:
        return None
    return (values[memory], values[graphics])


def choose_backend(choice: str, snapshot: Optional[str], runner, which, load_nvml):
    """The backend for the ``backend``/``snapshot`` options; raises GpuSettingsError."""
    if snapshot:
        return SnapshotBackend(snapshot)
    backend, reasons = pick_backend(
        choice,
        (
            Way("nvml", load_nvml, NvmlBackend, NVML_MISSING),
            Way(
                "nvidia-smi",
                lambda: which("nvidia-smi"),
                lambda path: SmiBackend(runner, path),
                SMI_MISSING,
            ),
        ),
        (GpuSettingsError,),
    )
    if backend is not None:
        return backend
    raise GpuSettingsError(
        f"backend={choice}: no way to reach the GPUs: {'; '.join(reasons)}. Install the NVIDIA "
        "driver (nvidia-smi) or nvidia-ml-py, or remove numafleet_gpu_settings for this host"
    )


# --- the module's run ----------------------------------------------------------------------------


def check_read_back(pairs: list, gpus: list, daemon_only: bool = False) -> None:
    """Raise GpuSettingsError for a declared setting the GPU does not report after the change."""
    now = {gpu.address: gpu for gpu in gpus}
    wrong = []
    for item, before in pairs:
        gpu = now.get(before.address)
        for setting in SETTINGS:
            wanted = _wanted(item, setting)
            if wanted is None or gpu is None or _current(gpu, setting) == wanted:
                continue
            if _current(gpu, setting) is None and setting in (
                "application_clocks",
                "power_limit_w",
            ):
                continue  # the source cannot read it back (nvidia-smi N/A): nothing to compare
            wrong.append(
                f"GPU {before.address} {setting}: asked {show(setting, wanted)}, it reports "
                f"{show(setting, _current(gpu, setting))}"
            )
    if wrong:
        raise GpuSettingsError(
            "the GPU settings were set, but the GPUs report otherwise: "
            + "; ".join(wrong)
            + ". Read the GPU state (nvidia-smi -q) and the driver log (dmesg), fix the cause "
            "and run again"
        )


def drift(pairs: list) -> list:
    """The gpu layer's ``drift``: {setting: "GPU <address> <setting>", planned, actual, reason,
    pending} per declared setting the GPU reported otherwise before the run."""
    out = []
    for item, gpu in pairs:
        for setting in SETTINGS:
            wanted = _wanted(item, setting)
            if wanted is None or wanted == _current(gpu, setting):
                continue
            out.append(
                {
                    "setting": f"GPU {gpu.address} {setting}",
                    "planned": show(setting, wanted),
                    "actual": show(setting, _current(gpu, setting)),
                    "reason": "",
                    "pending": False,
                }
            )
    return out


def as_gpu(item: Desired, before: GpuNow, after: GpuNow) -> dict:
    """One GPU of the result: {address, uuid, settings: {setting: {declared, before, after}}}."""
    settings = {}
    for setting in SETTINGS:
        wanted = _wanted(item, setting)
        if wanted is None:
            continue
        settings[setting] = {
            "declared": show(setting, wanted),
            "before": show(setting, _current(before, setting)),
            "after": show(setting, _current(after, setting)),
        }
    return {"address": before.address, "uuid": before.uuid, "settings": settings}


def as_diff(changes) -> list:
    """One {before_header, after_header, before, after} per GPU with changes."""
    by_gpu: dict = {}
    for change in changes:
        by_gpu.setdefault(change.address, []).append(change)
    return [
        {
            "before_header": f"NVIDIA GPU {address} settings",
            "after_header": f"NVIDIA GPU {address} settings",
            "before": "".join(f"{c.setting}: {c.before}\n" for c in items),
            "after": "".join(f"{c.setting}: {c.after}\n" for c in items),
        }
        for address, items in sorted(by_gpu.items())
    ]


def run(params: dict, check_mode: bool, host, ran: Optional[list] = None) -> dict:
    """The nvidia_gpu_settings module's result for its ``params``; raises NumaTuneError.

    ``host`` gives ``runner(argv) -> (rc, out, err)``, ``which(name)`` (None when absent),
    ``load_nvml()`` (pynvml or None), ``holders()`` ([mig_holders.Holder] of the host, only
    called outside render mode) and ``minors()`` ({address: device minor}). ``ran``: the list
    the commands and NVML calls run are appended to (the result's ``ran``; kept on failure).
    """
    desired = parse_settings(params["gpus"])
    render = bool(params.get("snapshot"))
    systemd = params["service_manager"] == "systemd" and not render
    result = {
        "changed": False,
        "gpus": [],
        "changes": [],
        "busy": {},
        "would_run": [],
        "ran": ran if ran is not None else [],
        "backend": None,
        "snapshot_written": False,
        "drift": [],
        "warnings": [],
        "diff": [],
    }
    if not desired:
        return result
    backend = choose_backend(
        params["backend"], params.get("snapshot"), host.runner, host.which, host.load_nvml
    )
    result["backend"] = backend.name
    try:
        gpus = backend.read()
        daemon = Daemon(False)
        systemctl = host.which("systemctl") or "systemctl"
        if systemd:
            rc, out, dummy = host.runner(
                [systemctl, "show", "-p", "LoadState,UnitFileState,ActiveState", PERSISTENCED]
            )
            daemon = parse_daemon(out) if rc == 0 else Daemon(False)
        if render:
            recorded = {gpu.address: gpu.processes for gpu in gpus}

            def holders_of(address):
                return [f"pid {pid} (recorded in the snapshot)" for pid in recorded[address]]

        else:
            holders, minors = host.holders(), host.minors()
            listed = {gpu.address: gpu.processes for gpu in gpus}

            def holders_of(address):
                return context_holders(holders, minors, address, listed[address], backend.name)

        change = plan(desired, gpus, daemon, holders_of, params.get("mps_gpus") or ())
        refuse(change.busy)
        result["would_run"] = would_run(change)
        ran = result["ran"]
        after = gpus
        if change.changes or change.daemon_action:
            if not check_mode:
                if change.daemon_action:
                    argv = [systemctl, change.daemon_action, "--now", PERSISTENCED]
                    rc, dummy, err = host.runner(argv)
                    if rc != 0:
                        raise GpuSettingsError(
                            f"{daemon_line(change.daemon_action)} failed (rc {rc}): "
                            f"{err.strip()}; fix the unit and run again"
                        )
                    ran.append(daemon_line(change.daemon_action))
                    gpus_now = {gpu.address: gpu for gpu in backend.read()}
                else:
                    gpus_now = {gpu.address: gpu for gpu in gpus}
                for item in change.changes:
                    current = gpus_now.get(item.address)
                    if current is not None and _current(current, item.setting) == item.value:
                        continue  # the daemon set it
                    line = backend.set(item.address, item.setting, item.value)
                    if not render:  # render mode runs nothing: would_run lists the lines
                        ran.append(line)
                if render:
                    result["snapshot_written"] = backend.save()
                after = backend.read()
                check_read_back(list(change.pairs), after)
            else:
                after = [_predicted(gpu, change) for gpu in gpus]
    finally:
        backend.close()
    now = {gpu.address: gpu for gpu in after}
    result.update(
        changed=bool(change.changes or change.daemon_action),
        gpus=[as_gpu(item, gpu, now.get(gpu.address, gpu)) for item, gpu in change.pairs],
        changes=[item.as_dict() for item in change.changes],
        drift=drift(list(change.pairs)) + _daemon_drift(change.daemon_action, daemon),
        warnings=list(change.warnings),
        diff=as_diff(change.changes),
    )
    return result


def _daemon_drift(action: Optional[str], daemon: Daemon) -> list:
    """A drift entry for nvidia-persistenced when it is not as the declarations want."""
    if not action:
        return []

    def state(enabled: bool, active: bool) -> str:
        return f"{'enabled' if enabled else 'disabled'}, {'active' if active else 'inactive'}"

    return [
        {
            "setting": PERSISTENCED,
            "planned": state(action == "enable", action == "enable"),
            "actual": state(daemon.enabled, daemon.active),
            "reason": "",
            "pending": False,
        }
    ]


def _predicted(gpu: GpuNow, change: Plan) -> GpuNow:
    """``gpu`` as the change would leave it (check mode)."""
    values = {c.setting: c.value for c in change.changes if c.address == gpu.address}
    return replace(gpu, **values)
