"""A test-side reader of systemd unit files: what systemd itself would parse back.

It follows systemd.syntax(7), systemd.unit(5) "SPECIFIERS" and systemd.service(5) "COMMAND LINES"
as systemd 252 implements them (the parser of unit files, the word splitter with its quoting and
C escapes, and the checks on the program path). It is written from those documents, not copied
from systemd: where a rule below is a fact about systemd, the comment says which one.

API (kept stable: other tests import it):

- ``parse_unit(text) -> [(section, key, raw_value)]``: the assignments in file order, after
  comments, line continuations and whitespace trimming; raises UnitSyntaxError on what systemd
  refuses or ignores (a line with no ``=``, a key outside a section, a bad section header).
- ``description(raw) -> str``: a free-text setting (Description=, Documentation= words aside).
- ``plain_value(raw) -> str``: any setting that only expands specifiers (User=, Slice=, ...).
- ``path_value(raw) -> str``: a path setting (WorkingDirectory=, ConditionPathExists=): specifiers,
  then the path must be absolute and normalised.
- ``unit_list(raw) -> [str]``: Requires=/After=/Wants=: words after specifiers.
- ``environment(raw) -> {name: value}``: one Environment= line.
- ``exec_command(raw) -> (prefixes, argv)``: one ExecStart=-style line with a single command;
  ``exec_commands(raw)`` gives every command when ``;`` separates several.
- ``user_group(raw) -> str``: User=/Group= (numeric ids or names systemd accepts).
- ``lookup(entries, section, key) -> [raw]``: convenience.

Specifiers: ``%%`` becomes ``%``; any other ``%X`` is reported (UnresolvedSpecifier), never kept
silently, because its expansion depends on the unit and host. ``$`` in command lines: ``$$``
becomes ``$``; ``$NAME``/``${NAME}`` is reported (UnexpandedVariable) for the same reason.
"""

from __future__ import annotations

import re

# systemd's WHITESPACE: what strstrip() trims and what separates words (src/basic/string-util.h).
WHITESPACE = " \t\n\r"
COMMENTS = "#;"
# read_line() refuses longer lines (LONG_LINE_MAX, src/basic/fileio.h): 1 MiB.
LONG_LINE_MAX = 1024 * 1024
# PATH_MAX and NAME_MAX of Linux (path_is_valid(), filename_is_valid()).
PATH_MAX = 4096
NAME_MAX = 255
# ExecStart= prefixes read from the first word (systemd.service(5) table "Special executable
# prefixes").
EXEC_PREFIXES = "-@:+!|"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_VAR_NAME_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_"


class UnitSyntaxError(ValueError):
    """What systemd would refuse, ignore with a warning, or read differently than written."""


class UnresolvedSpecifier(UnitSyntaxError):
    """A ``%X`` other than ``%%``: systemd replaces it by a value of the unit or the host."""

    def __init__(self, raw: str, specifier: str):
        super().__init__(f"specifier %{specifier} in {raw!r} would be expanded by systemd")
        self.specifier = specifier


class UnexpandedVariable(UnitSyntaxError):
    """A ``$NAME`` or ``${NAME}`` in a command line: systemd substitutes the environment."""

    def __init__(self, word: str, name: str):
        super().__init__(f"variable ${name} in {word!r} would be substituted by systemd")
        self.name = name


# --- lines ------------------------------------------------------------------------------------


def _strip(text: str) -> str:
    return text.strip(WHITESPACE)


def _ends_escaped(text: str) -> bool:
    """Whether a backslash at the end of ``text`` is left unpaired, read left to right.

    systemd walks the line pairing each backslash with the character after it; only a final
    backslash that is not itself escaped continues the line (so ``a\\\\`` does not, ``a\\`` does).
    """
    escaped = False
    for char in text:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
    return escaped


def parse_unit(text: str) -> list[tuple[str, str, str]]:
    """[(section, key, raw value)] of a unit file; raises UnitSyntaxError.

    Lines end at \\n, \\r\\n or \\r. A line whose first non-blank character is # or ; is a
    comment, also inside a continuation (it is skipped, the continuation goes on). A line ending
    in an unescaped backslash is joined with the next one, the backslash replaced by a space.
    Key and value are trimmed of spaces, tabs, CR and LF.
    """
    if "\x00" in text:
        raise UnitSyntaxError("NUL byte in the unit file: systemd ends the line there")
    lines = re.split(r"\r\n|\r|\n", text)
    if lines and lines[-1] == "":
        lines.pop()
    entries: list[tuple[str, str, str]] = []
    section = None
    continuation = None
    for number, line in enumerate(lines, 1):
        if len(line.encode("utf-8", "surrogatepass")) > LONG_LINE_MAX:
            raise UnitSyntaxError(f"line {number} is longer than {LONG_LINE_MAX} bytes")
        stripped = line.lstrip(WHITESPACE)
        if stripped and stripped[0] in COMMENTS:
            continue
        joined = line if continuation is None else continuation + line
        if _ends_escaped(joined):
            continuation = joined[:-1] + " "
            continue
        continuation = None
        section = _parse_line(joined, number, section, entries)
    if continuation is not None:
        # At the end of the file the pending continuation is parsed as it stands.
        _parse_line(continuation, len(lines), section, entries)
    return entries


def _parse_line(line: str, number: int, section, entries: list):
    line = _strip(line)
    if not line:
        return section
    if line.startswith("["):
        if not line.endswith("]") or len(line) < 3:
            raise UnitSyntaxError(f"line {number}: invalid section header {line!r}")
        return line[1:-1]
    if section is None:
        raise UnitSyntaxError(f"line {number}: assignment {line!r} outside of any section")
    if "=" not in line:
        raise UnitSyntaxError(f"line {number}: {line!r} has no '=' (systemd ignores the line)")
    key, value = line.split("=", 1)
    key = _strip(key)
    if not key:
        raise UnitSyntaxError(f"line {number}: missing key name before '='")
    entries.append((section, key, _strip(value)))
    return section


def lookup(entries: list, section: str, key: str) -> list[str]:
    """The raw values of every ``key`` in ``section``, in file order."""
    return [value for sec, name, value in entries if sec == section and name == key]


# --- specifiers -------------------------------------------------------------------------------


def specifiers(raw: str) -> str:
    """``raw`` with ``%%`` -> ``%``; raises UnresolvedSpecifier on any other ``%X`` or a lone %."""
    out = []
    index = 0
    while index < len(raw):
        char = raw[index]
        if char != "%":
            out.append(char)
            index += 1
            continue
        following = raw[index + 1 : index + 2]
        if following == "%":
            out.append("%")
            index += 2
            continue
        raise UnresolvedSpecifier(raw, following)
    return "".join(out)


def description(raw: str) -> str:
    """A free-text value (Description=): specifiers only, no unquoting or unescaping."""
    return specifiers(raw)


def plain_value(raw: str) -> str:
    """Any value that expands specifiers and nothing else (Slice=, RuntimeDirectory=, ...)."""
    return specifiers(raw)


def unit_list(raw: str) -> list[str]:
    """Unit names of Requires=/After=/Wants=: specifiers, then whitespace-separated words."""
    return [word for word in re.split(r"[ \t\n\r]+", specifiers(raw)) if word]


def path_value(raw: str) -> str:
    """A path setting: specifiers, then an absolute normalised path; raises UnitSyntaxError."""
    path = specifiers(raw)
    check_path(path, absolute=True)
    return path


def check_path(path: str, absolute: bool) -> None:
    """Raise UnitSyntaxError unless systemd takes ``path`` (path_is_valid + path_is_normalized).

    Valid: non-empty, at most PATH_MAX-1 bytes, each component at most NAME_MAX bytes. Normalised:
    no ``.`` or ``..`` component and no ``//``. ``absolute``: it must start with ``/``.
    """
    data = path.encode("utf-8", "surrogatepass")
    if not path or len(data) >= PATH_MAX:
        raise UnitSyntaxError(f"path of {len(data)} bytes: empty or not below PATH_MAX")
    if absolute and not path.startswith("/"):
        raise UnitSyntaxError(f"{path!r} is not an absolute path")
    if "//" in path:
        raise UnitSyntaxError(f"{path!r} is not normalised (//)")
    for part in path.split("/"):
        if part in (".", ".."):
            raise UnitSyntaxError(f"{path!r} is not normalised ({part} component)")
        if len(part.encode("utf-8", "surrogatepass")) > NAME_MAX:
            raise UnitSyntaxError(f"{path!r} has a component over NAME_MAX bytes")


def user_group(raw: str) -> str:
    """User=/Group=: specifiers, then a name systemd accepts without warning, or a numeric id.

    Raises UnitSyntaxError on what systemd's relaxed check refuses (control characters, ``:``,
    ``/``, leading or trailing space, ``.``/``..``, all digits beyond the id range) and on names
    outside the strict portable set ``[A-Za-z_][A-Za-z0-9_-]*`` of at most 31 characters, for
    which systemd warns (systemd-analyze verify prints the warning).
    """
    name = specifiers(raw)
    if name.isascii() and name.isdigit():
        uid = int(name)
        if uid >= 0xFFFFFFFF or uid == 0xFFFF:
            raise UnitSyntaxError(f"{name} is not a valid user or group id")
        return name
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]{0,30}", name):
        raise UnitSyntaxError(f"{name!r} is not a user or group name systemd takes silently")
    return name


# --- words: quoting and C escapes (extract_first_word with UNQUOTE|CUNESCAPE) ------------------


def _cunescape_one(text: str, index: int) -> tuple[str, int]:
    """(character, next index) of the escape starting after the backslash at ``index - 1``."""
    simple = {
        "a": "\a",
        "b": "\b",
        "f": "\f",
        "n": "\n",
        "r": "\r",
        "t": "\t",
        "v": "\v",
        "\\": "\\",
        '"': '"',
        "'": "'",
        "s": " ",
    }
    if index >= len(text):
        raise UnitSyntaxError(f"{text!r} ends in a lone backslash")
    char = text[index]
    if char in simple:
        return simple[char], index + 1
    if char == "x":
        digits = text[index + 1 : index + 3]
        if not re.fullmatch(r"[0-9a-fA-F]{2}", digits):
            raise UnitSyntaxError(f"invalid \\x escape in {text!r}")
        code = int(digits, 16)
        if code == 0:
            raise UnitSyntaxError(f"\\x00 in {text!r}: systemd refuses NUL")
        return _byte_char(code), index + 3
    if char in "uU":
        width = 4 if char == "u" else 8
        digits = text[index + 1 : index + 1 + width]
        if not re.fullmatch(rf"[0-9a-fA-F]{{{width}}}", digits):
            raise UnitSyntaxError(f"invalid \\{char} escape in {text!r}")
        code = int(digits, 16)
        if code == 0 or code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
            raise UnitSyntaxError(f"\\{char}{digits} in {text!r} is not a valid code point")
        return chr(code), index + 1 + width
    if char in "01234567":
        digits = text[index : index + 3]
        if not re.fullmatch(r"[0-7]{3}", digits):
            raise UnitSyntaxError(f"invalid octal escape in {text!r}")
        code = int(digits, 8)
        if code == 0 or code > 0o377:
            raise UnitSyntaxError(f"octal escape \\{digits} in {text!r} is NUL or above 255")
        return _byte_char(code), index + 3
    raise UnitSyntaxError(f"invalid escape \\{char} in {text!r}")


def _byte_char(code: int) -> str:
    # A byte escape: ASCII stands for itself; a byte above 0x7f is a raw byte of a UTF-8 sequence,
    # kept as a surrogate escape so that _join_bytes can decode a run of them.
    return chr(code) if code < 0x80 else chr(0xDC00 + code)


def _join_bytes(word: str) -> str:
    data = word.encode("utf-8", "surrogateescape")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UnitSyntaxError(f"escapes in {word!r} make invalid UTF-8") from None


def split_words(text: str) -> list[tuple[str, bool]]:
    """[(word, was_quoted_anywhere)] of ``text`` split like extract_first_word(UNQUOTE|CUNESCAPE).

    Whitespace separates words outside quotes; ``"`` and ``'`` quote, also in the middle of a word;
    a backslash escape (C escapes, in and out of quotes) is decoded; an unterminated quote or a
    trailing lone backslash raises UnitSyntaxError.
    """
    words = []
    index = 0
    while True:
        while index < len(text) and text[index] in WHITESPACE:
            index += 1
        if index >= len(text):
            return words
        word, quoted, index = _one_word(text, index)
        words.append((word, quoted))


def _one_word(text: str, index: int) -> tuple[str, bool, int]:
    out = []
    quote = None
    quoted = False
    while index < len(text):
        char = text[index]
        if char == "\\":
            decoded, index = _cunescape_one(text, index + 1)
            out.append(decoded)
            continue
        if quote:
            if char == quote:
                quote = None
            else:
                out.append(char)
            index += 1
            continue
        if char in "\"'":
            quote = char
            quoted = True
            index += 1
            continue
        if char in WHITESPACE:
            break
        out.append(char)
        index += 1
    if quote:
        raise UnitSyntaxError(f"unterminated {quote} quote in {text!r}")
    return _join_bytes("".join(out)), quoted, index


# --- Environment= ----------------------------------------------------------------------------


def environment(raw: str) -> dict[str, str]:
    """{name: value} of one Environment= line; raises UnitSyntaxError / UnresolvedSpecifier.

    Words are unquoted and unescaped first, then specifiers are expanded in each word (systemd's
    order). A word that is not NAME=VALUE with a valid name is ignored by systemd: reported here.
    Values are literal: ``$`` is not expanded in Environment=. A later name replaces an earlier.
    """
    result: dict[str, str] = {}
    for word, dummy in split_words(raw):
        word = specifiers(word)
        name, sep, value = word.partition("=")
        if not sep or not _ENV_NAME.match(name):
            raise UnitSyntaxError(f"{word!r} is not a NAME=VALUE assignment (systemd ignores it)")
        result[name] = value
    return result


# --- ExecStart= ------------------------------------------------------------------------------


def _expand_dollars(word: str) -> str:
    """``$$`` -> ``$``; raises UnexpandedVariable on ``${NAME}`` or ``$NAME``; a lone ``$`` stays."""
    out = []
    index = 0
    while index < len(word):
        char = word[index]
        if char != "$":
            out.append(char)
            index += 1
            continue
        following = word[index + 1 : index + 2]
        if following == "$":
            out.append("$")
            index += 2
        elif following == "{":
            end = word.find("}", index)
            if end < 0:
                out.append(char)  # no closing brace: systemd keeps the text as it is
                index += 1
                continue
            raise UnexpandedVariable(word, word[index + 2 : end])
        elif following and following in _VAR_NAME_CHARS:
            end = index + 1
            while end < len(word) and word[end] in _VAR_NAME_CHARS:
                end += 1
            raise UnexpandedVariable(word, word[index + 1 : end])
        else:
            out.append(char)
            index += 1
    return "".join(out)


def exec_commands(raw: str) -> list[tuple[str, list[str]]]:
    """[(prefixes, argv)] of an ExecStart=-style value; raises UnitSyntaxError and subclasses.

    Specifiers are expanded on the whole value first, then words are split and unquoted; the
    prefixes come off the first word of each command; a lone unquoted ``;`` word ends a command
    (``\\;`` is a literal ``;``); ``$$``/``$NAME``/``${NAME}`` are then handled per argument. The
    program must be an absolute normalised path or a plain file name, with no quote, backslash or
    control character, and not ending in ``/``.
    """
    text = specifiers(raw)
    commands: list[tuple[str, list[str]]] = []
    index = 0
    while True:
        prefixes, argv, index = _one_command(text, index)
        if argv is None:
            break
        commands.append((prefixes, argv))
    if not commands:
        raise UnitSyntaxError(f"{raw!r} holds no command")
    return commands


def _one_command(text: str, index: int):
    argv: list[str] = []
    prefixes = ""
    first = True
    while True:
        while index < len(text) and text[index] in WHITESPACE:
            index += 1
        if index >= len(text):
            break
        rest = text[index:]
        if rest[0] == ";" and (len(rest) == 1 or rest[1] in WHITESPACE):
            index += 1
            if first:
                raise UnitSyntaxError(f"empty command before ';' in {text!r}")
            return prefixes, argv, index
        if rest.startswith("\\;") and (len(rest) == 2 or rest[2] in WHITESPACE):
            word, index = ";", index + 2
        else:
            word, dummy, index = _one_word(text, index)
        if first:
            first = False
            prefixes, word = _prefixes(word)
            _check_program(word)
            argv.append(_expand_dollars(word))
        else:
            argv.append(_expand_dollars(word))
    if first:
        return "", None, index
    return prefixes, argv, index


def _prefixes(word: str) -> tuple[str, str]:
    count = 0
    while count < len(word) and word[count] in EXEC_PREFIXES:
        count += 1
    prefixes, program = word[:count], word[count:]
    if len(set(prefixes)) != len(prefixes) and prefixes.count("!") != 2:
        raise UnitSyntaxError(f"repeated prefix in {word!r}")
    if sum(mark in prefixes for mark in "+!") > 1 or ("!" in prefixes and "+" in prefixes):
        raise UnitSyntaxError(f"prefixes + and ! exclude each other in {word!r}")
    return prefixes, program


def _check_program(program: str) -> None:
    if not program:
        raise UnitSyntaxError("empty program path in the command line")
    if any(ord(c) < 0x20 or ord(c) == 0x7F or c in "\\\"'" for c in program):
        raise UnitSyntaxError(f"program {program!r} holds special characters systemd refuses")
    if "$" in program:
        # The path is used as written while argv[0] gets $ expanded: the two would differ.
        raise UnitSyntaxError(f"program {program!r} holds $, which systemd does not expand there")
    if program.endswith("/"):
        raise UnitSyntaxError(f"program {program!r} names a directory")
    if program.startswith("/"):
        check_path(program, absolute=True)
    elif "/" in program or program in (".", "..") or len(program.encode()) > NAME_MAX:
        raise UnitSyntaxError(f"program {program!r} is neither an absolute path nor a file name")


def exec_command(raw: str) -> tuple[str, list[str]]:
    """(prefixes, argv) of an ExecStart=-style value holding exactly one command."""
    commands = exec_commands(raw)
    if len(commands) != 1:
        raise UnitSyntaxError(f"{raw!r} holds {len(commands)} commands, not one")
    return commands[0]
