"""The one reader of files dslc did not write: plans and their imports, data files,
Hugging Face folders. Any of them may come from a stranger (plans arrive in pull
requests with their folders), so every read is bounded the same way:

- only regular files: the path is stat'ed before it is opened, so a FIFO, a device, a
  socket or a folder is never opened, and the open file again (``O_NONBLOCK``: a FIFO
  swapped in between neither hangs the open nor is read); a kernel file under /proc,
  /sys or /dev, regular as it may look, is refused too;
- at most a bound of bytes per kind of file, never past the file's end;
- JSON at most :data:`JSON_DEPTH` levels deep, without NaN or Infinity.

The generated program's twin is in ``templates/utils.py.jinja`` (``open_regular``,
``read_file``, ``read_json``): the same rules, failing with one line instead of raising.
"""

from __future__ import annotations

import errno
import json
import os
import stat

JSON_DEPTH = 64  # the deepest nesting of arrays and objects a JSON file read may have
SYSTEM_FILES = ("/proc/", "/sys/", "/dev/")  # regular-looking files of the kernel's

KINDS = {  # what a path that is neither a file nor a directory names
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


class NotAFile(OSError):
    """A path that names a FIFO, a device, a socket or a kernel file: never read.
    ``kind`` says which ("a FIFO")."""

    kind = "not a regular file"


def shown(path: str) -> str:
    """``path`` as a message names it: with the file it leads to when it is a link."""
    return f"{path} (a link to {os.path.realpath(path)})" if os.path.islink(path) else path


def within(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or lies below it, by their names (``..`` resolved,
    relative to the working directory; no link followed: give real paths for that, as
    :func:`inside` does). The one confinement rule of what dslc writes, reads from a
    commit and mounts in a pod."""
    path, folder = os.path.abspath(path), os.path.abspath(folder)
    return os.path.commonpath([path, folder]) == folder


def inside(path: str, folder: str) -> bool:
    """Whether the file ``path`` leads to, through any links, lies in the folder
    ``folder`` leads to."""
    return within(os.path.realpath(path), os.path.realpath(folder))


def require_regular(st: os.stat_result, path: str) -> None:
    """IsADirectoryError or NotAFile unless ``st`` is a regular file's status."""
    if stat.S_ISREG(st.st_mode):
        if not os.path.realpath(path).startswith(SYSTEM_FILES):
            return
        kind = "a file of the kernel's"
    elif stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", path)
    else:
        kind = KINDS.get(stat.S_IFMT(st.st_mode), NotAFile.kind)
    hint = "; use '-' for standard input" if stat.S_ISFIFO(st.st_mode) else ""
    e = NotAFile(errno.EINVAL, f"not a regular file ({kind}{hint})", path)
    e.kind = kind
    raise e


def open_regular(path: str) -> tuple[int, os.stat_result]:
    """A descriptor of the regular file ``path``, open for reading, and its status;
    OSError (FileNotFoundError, IsADirectoryError, NotAFile, ...) when it is not one."""
    try:
        require_regular(os.stat(path), path)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except ValueError:  # a NUL in the name
        raise FileNotFoundError(errno.ENOENT, "not a file name (a NUL byte)", path) from None
    try:
        st = os.fstat(fd)
        require_regular(st, path)
    except OSError:
        os.close(fd)
        raise
    return fd, st


def read_bytes(path: str, limit: int, at: int = 0, size: int | None = None) -> tuple[bytes, os.stat_result]:
    """``size`` bytes of the regular file ``path`` from byte ``at`` (fewer at its end), at
    most ``limit + 1`` of them, and its status. ``size`` None: the rest of the file, or
    nothing when the status already says that is more than ``limit`` (the caller tells
    a long file by ``st_size`` or by the extra byte)."""
    fd, st = open_regular(path)
    try:
        if size is None:
            size = st.st_size - at if st.st_size - at <= limit else 0
        chunks, left = [], min(size, limit + 1)
        while left > 0 and (chunk := os.pread(fd, left, at)):
            chunks.append(chunk)
            left, at = left - len(chunk), at + len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks), st


def read_json(path: str, limit: int) -> object:
    """The JSON value in the regular file ``path``; ValueError (the reason, one line)
    when it is longer than ``limit`` bytes, not JSON, holds NaN or Infinity, or nests
    deeper than :data:`JSON_DEPTH`; OSError when it cannot be read."""
    data, st = read_bytes(path, limit)
    if st.st_size > limit or len(data) > limit:
        raise ValueError(f"larger than {limit // 2**20} MiB")
    return parse_json(data)


def parse_json(data: bytes) -> object:
    """The JSON value in ``data``, as :func:`read_json` takes it (ValueError: why not)."""
    try:
        found = json.loads(data, parse_constant=_not_json)
    except RecursionError:
        raise ValueError(f"nested more than {JSON_DEPTH} deep") from None
    except ValueError as e:  # not JSON, not UTF-8
        raise ValueError(str(e).splitlines()[0][:100]) from None
    if json_depth(found) > JSON_DEPTH:
        raise ValueError(f"nested more than {JSON_DEPTH} deep")
    return found


def _not_json(constant: str) -> None:
    raise ValueError(f"{constant} is not JSON")


def json_depth(value: object) -> int:
    """How deep arrays and objects nest in ``value``, found without recursion."""
    deepest, nested = 0, [(value, 1)]
    while nested:
        value, depth = nested.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, depth)
            nested += [(v, depth + 1) for v in (value.values() if isinstance(value, dict) else value)]
    return deepest
