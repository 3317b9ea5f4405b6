# Private to this collection: may change in any release.
from __future__ import annotations

import unicodedata

# Characters a message shows escaped: C0/C1 controls (newline, NUL, NEL...) and the Unicode line
# and paragraph separators, which would break a message line or hide the real value.
_SHOWN_ESCAPED = ("Cc", "Zl", "Zp")


def escape_controls(text: str) -> str:
    """text with its control characters and line separators written as escapes (\\n, \\x85), for
    messages: the controller's (plan inputs, host variables) and the modules' (foreign files)."""
    if text.isprintable():
        return text
    out = []
    for char in text:
        if unicodedata.category(char) in _SHOWN_ESCAPED:
            out.append(repr(char)[1:-1] if char != "'" else char)
        else:
            out.append(char)
    return "".join(out)


class NumaTuneError(Exception):
    """Base of every error the collection raises; str(exc) is a complete message for the user."""


class TopologyError(NumaTuneError):
    """A sysfs/procfs path could not be read or made no sense; carries the path and the reason."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


class CpulistError(NumaTuneError):
    """A cpulist ("0-3,8") or cpumask ("ff,00000000") string does not parse."""

    def __init__(self, text: str, reason: str) -> None:
        self.text = text
        self.reason = reason
        super().__init__(f"invalid CPU set {text!r}: {reason}")


class SnapshotError(NumaTuneError):
    """A GPU snapshot file could not be read or written, or does not have the expected shape.

    ``fix`` is the sentence that tells the user what to do; the default suits a snapshot that
    cannot be used, and a failed write gives its own.
    """

    RECORD_AGAIN = (
        "Record a new one with numafleet.tuning.gpu_topology_facts snapshot_out=PATH on the host."
    )

    def __init__(self, path: str, reason: str, fix: str = RECORD_AGAIN) -> None:
        self.path = path
        self.reason = reason
        self.fix = fix
        super().__init__(f"GPU snapshot {path}: {reason}. {fix}")


class CommandOutputError(NumaTuneError):
    """A command (``nvidia-smi -q -x``) failed or printed something that does not parse."""

    def __init__(self, command: str, reason: str) -> None:
        self.command = command
        self.reason = reason
        super().__init__(f"{command}: {reason}")


class PlanError(NumaTuneError):
    """The placements of a host cannot be planned; str(exc) names the host, the variable and the fix."""

    def __init__(self, host: str, message: str) -> None:
        self.host = host
        self.detail = message
        super().__init__(f"host {host}: {message}")


class PlacementError(PlanError):
    """A host variable (numafleet_placements, numafleet_tenants, ...) is not valid."""


class UnitRenderError(NumaTuneError):
    """A plan value cannot be written into a systemd unit (control character, bad unit name...)."""


class UnitFileError(NumaTuneError):
    """A unit file, drop-in or the manifest could not be read, written or removed, or is malformed.

    ``fix`` is the sentence that tells the user what to do.
    """

    def __init__(self, path: str, reason: str, fix: str) -> None:
        self.path = path
        self.reason = reason
        self.fix = fix
        super().__init__(f"{path}: {reason}. {fix}")


class LocalityError(NumaTuneError):
    """A procfs/cgroup/perf text read for locality measurement is unreadable or malformed.

    ``source`` is the file (or command) it came from; ``fix`` says what to do about it.
    """

    def __init__(self, source: str, reason: str, fix: str = "") -> None:
        self.source = source
        self.reason = reason
        self.fix = fix
        super().__init__(f"{source}: {reason}" + (f". {fix}" if fix else ""))


class VerifyError(NumaTuneError):
    """Thresholds, a plan or a measurement handed to verify cannot be used; names the value and the fix."""


class MigError(NumaTuneError):
    """A MIG layout request cannot be met (unknown GPU or profile, layout does not fit, busy GPU,
    pending mode, re-read mismatch); str(exc) names the GPU, the option and the fix."""


class MigBackendError(MigError):
    """A MIG read or change through NVML or nvidia-smi failed.

    Carries ``gpu`` (address or index text), ``call`` (the NVML call or command line), ``reason``
    (what the driver said) and ``fix``; the message names all of them.
    """

    def __init__(self, gpu: str, call: str, reason: str, fix: str) -> None:
        self.gpu = gpu
        self.call = call
        self.reason = reason
        self.fix = fix
        super().__init__(f"GPU {gpu}: {call} failed: {reason}. {fix}")


class GpuSettingsError(NumaTuneError):
    """A GPU baseline setting (persistence, compute mode, clocks, power limit) cannot be applied:
    bad input, a busy GPU, a refused NVML or nvidia-smi call, or a read-back that differs."""


class GuardError(NumaTuneError):
    """The memory guard cannot work with its input (plan placements, thresholds, saved state);
    names the value and the fix."""
