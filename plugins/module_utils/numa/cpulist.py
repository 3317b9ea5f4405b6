# Private to this collection: may change in any release.
"""Kernel CPU-set formats: cpulists ("0-3,8,16-31:2/4") and cpumasks ("ff,ffffffff")."""

from __future__ import annotations

import re

from .errors import CpulistError

# A set larger than this is certainly garbage, not a machine: refuse before building it.
MAX_CPUS = 1 << 20
_HEX_WORD = re.compile(r"^[0-9a-fA-F]{1,8}\Z")


def _clean(text: str) -> str:
    """Strip the whitespace and the trailing NUL bytes some sysfs files end with."""
    return text.replace("\0", "").strip()


def _int(token: str, text: str) -> int:
    if not (token.isascii() and token.isdigit()):
        raise CpulistError(text, f"{token!r} is not a CPU number")
    value = int(token)
    if value >= MAX_CPUS:
        raise CpulistError(text, f"CPU {value} is beyond {MAX_CPUS - 1}")
    return value


def parse_cpulist(text: str) -> list[int]:
    """Sorted CPU numbers of a kernel cpulist ("0-3,8", "0-15:2/4", "" = none); raises CpulistError.

    Grammar (lib/bitmap.c bitmap_parselist): comma-separated items, each ``N``, ``N-M`` or
    ``N-M:used/group`` (the first ``used`` CPUs of every ``group`` in N..M). "(null)", written by
    some kernels for an unset list, is empty.
    """
    body = _clean(text)
    if body in ("", "(null)"):
        return []
    if body.isascii() and body.replace(",", "").isdigit():  # "0,112": single CPUs only
        single = [int(token) for token in body.split(",") if token]
        # Taken as it is when no item is empty, too large or out of order; else the full way.
        if len(single) == body.count(",") + 1 and single[-1] < MAX_CPUS:
            if all(low < high for low, high in zip(single, single[1:])):
                return single
    # Kernels write ascending, disjoint items: then the CPUs are in order as they come, and
    # only lists that are not need sorting and de-duplicating.
    cpus: list[int] = []
    ordered, top = True, -1
    for item in body.split(","):
        item = item.strip()
        if not item:
            raise CpulistError(text, "empty item between commas")
        span, sep, stride = item.partition(":")
        first_s, dash, last_s = span.partition("-")
        first = _int(first_s.strip(), text)
        last = _int(last_s.strip(), text) if dash else first
        if last < first:
            raise CpulistError(text, f"range {span!r} runs backwards")
        if first <= top:
            ordered = False
        top = last
        if not sep:
            cpus.extend(range(first, last + 1))
            continue
        used_s, slash, group_s = stride.partition("/")
        if not slash:
            raise CpulistError(text, f"stride {stride!r} must be used/group, as in 0-15:2/4")
        used, group = _int(used_s, text), _int(group_s, text)
        if used == 0 or group == 0 or used > group:
            raise CpulistError(text, f"stride {stride!r} needs 0 < used <= group")
        for base in range(first, last + 1, group):
            cpus.extend(range(base, min(base + used, last + 1)))
    return cpus if ordered else sorted(set(cpus))


def format_cpulist(cpus) -> str:
    """Kernel cpulist text ("0-3,8") of an iterable of CPU numbers; "" for none."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    index = 0
    while index < len(ordered):
        end = index
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        first, last = ordered[index], ordered[end]
        parts.append(str(first) if first == last else f"{first}-{last}")
        index = end + 1
    return ",".join(parts)


def parse_cpumask(text: str) -> list[int]:
    """Sorted CPU numbers of a kernel cpumask ("ff,ffffffff"); raises CpulistError.

    Comma-separated 32-bit hex words, most significant first; the first word may be short and
    the mask may be any width (kernels with NR_CPUS > 512 write more words).
    """
    body = _clean(text)
    if body == "":
        return []
    words = body.split(",")
    if len(words) * 32 > MAX_CPUS:
        raise CpulistError(text, f"mask wider than {MAX_CPUS} CPUs")
    cpus: list[int] = []
    for position, word in enumerate(reversed(words)):
        word = word.strip()
        if word == "":
            continue
        if len(word) > 8:
            raise CpulistError(text, f"word {word!r} is longer than 32 bits")
        if not _HEX_WORD.match(word):  # int(..., 16) would take "-1", "+f" and "f_f"
            raise CpulistError(text, f"word {word!r} is not hexadecimal")
        value = int(word, 16)
        bit = 0
        while value:
            if value & 1:
                cpus.append(position * 32 + bit)
            value >>= 1
            bit += 1
    return sorted(cpus)


def format_cpumask(cpus) -> str:
    """Kernel cpumask text of CPU numbers: 32-bit hex words, most significant first ("0" for none)."""
    value = 0
    for cpu in set(cpus):
        value |= 1 << cpu
    words = []
    while True:
        words.append(value & 0xFFFFFFFF)
        value >>= 32
        if not value:
            break
    text = [f"{words[-1]:x}"] + [f"{word:08x}" for word in reversed(words[:-1])]
    return ",".join(text)
