# Private to this collection: may change in any release.
"""CUDA MPS control daemons of a plan: the ``nvidia-mps@.service`` template, one drop-in per daemon.

``render_files`` turns ``plan["mps_daemons"]`` into ``{path: text}`` (paths as on the host); the
file changes, the manifest and the writes are those of units.py. ``plan_actions`` says which
daemons to start, restart and disable. ``parse_*`` read back what ``nvidia-cuda-mps-control``
answers, so that a daemon whose live defaults drifted from the plan can be seen and fixed.

Compute mode: a daemon of a whole GPU sets it to EXCLUSIVE_PROCESS before it starts and back to
DEFAULT after it stops (NVIDIA's MPS guide, "Starting MPS control daemon"). A daemon of a MIG
device sets none: the MIG user guide ("MIG with CUDA MPS") says EXCLUSIVE_PROCESS is not supported
when the GPU is in MIG mode, where each MIG device runs its own MPS server.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Callable, Optional

from .cpulist import format_cpulist
from .errors import NumaTuneError, UnitRenderError
from .units import (
    DROPIN_NAME,
    Actions,
    FileChange,
    account_name,
    check_host_path,
    check_path,
    escape_specifiers,
    header_lines,
    is_dropin,
    under_root,
    unit_document,
    unit_of,
)

TEMPLATE_UNIT = "nvidia-mps@.service"
DEFAULT_MANIFEST_PATH = "/etc/numafleet/mps-units.json"
DEFAULT_CONTROL = "/usr/bin/nvidia-cuda-mps-control"
DEFAULT_NVIDIA_SMI = "/usr/bin/nvidia-smi"
SHELL = "/bin/sh"
PIPE_ROOT = "/run/nvidia-mps"
LOG_ROOT = "/var/log/nvidia-mps"

_REPLAN = (
    "pass the numafleet_plan fact made by numafleet.tuning.numa_plan as it is, "
    "and fix the host_vars it was planned from"
)
# A device UUID as nvidia-smi prints it (GPU-..., MIG-...): also a valid unit instance name.
_INSTANCE = re.compile(r"^(GPU|MIG)-[A-Za-z0-9-]+\Z")
_ADDRESS = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z")
_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*\$?\Z")
# Programs run inside '/bin/sh -c ...' and as plain ExecStart= words: nothing to quote or expand.
_PROGRAM = re.compile(r"^/[A-Za-z0-9/._+-]+\Z")
_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*\Z")
_MEM_LIMIT = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT])(?:i?B)?\b", re.IGNORECASE)
_MEM_FACTOR_MIB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


class MpsControlError(NumaTuneError):
    """A command sent to a running nvidia-cuda-mps-control daemon failed; names the unit and fix."""


# --- plan access -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Daemon:
    """One planned MPS control daemon, checked: everything its drop-in needs."""

    unit: str
    instance: str
    gpu_address: str
    gpu_uuid: Optional[str]
    mig: bool
    node: Optional[int]
    cpus: tuple
    mems: tuple
    user: Optional[str]
    group: Optional[str]
    active_thread_percentage: Optional[int]
    pinned_memory_limit_kb: Optional[int]
    pipe_dir: str
    log_dir: str
    clients: tuple

    @property
    def pinned_memory_limit_mib(self) -> Optional[int]:
        """The limit as the whole MiB the control daemon takes (at least 1), None when unset."""
        if self.pinned_memory_limit_kb is None:
            return None
        return max(self.pinned_memory_limit_kb // 1024, 1)

    def as_dict(self) -> dict:
        """The daemon as the module returns it."""
        return {
            "unit": self.unit,
            "instance": self.instance,
            "gpu_address": self.gpu_address,
            "gpu_uuid": self.gpu_uuid,
            "mig": self.mig,
            "node": self.node,
            "cpus": list(self.cpus),
            "mems": list(self.mems),
            "user": self.user,
            "group": self.group,
            "active_thread_percentage": self.active_thread_percentage,
            "pinned_memory_limit_mib": self.pinned_memory_limit_mib,
            "pipe_dir": self.pipe_dir,
            "log_dir": self.log_dir,
            "clients": list(self.clients),
        }


def _field(entry: dict, key: str, kinds: tuple, where: str, required: bool = True):
    if key not in entry or (entry[key] is None and not required):
        if required:
            raise UnitRenderError(f"{where} has no {key!r}; {_REPLAN}")
        return None
    value = entry[key]
    if (
        value is None
        or (isinstance(value, bool) and bool not in kinds)
        or not isinstance(value, kinds)
    ):
        names = " or ".join(kind.__name__ for kind in kinds)
        raise UnitRenderError(f"{where}.{key} is {value!r}, not a {names}; {_REPLAN}")
    return value


def _numbers(entry: dict, key: str, where: str) -> tuple:
    values = _field(entry, key, (list,), where)
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values):
        raise UnitRenderError(
            f"{where}.{key} is {values!r}, not a non-empty list of CPU or node numbers; {_REPLAN}"
        )
    return tuple(sorted(set(values)))


def _account(entry: dict, key: str, where: str) -> Optional[str]:
    value = _field(entry, key, (str,), where, required=False)
    if value is not None and not _USER.match(value):
        raise UnitRenderError(
            f"{where}.{key}: {value!r} is not a user or group name systemd takes; use the "
            "clients' account name (letters, digits, _ . -), or leave it unset for root"
        )
    return value if value is None else account_name(value, f"{where}.{key}")


def _daemon(entry: dict, where: str) -> Daemon:
    instance = _field(entry, "instance", (str,), where)
    if not _INSTANCE.match(instance):
        raise UnitRenderError(
            f"{where}.instance: {instance!r} is not a GPU-... or MIG-... device UUID usable as "
            f"an nvidia-mps@ instance; {_REPLAN}"
        )
    unit = f"nvidia-mps@{instance}.service"
    if _field(entry, "unit", (str,), where) != unit:
        raise UnitRenderError(f"{where}.unit is {entry['unit']!r}, expected {unit!r}; {_REPLAN}")
    address = _field(entry, "gpu_address", (str,), where)
    if not _ADDRESS.match(address):
        raise UnitRenderError(
            f"{where}.gpu_address: {address!r} is not a PCI address like 0000:17:00.0; {_REPLAN}"
        )
    for key, root in (("pipe_dir", PIPE_ROOT), ("log_dir", LOG_ROOT)):
        want = f"{root}/{instance}"
        if _field(entry, key, (str,), where) != want:
            raise UnitRenderError(
                f"{where}.{key} is {entry[key]!r}; the nvidia-mps@ template uses {want} "
                f"(from the instance name), so clients would look elsewhere; {_REPLAN}"
            )
    percentage = _field(entry, "active_thread_percentage", (int,), where, required=False)
    if percentage is not None and not 1 <= percentage <= 100:
        raise UnitRenderError(
            f"{where}.active_thread_percentage is {percentage}, not 1-100; set "
            "mps.active_thread_percentage of its clients between 1 and 100"
        )
    pinned = _field(entry, "pinned_memory_limit_kb", (int,), where, required=False)
    if pinned is not None and pinned <= 0:
        raise UnitRenderError(
            f"{where}.pinned_memory_limit_kb is {pinned}, not above 0; set "
            "mps.pinned_memory_limit of its clients to a size such as 8G, or leave it unset"
        )
    clients = _field(entry, "clients", (list,), where, required=False) or []
    node = _field(entry, "node", (int,), where, required=False)
    return Daemon(
        unit=unit,
        instance=instance,
        gpu_address=address,
        gpu_uuid=_field(entry, "gpu_uuid", (str,), where, required=False),
        mig=_field(entry, "mig", (bool,), where),
        node=node,
        cpus=_numbers(entry, "cpus", where),
        mems=_numbers(entry, "mems", where),
        user=_account(entry, "user", where),
        group=_account(entry, "group", where),
        active_thread_percentage=percentage,
        pinned_memory_limit_kb=pinned,
        pipe_dir=entry["pipe_dir"],
        log_dir=entry["log_dir"],
        clients=tuple(str(client) for client in clients),
    )


def plan_daemons(plan: dict) -> tuple[list[Daemon], list[str]]:
    """(daemons to run sorted by unit, warnings for daemons skipped); raises UnitRenderError.

    A daemon of a MIG instance that does not exist yet (``instance`` None; ``waits_for`` as its
    client's) is skipped with a warning: no unit is written or started for it; it gets its unit,
    and is started, once the instance exists and the plan is made again (host_apply's re-plan
    after the MIG layer, or the next run).
    """
    if not isinstance(plan, dict):
        raise UnitRenderError(f"plan is {type(plan).__name__}, not a mapping; {_REPLAN}")
    host = plan.get("host")
    prefix = f"host {host}: " if isinstance(host, str) and host else ""
    if "mps_daemons" not in plan:
        raise UnitRenderError(
            f"{prefix}plan has no mps_daemons (a plan from an older numafleet.tuning, or not a "
            f"plan); {_REPLAN}"
        )
    entries = plan["mps_daemons"]
    if not isinstance(entries, list):
        raise UnitRenderError(f"{prefix}plan mps_daemons is {entries!r}, not a list; {_REPLAN}")
    daemons: dict[str, Daemon] = {}
    warnings = []
    for index, entry in enumerate(entries):
        where = f"plan mps_daemons[{index}]"
        if not isinstance(entry, dict):
            raise UnitRenderError(f"{prefix}{where} is not a mapping; {_REPLAN}")
        clients = entry.get("clients") or []
        if entry.get("instance") is None and "instance" in entry:
            waits = entry.get("waits_for") if isinstance(entry.get("waits_for"), dict) else {}
            why = (
                f" (waits for MIG instance {waits.get('mig_instance')}: {waits.get('reason')}; "
                "not started until it exists)"
                if waits
                else ""
            )
            warnings.append(
                f"{prefix}MPS daemon for {', '.join(str(c) for c in clients) or 'no client'} on "
                f"GPU {entry.get('gpu_address')} skipped: its MIG instance does not exist yet; "
                f"create it (numafleet.tuning.nvidia_mig) and plan again{why}"
            )
            continue
        try:
            daemon = _daemon(entry, where)
        except UnitRenderError as exc:
            raise UnitRenderError(f"{prefix}{exc}") from None
        if daemon.unit in daemons:
            raise UnitRenderError(f"{prefix}{where}: {daemon.unit} is planned twice; {_REPLAN}")
        daemons[daemon.unit] = daemon
    return [daemons[unit] for unit in sorted(daemons)], warnings


# --- rendering ---------------------------------------------------------------------------------


def _program(option: str, value: str) -> str:
    path = check_host_path(option, value)
    check_path(value, option, program=True)  # as given: a trailing / names a directory
    if not _PROGRAM.match(path):
        raise UnitRenderError(
            f"{option}: {value!r} holds characters other than letters, digits and / . _ + -; "
            "give a plain absolute path (a symlink if the real one is awkward)"
        )
    return path


def control_command(control: str, command: str) -> str:
    """An Exec*= line that sends ``command`` (validated words only) to the control daemon."""
    return f"{SHELL} -c 'echo {command} | {control}'"


def render_template(header: list[str], control: str) -> str:
    """Text of ``nvidia-mps@.service``: one daemon per instance (a device UUID)."""
    unit = [
        ("Description", "NVIDIA CUDA MPS control daemon for %i"),
        ("After", "numafleet-mig.service nvidia-persistenced.service"),
    ]
    service = [
        ("Type", "forking"),
        ("Environment", '"CUDA_VISIBLE_DEVICES=%i"'),
        ("Environment", f'"CUDA_MPS_PIPE_DIRECTORY={PIPE_ROOT}/%i"'),
        ("Environment", f'"CUDA_MPS_LOG_DIRECTORY={LOG_ROOT}/%i"'),
        ("RuntimeDirectory", "nvidia-mps/%i"),
        ("RuntimeDirectoryMode", "0700"),
        ("LogsDirectory", "nvidia-mps/%i"),
        ("LogsDirectoryMode", "0750"),
        ("ExecStart", f"{control} -d"),
        ("ExecStop", control_command(control, "quit")),
        ("Restart", "on-failure"),
    ]
    return unit_document(
        header,
        [("Unit", unit), ("Service", service), ("Install", [("WantedBy", "multi-user.target")])],
    )


def render_dropin(daemon: Daemon, header: list[str], control: str, nvidia_smi: str) -> str:
    """Text of ``nvidia-mps@<instance>.service.d/50-numafleet.conf`` for ``daemon``."""
    what = f"MPS daemon {daemon.unit}"
    # No client names here: adding or removing a client must not change (and so restart) the
    # daemon, which would restart every other client through their Requires=.
    device = "MIG device" if daemon.mig else "GPU"
    description = f"NVIDIA CUDA MPS control daemon, {device} {daemon.instance}"
    unit = [("Description", escape_specifiers(description, f"{what}.clients"))]
    cpus, mems = format_cpulist(list(daemon.cpus)), format_cpulist(list(daemon.mems))
    service = []
    if daemon.user:
        service.append(("User", daemon.user))
    if daemon.group:
        service.append(("Group", daemon.group))
    service.extend(
        [
            ("CPUAffinity", cpus),
            ("NUMAPolicy", "bind"),
            ("NUMAMask", mems),
            ("AllowedCPUs", cpus),
            ("AllowedMemoryNodes", mems),
        ]
    )
    if not daemon.mig:
        # '+': run with full privileges even when User= is set (nvidia-smi -c needs root).
        service.append(
            ("ExecStartPre", f"+{nvidia_smi} -i {daemon.gpu_address} -c EXCLUSIVE_PROCESS")
        )
    if daemon.active_thread_percentage is not None:
        command = f"set_default_active_thread_percentage {daemon.active_thread_percentage}"
        service.append(("ExecStartPost", control_command(control, command)))
    if daemon.pinned_memory_limit_mib is not None:
        # Device 0: the daemon sees only its own device (CUDA_VISIBLE_DEVICES=%i).
        command = f"set_default_device_pinned_mem_limit 0 {daemon.pinned_memory_limit_mib}M"
        service.append(("ExecStartPost", control_command(control, command)))
    if not daemon.mig:
        service.append(("ExecStopPost", f"+{nvidia_smi} -i {daemon.gpu_address} -c DEFAULT"))
    return unit_document(header, [("Unit", unit), ("Service", service)])


def render_files(
    daemons: list[Daemon],
    header: str,
    unit_dir: str,
    control: str = DEFAULT_CONTROL,
    nvidia_smi: str = DEFAULT_NVIDIA_SMI,
) -> dict[str, str]:
    """{path as on the host: text}: the template and one drop-in per daemon ({} without daemons).

    Raises UnitRenderError on a bad header, directory or program path.
    """
    unit_dir = check_host_path("unit_dir", unit_dir)
    control = _program("nvidia_cuda_mps_control", control)
    nvidia_smi = _program("nvidia_smi", nvidia_smi)
    lines = header_lines(header)
    if not daemons:
        return {}
    files = {posixpath.join(unit_dir, TEMPLATE_UNIT): render_template(lines, control)}
    for daemon in daemons:
        path = posixpath.join(unit_dir, f"{daemon.unit}.d", DROPIN_NAME)
        files[path] = render_dropin(daemon, lines, control, nvidia_smi)
    return dict(sorted(files.items()))


# --- actions -----------------------------------------------------------------------------------

_STATE = {"create": "new", "update": "changed", "remove": "removed", "unchanged": "unchanged"}


def plan_actions(changes: list[FileChange], daemons: list[Daemon]) -> Actions:
    """Daemons by state and the ones to disable, restart and start after ``changes``; no I/O.

    A new drop-in starts (and enables) its daemon, a changed one restarts it, a removed one
    disables and stops it first. A changed template restarts every daemon that is not new.
    """
    units: dict = {state: [] for state in ("new", "changed", "removed", "unchanged")}
    planned = {daemon.unit for daemon in daemons}
    template_changed = any(
        not is_dropin(c.path) and c.state != "unchanged" and unit_of(c.path) == TEMPLATE_UNIT
        for c in changes
    )
    for change in changes:
        if is_dropin(change.path):
            units[_STATE[change.state]].append(unit_of(change.path))
    new = set(units["new"])
    restart = set(units["changed"])
    if template_changed:
        restart |= planned - new
    for unit in sorted(restart & set(units["unchanged"])):
        units["unchanged"].remove(unit)
        units["changed"].append(unit)
    return Actions(
        units={state: sorted(names) for state, names in units.items()},
        slices={state: [] for state in ("new", "changed", "removed", "unchanged")},
        reload_needed=any(change.state != "unchanged" for change in changes),
        disable=tuple(sorted(units["removed"])),
        restart=tuple(sorted(restart)),
        start=tuple(sorted(new)),
    )


# --- live settings -----------------------------------------------------------------------------


def parse_thread_percentage(text: str) -> Optional[int]:
    """The percentage ``get_default_active_thread_percentage`` printed ("25.0"), None if unclear."""
    lines = [line for line in (text or "").splitlines() if line.strip()]
    match = _PERCENT.match(lines[-1]) if lines else None
    if match is None:
        return None
    value = float(match.group(1))
    return int(value) if value == int(value) else None


def parse_pinned_mem_limit(text: str) -> Optional[int]:
    """MiB from ``get_default_device_pinned_mem_limit 0`` ("3G", "8192M"); 0 when it says none.

    None when the answer does not parse.
    """
    text = (text or "").strip()
    if not text:
        return None
    if text.lower() in ("0", "none", "unlimited", "not set", "n/a"):
        return 0
    match = _MEM_LIMIT.search(text)
    if match is None:
        return None
    mib = float(match.group(1)) * _MEM_FACTOR_MIB[match.group(2).upper()]
    return int(mib) if mib == int(mib) else None


Runner = Callable[[list, str, dict], tuple]


@dataclass(frozen=True)
class Setting:
    """One live default of a running daemon: planned value, running value (None: unknown)."""

    name: str
    planned: Optional[int]
    running: Optional[int]

    @property
    def drifted(self) -> bool:
        """Whether the daemon runs with a value other than the planned one (known on both sides)."""
        return (
            self.planned is not None and self.running is not None and self.planned != self.running
        )


def _ask(runner: Runner, control: str, daemon: Daemon, command: str) -> tuple:
    env = {"CUDA_MPS_PIPE_DIRECTORY": daemon.pipe_dir, "LC_ALL": "C", "LANG": "C"}
    return runner([control], f"{command}\n", env)


def read_settings(runner: Runner, control: str, daemon: Daemon) -> list[Setting]:
    """The running daemon's thread percentage and pinned memory limit next to the plan's.

    ``runner(argv, stdin, environment) -> (rc, stdout, stderr)``; a failed or unreadable answer
    gives running None (never an error: the daemon may be an older driver's).
    """
    rc, out, dummy = _ask(runner, control, daemon, "get_default_active_thread_percentage")
    percentage = parse_thread_percentage(out) if rc == 0 else None
    rc, out, dummy = _ask(runner, control, daemon, "get_default_device_pinned_mem_limit 0")
    limit = parse_pinned_mem_limit(out) if rc == 0 else None
    return [
        Setting("active_thread_percentage", daemon.active_thread_percentage, percentage),
        Setting("pinned_memory_limit_mib", daemon.pinned_memory_limit_mib, limit),
    ]


def set_commands(settings: list[Setting]) -> list[str]:
    """The control commands that bring drifted settings back to the plan."""
    commands = []
    for setting in settings:
        if not setting.drifted:
            continue
        if setting.name == "active_thread_percentage":
            commands.append(f"set_default_active_thread_percentage {setting.planned}")
        else:
            commands.append(f"set_default_device_pinned_mem_limit 0 {setting.planned}M")
    return commands


def write_settings(runner: Runner, control: str, daemon: Daemon, commands: list[str]) -> list[str]:
    """Send ``commands`` to the daemon; the ones that ran. Raises MpsControlError when one fails."""
    ran = []
    for command in commands:
        rc, out, err = _ask(runner, control, daemon, command)
        if rc != 0:
            detail = (err or out or "").strip().splitlines()
            raise MpsControlError(
                f"{daemon.unit}: '{command}' sent to {control} failed (rc {rc}): "
                f"{detail[0] if detail else 'no output'}; check the daemon's log in "
                f"{daemon.log_dir}/control.log, or restart it (systemctl restart {daemon.unit})"
            )
        ran.append(f"CUDA_MPS_PIPE_DIRECTORY={daemon.pipe_dir} {control} <<< '{command}'")
    return ran


def as_settings(daemon: Daemon, settings: list[Setting]) -> dict:
    """One entry of the module's ``settings``: {unit, <name>: {planned, running}}."""
    entry: dict = {"unit": daemon.unit}
    for setting in settings:
        entry[setting.name] = {"planned": setting.planned, "running": setting.running}
    return entry


def sync_settings(
    runner: Runner, systemctl: str, control: str, daemons: list, actions: Actions, apply: bool
) -> tuple[list, list, bool]:
    """(settings entries, commands ran, whether a live default is/was to be set) for active daemons.

    Daemons that are started in this run are skipped; a daemon that is restarted anyway gets its
    planned defaults from ExecStartPost= and is only reported. With ``apply`` the drifted defaults
    are set live. Raises MpsControlError when a set command fails.
    """
    entries, ran, drift = [], [], False
    for daemon in daemons:
        if daemon.unit in actions.start:
            continue
        rc = runner([systemctl, "is-active", "--quiet", daemon.unit], None, {"LC_ALL": "C"})[0]
        if rc != 0:
            continue
        found = read_settings(runner, control, daemon)
        entries.append(as_settings(daemon, found))
        fix = [] if daemon.unit in actions.restart else set_commands(found)
        if fix and apply:
            ran.extend(write_settings(runner, control, daemon, fix))
        drift = drift or bool(fix)
    return entries, ran, drift


def check_manifest_owner(manifest_path: str, files) -> None:
    """Refuse a manifest that lists files other than MPS units; raises UnitRenderError.

    The files a manifest lists that are no longer wanted are removed and their units disabled,
    so a manifest_path pointing at another module's manifest (pinned_units' own) would stop and
    delete every pinned service.
    """
    foreign = sorted(path for path in files if "/nvidia-mps@" not in path)
    if foreign:
        raise UnitRenderError(
            f"manifest_path: {manifest_path} lists files that are not MPS daemon units "
            f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}): it belongs to "
            f"another module (pinned_units uses /etc/numafleet/manifest.json); give nvidia_mps its "
            f"own manifest, e.g. {DEFAULT_MANIFEST_PATH}"
        )


# --- render mode: the recorded daemons -----------------------------------------------------------

# Render mode has no running daemon to ask. The recording below the render root stands for the
# control daemons of the rendered host: an apply in render mode records every planned daemon with
# the defaults its ExecStartPost= sets (what a started daemon reports), and check mode reads them
# back as it would ask a live daemon. Format (docs/architecture.md, "Render mode and the demo
# fleet"): {"format": RECORDING_FORMAT, "version": 1, "daemons": {unit: {
# "active_thread_percentage": int or null, "pinned_memory_limit_mib": int or null}}}.
RECORDING_PATH = "/var/lib/numafleet/render/mps-daemons.json"
RECORDING_FORMAT = "numafleet.tuning/mps-recording"
_RECORDED = ("active_thread_percentage", "pinned_memory_limit_mib")


def _fail_recording(path: str, reason: str) -> MpsControlError:
    return MpsControlError(
        f"{path}: {reason}; it records the MPS daemons of a rendered host: remove it and run "
        "site.yml again to record them afresh"
    )


def _int_or_none(value) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


def read_recording(root: str) -> Optional[dict]:
    """{unit: {name: int or None}} of the recording below ``root``; None when there is none.

    Raises MpsControlError for a recording that is not valid JSON of RECORDING_FORMAT.
    """
    import json

    from . import files as fs

    text = fs.read_text(root, RECORDING_PATH, _fail_recording, link_as_absent=True)
    if text is None:
        return None
    where = under_root(root, RECORDING_PATH)
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise _fail_recording(where, f"not JSON ({exc})") from None
    daemons = data.get("daemons") if isinstance(data, dict) else None
    if (
        not isinstance(data, dict)
        or data.get("format") != RECORDING_FORMAT
        or data.get("version") != 1
        or not isinstance(daemons, dict)
    ):
        raise _fail_recording(where, f"not a {RECORDING_FORMAT} version 1 file")
    out = {}
    for unit, values in daemons.items():
        if not isinstance(values, dict) or any(not _int_or_none(values.get(n)) for n in _RECORDED):
            raise _fail_recording(where, f"daemon {unit!r}: values must be integers or null")
        out[str(unit)] = {name: values.get(name) for name in _RECORDED}
    return out


def recorded_settings(recording: Optional[dict], daemons: list, actions: Actions) -> list:
    """The settings entries (as ``sync_settings``) of the recorded daemons that are planned and
    not started in this run; [] without a recording."""
    entries = []
    for daemon in daemons:
        values = (recording or {}).get(daemon.unit)
        if values is None or daemon.unit in actions.start:
            continue
        found = [
            Setting(name, planned, values.get(name))
            for name, planned in (
                ("active_thread_percentage", daemon.active_thread_percentage),
                ("pinned_memory_limit_mib", daemon.pinned_memory_limit_mib),
            )
        ]
        entries.append(as_settings(daemon, found))
    return entries


def render_recording(daemons: list, recording: Optional[dict] = None, keep=()) -> str:
    """The recording after an apply: every planned daemon with its planned defaults, except the
    units of ``keep`` (restarted in the run but not restarted: restart never), which keep what
    ``recording`` has for them (planned when it has nothing)."""
    import json

    entries = {}
    for d in daemons:
        planned = {
            "active_thread_percentage": d.active_thread_percentage,
            "pinned_memory_limit_mib": d.pinned_memory_limit_mib,
        }
        kept = (recording or {}).get(d.unit) if d.unit in keep else None
        entries[d.unit] = dict(kept) if kept is not None else planned
    text = json.dumps(
        {"format": RECORDING_FORMAT, "version": 1, "daemons": entries}, indent=2, sort_keys=True
    )
    return text + "\n"


def recording_stale(root: str, daemons: list, recording: Optional[dict] = None, keep=()) -> bool:
    """Whether ``write_recording`` with the same arguments would change the recording."""
    from . import files as fs

    text = fs.read_text(root, RECORDING_PATH, _fail_recording, link_as_absent=True)
    return text != (render_recording(daemons, recording, keep) if daemons else None)


def write_recording(root: str, daemons: list, recording: Optional[dict] = None, keep=()) -> None:
    """Record ``daemons`` below ``root`` (render mode, not check mode) as ``render_recording``
    renders them; no file for no daemons (an earlier one is removed). Raises MpsControlError."""
    from . import files as fs

    if daemons:
        if recording_stale(root, daemons, recording, keep):
            text = render_recording(daemons, recording, keep)
            fs.write_file(root, RECORDING_PATH, text, 0o644, _fail_recording)
    elif read_recording(root) is not None:
        fs.remove_file(root, RECORDING_PATH, _fail_recording)
