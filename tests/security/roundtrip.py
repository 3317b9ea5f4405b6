"""The round-trip half of the injection matrix: the rendered files, read back as systemd would.

``read_back(check, hostvars, files)`` returns (expected, got) for the field's check, reading the
files the modules would write ({host path: text}) with the unit-file reader of the tests
(``tests/unit/systemd_syntax.py``, which follows systemd.syntax(7) and systemd.service(5)). A
reader error (a line systemd drops, a specifier left to expand) counts as a wrong render.
"""

from __future__ import annotations

import posixpath
import re
import shlex

import systemd_syntax as sd

UNIT_DIR = "/etc/systemd/system"
LLM = f"{UNIT_DIR}/numafleet-llm.service"


class Missing(Exception):
    """The file or setting the field should have produced is not there."""


def _entries(files: dict, path: str) -> list:
    if path not in files:
        raise Missing(f"{path} not rendered (files: {sorted(files)})")
    return sd.parse_unit(files[path])


def _one(files: dict, path: str, section: str, key: str) -> str:
    values = sd.lookup(_entries(files, path), section, key)
    if len(values) != 1:
        raise Missing(f"{path}: [{section}] {key}= appears {len(values)} times")
    return values[0]


def _environment(files: dict, path: str) -> dict:
    env: dict = {}
    for raw in sd.lookup(_entries(files, path), "Service", "Environment"):
        env.update(sd.environment(raw))
    return env


def _unescape_unit(text: str) -> str:
    """systemd-escape's \\xNN (per UTF-8 byte) undone."""
    data = re.sub(
        rb"\\x([0-9a-f]{2})", lambda m: bytes([int(m.group(1), 16)]), text.encode("utf-8")
    )
    return data.decode("utf-8")


def _mps_dropin(files: dict) -> str:
    found = [p for p in files if p.startswith(f"{UNIT_DIR}/nvidia-mps@") and ".service.d/" in p]
    if len(found) != 1:
        raise Missing(f"MPS drop-ins: {found}")
    return found[0]


def _mount(files: dict) -> str:
    found = [p for p in files if p.endswith(".mount")]
    if len(found) != 1:
        raise Missing(f"mount units: {found}")
    return found[0]


def _options(files: dict) -> list:
    return _one(files, _mount(files), "Mount", "Options").split(",")


def _host_path(path: str) -> str:
    """The path the modules use (normalised); raises UnitSyntaxError unless Linux takes it."""
    normal = posixpath.normpath(path)
    sd.check_path(normal, absolute=True)  # PATH_MAX, NAME_MAX: a longer one fails at the write
    return normal


def _host_file(path: str, files: dict) -> tuple:
    want = _host_path(path)
    return want, want if want in files else sorted(files)


def read_back(check: str, hostvars: dict, files: dict) -> tuple:
    """(what the user wrote, what systemd reads back) for the field's check; raises on a miss."""
    placement = hostvars["numafleet_placements"][0]
    if check == "name":
        name = placement["name"]
        path = f"{UNIT_DIR}/numafleet-{name}.service"
        return path, path if path in files else sorted(files)
    if check == "desc":
        # An empty description means the default one (docs/host_variables.md).
        want = placement["description"] or f"numafleet placement {placement['name']}"
        return want, sd.description(_one(files, LLM, "Unit", "Description"))
    if check in ("exec_word", "exec_program", "exec_raw"):
        prefixes, argv = sd.exec_command(_one(files, LLM, "Service", "ExecStart"))
        return ("", shlex.split(placement["exec"])), (prefixes, argv)
    if check == "env_key":
        (key,) = placement["environment"]
        return "1", _environment(files, LLM).get(key)
    if check == "env_value":
        return placement["environment"]["HF_HOME"], _environment(files, LLM).get("HF_HOME")
    if check in ("user", "group"):
        raw = _one(files, LLM, "Service", check.capitalize())
        return placement[check], sd.user_group(raw)
    if check == "mps_user":
        raw = _one(files, _mps_dropin(files), "Service", "User")
        return hostvars["numafleet_placements"][1]["user"], sd.user_group(raw)
    if check == "unit":
        unit = hostvars["numafleet_placements"][2]["unit"]
        path = f"{UNIT_DIR}/{unit}.d/50-numafleet.conf"
        return path, path if path in files else sorted(files)
    if check == "tenant_name":
        name = hostvars["numafleet_tenants"][0]["name"]
        slice_unit = sd.plain_value(_one(files, LLM, "Service", "Slice"))
        if f"{UNIT_DIR}/{slice_unit}" not in files:
            raise Missing(f"{slice_unit} is not rendered")
        inner = slice_unit[len("numafleet-") : -len(".slice")]
        return name, _unescape_unit(inner)
    if check == "tenant_desc":
        tenant = hostvars["numafleet_tenants"][0]
        slice_unit = sd.plain_value(_one(files, LLM, "Service", "Slice"))
        raw = _one(files, f"{UNIT_DIR}/{slice_unit}", "Unit", "Description")
        want = tenant["description"] or f"numafleet tenant {tenant['name']}"
        return want, sd.description(raw)
    mount = (hostvars.get("numafleet_hugepages_mounts") or [{}])[0]
    if check == "mount_path":
        want = "/" + "/".join(part for part in mount["path"].split("/") if part)
        return want, sd.path_value(_one(files, _mount(files), "Mount", "Where"))
    if check == "mount_mode":
        return f"mode={mount['mode']}", [o for o in _options(files) if o.startswith("mode=")][0]
    if check == "mount_group":
        return f"gid={mount['group']}", [o for o in _options(files) if o.startswith("gid=")][0]
    if check == "parted":
        return _host_file(hostvars["numafleet_mig_parted_config"], files)
    if check in ("manifest", "mps_manifest"):
        role = "pinned_services" if check == "manifest" else "nvidia_mps"
        return _host_file(hostvars[f"{role}_manifest_path"], files)
    if check == "mps_control":
        want = _host_path(hostvars["nvidia_mps_control_path"])
        template = f"{UNIT_DIR}/nvidia-mps@.service"
        prefixes, argv = sd.exec_command(_one(files, template, "Service", "ExecStop"))
        return f"echo quit | {want}", argv[-1]
    if check == "mps_smi":
        want = _host_path(hostvars["nvidia_mps_nvidia_smi_path"])
        prefixes, argv = sd.exec_command(_one(files, _mps_dropin(files), "Service", "ExecStartPre"))
        return ("+", want), (prefixes, argv[0])
    if check in ("unit_dir", "mps_unit_dir"):
        name = "pinned_services_unit_dir" if check == "unit_dir" else "nvidia_mps_unit_dir"
        unit_dir = _host_path(hostvars[name])
        unit = LLM.replace(UNIT_DIR, unit_dir) if check == "unit_dir" else None
        if unit is None:
            found = [p for p in files if p.startswith(f"{unit_dir}/nvidia-mps@")]
            return True, bool(found)
        return unit, unit if unit in files else sorted(files)
    raise ValueError(f"no read-back for {check!r}")
