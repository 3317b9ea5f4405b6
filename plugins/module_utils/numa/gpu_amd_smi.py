# Private to this collection: may change in any release.
"""AMD Instinct GPUs from AMD's ``amd-smi`` tool: its output -> the facts' per-GPU ``amd`` record.

The fallback source of the AMD facts when the ``amdsmi`` Python library does not load but the
``amd-smi`` command is installed; records made here have ``source: "amd-smi"``. Pure: the
caller runs the commands (amd_smi_argv builds them, read_amd_smi takes a runner) and passes
their standard output in.

Every parser takes both forms amd-smi prints: ``--json`` (a JSON list of per-GPU objects, or an
object with a ``gpu_data`` list when CPU data is printed too) and the human-readable text
(``GPU: <n>`` blocks of indented ``KEY: value`` lines; amd-smi prints its JSON document that
way with upper-case keys, so both give the same lower-case dicts here). What is read:

- ``amd-smi static --json`` (required), per logical GPU: ``gpu`` (amd-smi's GPU index),
  ``asic.market_name`` (model), ``bus.bdf`` (PCI address; the logical GPUs of a partitioned GPU
  carry the partition id in the function digit, e.g. ``0000:05:00.1``), ``partition``
  (``compute_partition``, ``memory_partition``, ``partition_id`` since ROCm 6.3),
  ``numa.node`` (host NUMA node), ``vram.size`` (``{"value": 196592, "unit": "MB"}`` or
  ``"64289 MB"``; amd-smi's MB are MiB: the library divides bytes by 2**20).
- ``amd-smi list -e --json`` (optional): ``bdf``, ``kfd_id`` (the KFD node's ``gpu_id``),
  ``node_id`` (KFD topology node), ``partition_id``, and with ``-e`` (ROCm 6.4+) ``card``
  (``card1``), ``render`` (``renderD128``) and ``hip_uuid`` (``GPU-<16 hex>``, the KFD
  unique_id as rocminfo prints it and ROCR_VISIBLE_DEVICES takes it). Its ``uuid`` is another
  format (amdsmi's CUID / device UUID) and is used only when it has that ``GPU-`` form.
- ``amd-smi partition --json`` (optional, ROCm 6.4+): an object of tables -
  ``current_partition`` (``gpu_id``, ``memory``, ``accelerator_type``, ``partition_id``),
  ``memory_partition`` (``gpu_id``, ``memory_partition_caps`` ``"NPS1,NPS4"``,
  ``current_memory_partition``) and ``partition_profiles`` (one row per profile resource:
  ``gpu_id`` and ``profile_index`` blank on continuation rows, ``memory_partition_caps``,
  ``accelerator_type`` with ``*`` on the current one, ``num_partitions``, ``resource_type``,
  ``resource_instances``). The text form is the same tables with upper-case headers.
- ``amd-smi process --json`` (optional): ``process_list`` of ``{"process_info": {"name",
  "pid"}}`` (or the process object itself in newer releases; a string when there is none).

Entries are matched between the outputs by amd-smi's GPU index (``gpu`` / ``gpu_id``), which
all subcommands of one installation enumerate alike; logical GPUs are grouped into their PCI
GPU by PCI domain, bus and device. Values amd-smi prints as ``N/A`` become None.

Errors: output that is not the expected JSON or text, or a GPU without a usable PCI address,
raises CommandOutputError naming the command and quoting at most 80 characters.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Callable, Optional

from .errors import CommandOutputError
from .gpu_records import clip, normalise_bus_id, quote

SOURCE_AMD_SMI = "amd-smi"
# Subcommand -> arguments after the executable; each prints JSON.
AMD_SMI_COMMANDS = {
    "static": ("static", "--json"),
    "partition": ("partition", "--json"),
    "list": ("list", "-e", "--json"),
    "process": ("process", "--json"),
}
_KILL_AFTER_S = 5
_TIMEOUT_STATUSES = (124, 137)
_OUTPUT_LIMIT = 64 << 20
_COMPUTE_MODES = ("SPX", "DPX", "TPX", "QPX", "CPX")
_MEMORY_MODES = ("NPS1", "NPS2", "NPS4", "NPS8")
_MISSING = ("", "N/A", "NA", "NONE", "UNKNOWN")
_UUID_RE = re.compile(r"^GPU-([0-9a-fA-F]{1,16})\Z")
_BLOCK_RE = re.compile(r"^(GPU|CPU|CORE|NIC|SWITCH): *(\d+)\s*\Z")
_KEY_RE = re.compile(r"^([A-Za-z0-9_ ./()-]+?):(?: (.*))?\Z")
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?i?B)\s*\Z", re.I)
_UNIT_MIB = {"B": 1 / (1 << 20), "KB": 1 / 1024, "MB": 1, "GB": 1024, "TB": 1 << 20}
_TABLES = {
    "CURRENT_PARTITION": "current_partition",
    "MEMORY_PARTITION": "memory_partition",
    "ACCELERATOR_PARTITION_PROFILES": "partition_profiles",
    "ACCELERATOR_PARTITION_RESOURCES": "partition_resources",
}


def command_line(name: str) -> str:
    """``amd-smi static --json``: the command of AMD_SMI_COMMANDS[name] as messages name it."""
    return " ".join(("amd-smi",) + AMD_SMI_COMMANDS[name])


def amd_smi_argv(
    amd_smi: Optional[str], timeout: Optional[str], seconds: int, name: str = "static"
) -> Optional[list]:
    """argv running ``amd-smi <AMD_SMI_COMMANDS[name]>`` under coreutils ``timeout``.

    ``amd_smi`` is the path of the tool (None: not installed, the result is None); ``timeout``
    the path of coreutils ``timeout`` (None: no limit); ``seconds`` the limit. Raises
    CommandOutputError when ``seconds`` is not a whole number of at least 1, or ``name`` is not
    one of static, partition, list, process.
    """
    if name not in AMD_SMI_COMMANDS:
        raise CommandOutputError(
            "amd-smi",
            f"no such query {quote(name)}; use one of {', '.join(AMD_SMI_COMMANDS)}",
        )
    if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds < 1:
        raise CommandOutputError(
            command_line(name),
            f"the time limit is {quote(seconds)}; set it to a whole number of seconds, 1 or more",
        )
    if amd_smi is None:
        return None
    command = [amd_smi, *AMD_SMI_COMMANDS[name]]
    if timeout is None:
        return command
    return [timeout, f"--kill-after={_KILL_AFTER_S}", str(seconds)] + command


# ---------------------------------------------------------------------------------------------
# Text and JSON -> lower-case dicts


def _body(text, command: str) -> str:
    if not isinstance(text, str):
        raise CommandOutputError(command, f"output is {type(text).__name__}, not text")
    if len(text) > _OUTPUT_LIMIT:
        raise CommandOutputError(
            command, f"printed more than {_OUTPUT_LIMIT >> 20} MiB, which is no amd-smi output"
        )
    return text.lstrip("\ufeff")


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""


def _lower_keys(value):
    if isinstance(value, dict):
        return {str(k).lower(): _lower_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_lower_keys(v) for v in value]
    return value


def _load_json(text: str, command: str):
    try:
        return _lower_keys(json.loads(text))
    except ValueError as exc:
        raise CommandOutputError(command, f"output is not JSON ({clip(str(exc))})") from None


def _put(container: dict, key: str, value) -> None:
    """Set ``key``; a key seen again (PROCESS_INFO per process) collects its values in a list."""
    if key not in container:
        container[key] = value
    elif isinstance(container[key], list) and getattr(container[key], "repeated", False):
        container[key].append(value)
    else:
        container[key] = _Repeated([container[key], value])


class _Repeated(list):
    """The values of a key that a text block repeats (kept apart from list values)."""

    repeated = True


def parse_text_blocks(text: str, command: str = "amd-smi") -> list:
    """[{"gpu": n, ...}] of amd-smi's human-readable ``GPU: <n>`` blocks, keys lower-cased.

    Nesting follows the indentation; a key repeated in one block becomes a list; a line without
    ``KEY:`` (``No running processes detected``) becomes the value of the key above it; ``...``
    lines (elisions in published samples) and ``CPU:``/``CORE:``/``NIC:`` blocks are skipped.
    Raises CommandOutputError when a GPU line has a bad index.
    """
    devices: list = []
    stack: list = []  # [(indent, dict, key of the pending parent or None)]
    current = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not line.strip() or line.strip() == "...":
            continue
        indent = len(line) - len(line.lstrip(" "))
        block = _BLOCK_RE.match(line) if indent == 0 else None
        if block:
            current = None
            if block.group(1) == "GPU":
                current = {"gpu": int(block.group(2))}
                devices.append(current)
                stack = [(0, current)]
            continue
        if indent == 0 and line.startswith("GPU"):
            raise CommandOutputError(command, f"line {number} {quote(line)} is no 'GPU: <n>' line")
        if current is None:
            continue
        while len(stack) > 1 and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        match = _KEY_RE.match(line.strip())
        if match is None:
            # free text under a key: the key's value (amd-smi prints a message there)
            if isinstance(parent, dict) and len(stack) > 1 and not parent:
                holder, key = stack[-2][1], stack[-1][2]
                _replace_last(holder, key, line.strip())
            continue
        key = match.group(1).strip().lower()
        value = match.group(2)
        if value is None or value == "":
            child: dict = {}
            _put(parent, key, child)
            stack.append((indent, child, key))
        else:
            _put(parent, key, value.strip())
    return devices


def _replace_last(holder: dict, key: str, value) -> None:
    if isinstance(holder.get(key), _Repeated):
        holder[key][-1] = value
    else:
        holder[key] = value


def parse_devices(text, command: str = "amd-smi static --json") -> list:
    """The per-GPU entries of ``amd-smi static|list|process`` output, JSON or text.

    Returns [{"gpu": int, ...}] with lower-case keys, in output order. Raises
    CommandOutputError for JSON that is neither a list of objects nor an object with
    ``gpu_data``, for entries without an integer ``gpu``, and for text without a GPU block.
    """
    body = _body(text, command)
    stripped = body.strip()
    if stripped.startswith(("[", "{")):
        data = _load_json(stripped, command)
        if isinstance(data, dict):
            if "gpu_data" not in data:
                keys = ", ".join(sorted(data))
                raise CommandOutputError(
                    command, f"JSON object has no gpu_data list (keys: {clip(keys)})"
                )
            data = data["gpu_data"]
        if not isinstance(data, list) or not all(isinstance(e, dict) for e in data):
            raise CommandOutputError(command, "JSON is not a list of per-GPU objects")
        devices = data
    else:
        devices = parse_text_blocks(body, command)
        if not devices:
            raise CommandOutputError(
                command, f"output shows no 'GPU: <n>' block (starts {quote(_first_line(stripped))})"
            )
    for entry in devices:
        gpu = entry.get("gpu")
        if isinstance(gpu, bool) or not isinstance(gpu, int) or gpu < 0:
            raise CommandOutputError(command, f"an entry has no GPU index ({quote(gpu)})")
    return devices


def _split_table(lines: list) -> list:
    """Rows of an amd-smi table (header + rows, columns padded to the header's positions)."""
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    names = [m.group(0).lower() for m in re.finditer(r"\S+", header)]
    rows = []
    for line in lines[1:]:
        cells = {}
        for i, name in enumerate(names):
            end = starts[i + 1] if i + 1 < len(starts) else None
            cells[name] = line[starts[i] : end].strip() if starts[i] < len(line) else ""
        rows.append(cells)
    return rows


def parse_partition(text, command: str = "amd-smi partition --json") -> dict:
    """The tables of ``amd-smi partition`` (JSON object or text tables).

    Returns {"current_partition": [row], "memory_partition": [row], "partition_profiles":
    [row], ...}, each row a dict of lower-case column names to values (text cells are strings,
    blank on continuation rows). Raises CommandOutputError for output with none of the tables.
    """
    body = _body(text, command)
    stripped = body.strip()
    if stripped.startswith(("[", "{")):
        data = _load_json(stripped, command)
        if not isinstance(data, dict):
            raise CommandOutputError(command, "JSON is not an object of partition tables")
        tables = {k: v for k, v in data.items() if k in _TABLES.values() and isinstance(v, list)}
    else:
        tables, title, lines = {}, None, []
        for raw in body.splitlines() + [""]:
            line = raw.rstrip()
            name = line.strip()[:-1] if line.strip().endswith(":") else None
            if name in _TABLES or not line.strip():
                if title is not None and len(lines) > 1:
                    tables[title] = _split_table(lines)
                title, lines = (_TABLES[name], []) if name in _TABLES else (None, [])
            elif title is not None:
                lines.append(line)
    if not tables:
        raise CommandOutputError(
            command, f"output has no partition table (starts {quote(_first_line(stripped))})"
        )
    return tables


# ---------------------------------------------------------------------------------------------
# Values


def _text(value) -> Optional[str]:
    if value is None or isinstance(value, (dict, list)):
        return None
    text = str(value).strip()
    return None if text.upper() in _MISSING else text


def _int(value) -> Optional[int]:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    text = _text(value)
    try:
        return int(text, 0) if text is not None else None
    except ValueError:
        return None


def _mib(value) -> Optional[int]:
    """MiB of a size: {"value": 196592, "unit": "MB"} or "64289 MB" (amd-smi's MB are MiB)."""
    if isinstance(value, dict):
        number, unit = value.get("value"), str(value.get("unit") or "MB")
    else:
        match = _SIZE_RE.match(str(value or ""))
        if not match:
            return None
        number, unit = match.group(1), match.group(2)
    try:
        amount = float(number)
    except (TypeError, ValueError):
        return None
    factor = _UNIT_MIB.get(unit.upper().replace("IB", "B"))
    return int(amount * factor) if factor and amount > 0 else None


def _mode(value, modes: tuple) -> Optional[str]:
    text = (_text(value) or "").upper().rstrip("*")
    return text if text in modes else None


def _modes(value, modes: tuple) -> list:
    found = []
    for token in re.split(r"[\s,\[\]']+", str(value or "").upper()):
        if token in modes and token not in found:
            found.append(token)
    return found


def _uuid(*values) -> Optional[str]:
    """``GPU-<16 lower-case hex>`` of the first value in that form (ROCr's agent UUID)."""
    for value in values:
        match = _UUID_RE.match(_text(value) or "")
        if match:
            return f"GPU-{int(match.group(1), 16):016x}"
    return None


def _minor(value, prefix: str) -> Optional[int]:
    text = _text(value)
    if text and text.startswith(prefix) and text[len(prefix) :].isdigit():
        return int(text[len(prefix) :])
    return _int(text)


# ---------------------------------------------------------------------------------------------
# Records


def _by_gpu(entries: list, key: str = "gpu") -> dict:
    found: dict = {}
    current = None
    for row in entries:
        index = _int(row.get(key))
        current = index if index is not None else current
        if current is not None:
            found.setdefault(current, []).append(row)
    return found


def _profiles(rows: list) -> list:
    """Profiles of one GPU: [{"type", "caps", "partitions", "xcc", "current"}] in table order."""
    profiles: list = []
    for row in rows:
        kind = _text(row.get("accelerator_type"))
        if kind:
            profiles.append(
                {
                    "type": kind.rstrip("*").upper(),
                    "caps": _modes(row.get("memory_partition_caps"), _MEMORY_MODES),
                    "partitions": _int(row.get("num_partitions")),
                    "xcc": None,
                    "current": kind.endswith("*"),
                }
            )
        if profiles and (_text(row.get("resource_type")) or "").upper() == "XCC":
            profiles[-1]["xcc"] = _int(row.get("resource_instances"))
    return [p for p in profiles if p["type"] in _COMPUTE_MODES]


def _physical_key(command: str, entry: dict, bdf) -> tuple:
    text = _text(bdf)
    if text is None:
        raise CommandOutputError(
            command,
            f"GPU {entry['gpu']} has no PCI address (bus.bdf is {quote(bdf)}); run amd-smi "
            "static without a section option so that the bus section is printed",
        )
    try:
        address = normalise_bus_id(text)
    except ValueError as exc:
        raise CommandOutputError(command, f"GPU {entry['gpu']}: {exc}") from None
    domain, bus, rest = address.split(":")
    device, function = rest.split(".")
    return (domain, bus, device), int(function), address


def parse_amd_smi(
    static_json: str,
    partition_json: Optional[str] = None,
    list_json: Optional[str] = None,
    process_json: Optional[str] = None,
) -> dict:
    """{PCI address: amd record} of the GPUs in amd-smi's output (JSON or text of each command).

    ``static_json``: ``amd-smi static --json`` (needs the bus section); the others are optional
    (None: not run). The record has the keys of the facts contract's ``amd`` record with
    ``source: "amd-smi"``: model, kfd_node / gpu_id / unique_id / uuid / render_minor of
    partition 0 (from ``list``; None without it), drm_card, vram_total_mib (partition 0's
    VRAM), compute_partition / memory_partition ({current, available}; available from the
    ``partition`` tables, else []), compatible_memory_partitions ({compute mode: [memory
    modes]} from the partition profiles, else None) with compatible_source ``"amd-smi"``,
    xcd_count (profile partitions x XCCs per partition), logical_gpus (one per amd-smi GPU of
    the PCI GPU, ordered by partition id: index, uuid, unique_id, kfd_node, gpu_id,
    render_minor, xcds) and processes ([{pid, name}] of all its logical GPUs, None without
    ``process``). The address is that of partition 0 (the PCI function). Raises
    CommandOutputError (see the module docstring).
    """
    static_cmd = command_line("static")
    static = parse_devices(static_json, static_cmd)
    listed = (
        {e["gpu"]: e for e in parse_devices(list_json, command_line("list"))}
        if list_json is not None
        else {}
    )
    tables = parse_partition(partition_json) if partition_json is not None else {}
    procs = (
        {e["gpu"]: e for e in parse_devices(process_json, command_line("process"))}
        if process_json is not None
        else None
    )
    current = {k: v[0] for k, v in _by_gpu(tables.get("current_partition", []), "gpu_id").items()}
    memory = {k: v[0] for k, v in _by_gpu(tables.get("memory_partition", []), "gpu_id").items()}
    profiles = {
        k: _profiles(v) for k, v in _by_gpu(tables.get("partition_profiles", []), "gpu_id").items()
    }

    groups: dict = {}
    for entry in static:
        item = listed.get(entry["gpu"], {})
        bdf = (entry.get("bus") or {}).get("bdf") if isinstance(entry.get("bus"), dict) else None
        key, function, address = _physical_key(static_cmd, entry, bdf or item.get("bdf"))
        part = entry.get("partition") if isinstance(entry.get("partition"), dict) else {}
        pid = _int(part.get("partition_id"))
        if pid is None:
            pid = _int(item.get("partition_id"))
        if pid is None:
            pid = _int((current.get(entry["gpu"]) or {}).get("partition_id"))
        groups.setdefault(key, []).append((function if pid is None else pid, address, entry, item))

    records = {}
    for members in groups.values():
        members.sort(key=lambda m: m[0])
        _pid, address, first, first_item = members[0]
        records[address] = _record(members, current, memory, profiles, procs, first, first_item)
    return dict(sorted(records.items()))


def _record(members, current, memory, profiles, procs, first, first_item) -> dict:
    gpu = first["gpu"]
    part = first.get("partition") if isinstance(first.get("partition"), dict) else {}
    cur = current.get(gpu) or {}
    mem = memory.get(gpu) or {}
    profs = profiles.get(gpu) or []
    compute_now = (
        _mode(part.get("compute_partition"), _COMPUTE_MODES)
        or _mode(part.get("accelerator_partition"), _COMPUTE_MODES)
        or _mode(cur.get("accelerator_type"), _COMPUTE_MODES)
    )
    if compute_now is None:
        compute_now = next((p["type"] for p in profs if p["current"]), None)
    memory_now = (
        _mode(part.get("memory_partition"), _MEMORY_MODES)
        or _mode(cur.get("memory"), _MEMORY_MODES)
        or _mode(mem.get("current_memory_partition"), _MEMORY_MODES)
    )
    compute_avail = []
    for profile in profs:
        if profile["type"] not in compute_avail:
            compute_avail.append(profile["type"])
    memory_avail = _modes(mem.get("memory_partition_caps"), _MEMORY_MODES)
    if not memory_avail:
        for profile in profs:
            memory_avail += [m for m in profile["caps"] if m not in memory_avail]
        memory_avail.sort(key=_MEMORY_MODES.index)
    compatible = {p["type"]: p["caps"] for p in profs if p["caps"]} or None
    active = next((p for p in profs if p["type"] == compute_now), None)
    per_partition = active["xcc"] if active else None
    xcd_count = (
        per_partition * active["partitions"]
        if active and per_partition and active["partitions"]
        else None
    )
    asic = first.get("asic") if isinstance(first.get("asic"), dict) else {}
    vram = first.get("vram") if isinstance(first.get("vram"), dict) else {}
    logical = []
    for pid, _address, _entry, item in members:
        uuid = _uuid(item.get("hip_uuid"), item.get("uuid"))
        logical.append(
            {
                "index": pid,
                "uuid": uuid,
                "unique_id": hex(int(uuid[4:], 16)) if uuid else None,
                "kfd_node": _int(item.get("node_id")),
                "gpu_id": _int(item.get("kfd_id")),
                "render_minor": _minor(item.get("render"), "renderD"),
                "xcds": list(range(pid * per_partition, (pid + 1) * per_partition))
                if per_partition
                else [],
            }
        )
    head = logical[0]
    card = _text(first_item.get("card"))
    return {
        "model": _text(asic.get("market_name")),
        "kfd_node": head["kfd_node"],
        "gpu_id": head["gpu_id"],
        "unique_id": head["unique_id"],
        "uuid": head["uuid"],
        "hive_id": None,  # amd-smi static prints no XGMI hive id; sysfs gives it
        "drm_card": card if card and card.startswith("card") else None,
        "render_minor": head["render_minor"],
        "vram_total_mib": _mib(vram.get("size")),
        "compute_partition": {"current": compute_now, "available": compute_avail}
        if compute_now
        else None,
        "memory_partition": {"current": memory_now, "available": memory_avail}
        if memory_now
        else None,
        "compatible_memory_partitions": compatible,
        "compatible_source": SOURCE_AMD_SMI if compatible else None,
        "xcd_count": xcd_count,
        "logical_gpus": logical,
        "processes": _processes(procs, [m[2]["gpu"] for m in members]),
        "source": SOURCE_AMD_SMI,
    }


def _processes(procs: Optional[dict], gpus: list) -> Optional[list]:
    if procs is None:
        return None
    found = {}
    for gpu in gpus:
        listing = (procs.get(gpu) or {}).get("process_list")
        if listing is None:
            listing = (procs.get(gpu) or {}).get("process_info")
        if not isinstance(listing, list):
            listing = [listing]
        for item in listing:
            info = item.get("process_info", item) if isinstance(item, dict) else item
            if not isinstance(info, dict):
                continue  # "No running processes detected"
            pid = _int(info.get("pid"))
            if pid is not None and pid > 0:
                found[pid] = {"pid": pid, "name": _text(info.get("name"))}
    return [found[pid] for pid in sorted(found)]


def numa_nodes(static_json: str) -> dict:
    """{PCI address of each logical GPU: host NUMA node or None} from ``amd-smi static``.

    ``numa.node`` as amd-smi prints it (the PCI function's node; -1 or N/A: None). Raises
    CommandOutputError as parse_devices does.
    """
    found = {}
    for entry in parse_devices(static_json, command_line("static")):
        bus = entry.get("bus") if isinstance(entry.get("bus"), dict) else {}
        numa = entry.get("numa") if isinstance(entry.get("numa"), dict) else {}
        try:
            address = normalise_bus_id(_text(bus.get("bdf")) or "")
        except ValueError:
            continue
        node = _int(numa.get("node"))
        found[address] = node if node is not None and node >= 0 else None
    return found


def enrich_records(records: dict, smi_records: dict) -> list:
    """Add amd-smi's values to sysfs ``records`` ({address: amd record}, changed in place).

    As gpu_amd.enrich_amdsmi does for the library: model, VRAM and processes from amd-smi; the
    current compute/memory partition from amd-smi where sysfs had none; the allowed memory
    partitions where sysfs and the table gave none; per logical GPU (same index) the UUID,
    KFD node, gpu_id and render minor where sysfs had none. KFD data read from sysfs win.
    A record amd-smi reports gets source "amd-smi". Returns the addresses enriched.
    """
    done = []
    for address, record in records.items():
        theirs = smi_records.get(address)
        if theirs is None:
            continue
        for key in ("model", "vram_total_mib", "processes"):
            if theirs[key] is not None:
                record[key] = copy.deepcopy(theirs[key])
        for key in ("compute_partition", "memory_partition"):
            if record.get(key) is None and theirs[key] is not None:
                record[key] = copy.deepcopy(theirs[key])
        if (
            record.get("compatible_memory_partitions") is None
            and theirs["compatible_memory_partitions"]
        ):
            record["compatible_memory_partitions"] = copy.deepcopy(
                theirs["compatible_memory_partitions"]
            )
            record["compatible_source"] = SOURCE_AMD_SMI
        by_index = {item["index"]: item for item in theirs["logical_gpus"]}
        for item in record.get("logical_gpus") or []:
            other = by_index.get(item.get("index")) or {}
            for key in ("uuid", "unique_id", "kfd_node", "gpu_id", "render_minor"):
                if item.get(key) is None and other.get(key) is not None:
                    item[key] = other[key]
        if not record.get("logical_gpus"):
            record["logical_gpus"] = copy.deepcopy(theirs["logical_gpus"])
        head = (record.get("logical_gpus") or [{}])[0]
        for key in ("uuid", "unique_id", "kfd_node", "gpu_id", "render_minor"):
            if record.get(key) is None:
                record[key] = head.get(key)
        for key in ("drm_card", "xcd_count"):
            if record.get(key) is None:
                record[key] = theirs[key]
        record["source"] = SOURCE_AMD_SMI
        done.append(address)
    return done


def read_amd_smi(run: Optional[Callable], timeout_s: Optional[int] = None) -> tuple:
    """(records, fact) from ``run(name) -> (rc, stdout, stderr)`` of each AMD_SMI_COMMANDS name.

    ``run`` is None when amd-smi is not installed. ``static`` must succeed; a failing
    ``partition``, ``list`` or ``process`` (older releases lack ``partition`` and ``list -e``)
    is left out with a warning. ``timeout_s`` is the limit the runner applies through coreutils
    ``timeout`` (status 124/137 then means timed out). Returns parse_amd_smi's records ({} when
    unusable) and {"used": bool, "reason": str|None, "warnings": [str]}; never raises.
    """
    if run is None:
        return {}, {"used": False, "reason": "amd-smi was not found in PATH", "warnings": []}
    outputs, warnings = {}, []
    for name in AMD_SMI_COMMANDS:
        rc, out, err = run(name)
        if timeout_s is not None and rc in _TIMEOUT_STATUSES:
            reason = f"{command_line(name)}: timed out after {timeout_s} s"
        elif rc != 0:
            first = ((err or "").strip() or (out or "").strip()).splitlines()
            reason = f"{command_line(name)}: exited with status {rc}" + (
                f": {clip(first[0])}" if first else ""
            )
        else:
            outputs[name] = out
            continue
        if name == "static":
            return {}, {"used": False, "reason": reason, "warnings": warnings}
        warnings.append(reason)
    try:
        records = parse_amd_smi(
            outputs["static"], outputs.get("partition"), outputs.get("list"), outputs.get("process")
        )
    except CommandOutputError as exc:
        return {}, {"used": False, "reason": str(exc), "warnings": warnings}
    return records, {"used": True, "reason": None, "warnings": warnings}


__all__ = [
    "AMD_SMI_COMMANDS",
    "SOURCE_AMD_SMI",
    "amd_smi_argv",
    "command_line",
    "enrich_records",
    "numa_nodes",
    "parse_amd_smi",
    "parse_devices",
    "parse_partition",
    "parse_text_blocks",
    "read_amd_smi",
]
