"""Opening a store file without ever leaving the store.

Policy: below the store's root nothing but real directories and regular files is read. A symbolic
link is refused wherever it is (a document, ``models/<ds>``, ``memories``, ...), whatever it points to,
even inside the store: SLayer's writer never creates one, a link to a store file would define the same
document twice, and a link outward would serve another file's content (``/proc/self/environ``) through
search. The root itself may be a link (a store moved elsewhere): it is where the user said the store is.
FIFOs, sockets and devices are refused without being opened for reading (a FIFO would block the reader).

The check and the read cannot be split by a rename (TOCTOU): each directory below the root is opened
with ``O_NOFOLLOW | O_DIRECTORY`` relative to its parent's descriptor, the file with ``O_NOFOLLOW |
O_NONBLOCK``, and what was opened is judged by ``fstat``; the bytes read are those of that inode.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from slayer_lsp.store.limits import MAX_DOCUMENT_BYTES

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class Refused(Exception):
    """A path the reader will not read: a link, not a regular file, too large, outside the store."""


def kind_of(mode: int) -> str:
    """What a non-regular file is, in a reader's words."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def refusal(what: str) -> str:
    return f"is {what}; only regular files and real directories inside the store are read"


def relative_parts(root: Path, path: str | os.PathLike[str]) -> tuple[str, ...] | None:
    """``path``'s components below ``root`` (lexically), or None when it is not a plain path below it
    (outside, the root itself, or holding ``.``/``..``)."""
    try:
        parts = Path(path).relative_to(root).parts
    except ValueError:
        return None
    if not parts or any(p in ("", ".", "..") for p in parts):
        return None
    return parts


def _open_dir_chain(root: Path, dirs: Sequence[str]) -> int:
    """A descriptor of ``root/dirs...``, following no link below the root."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(dirs):
            try:
                nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                try:
                    what = kind_of(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode)
                except OSError:
                    what = "not a directory"
                raise Refused(f"'{'/'.join(dirs[: i + 1])}' {refusal(what)}") from None
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_store_file(
    root: Path, parts: Sequence[str], max_bytes: int = MAX_DOCUMENT_BYTES
) -> tuple[os.stat_result, bytes]:
    """The ``fstat`` and bytes of the regular file ``root/parts...``. Raises ``Refused`` for a link
    anywhere below the root, a non-regular file or one over ``max_bytes``; ``OSError`` when it cannot
    be read (gone, permissions)."""
    dfd = _open_dir_chain(root, parts[:-1])
    try:
        name = parts[-1]
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):  # judged before opening: opening a device can have effects
            raise Refused(refusal(kind_of(st.st_mode)))
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=dfd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # replaced by a link since the lstat
                raise Refused(refusal("a symbolic link")) from None
            raise
    finally:
        os.close(dfd)
    try:
        return st_and_bytes(fd, max_bytes)
    finally:
        os.close(fd)


def st_and_bytes(fd: int, max_bytes: int) -> tuple[os.stat_result, bytes]:
    """Judge an open descriptor by ``fstat`` and read at most ``max_bytes`` from it."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise Refused(refusal(kind_of(st.st_mode)))
    if st.st_size > max_bytes:
        raise Refused(too_large(st.st_size, max_bytes))
    chunks: list[bytes] = []
    size = 0
    while True:  # the file may grow while read: never past the bound
        chunk = os.read(fd, min(max_bytes + 1 - size, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            raise Refused(too_large(size, max_bytes))
    return st, b"".join(chunks)


def too_large(size: int, max_bytes: int) -> str:
    return f"is larger than {max_bytes // (1024 * 1024)} MiB ({size} bytes or more); not read"


def read_file(
    path: str, root: Path | None = None, max_bytes: int = MAX_DOCUMENT_BYTES, follow: bool = False
) -> bytes:
    """A file's bytes, read as the store reader reads: below ``root`` no link anywhere below it;
    elsewhere the last component is followed only with ``follow``. Never a FIFO, socket or device,
    never past ``max_bytes``. Raises ``Refused`` or ``OSError``."""
    parts = relative_parts(root, path) if root is not None else None
    if parts is not None:
        return read_store_file(root, parts, max_bytes)[1]  # type: ignore[arg-type]
    fd = os.open(path, _FILE_FLAGS & ~os.O_NOFOLLOW if follow else _FILE_FLAGS)
    try:
        return st_and_bytes(fd, max_bytes)[1]
    finally:
        os.close(fd)


def read_text_file(
    path: str, root: Path | None = None, max_bytes: int = MAX_DOCUMENT_BYTES, universal_newlines: bool = True
) -> str | None:
    """A store file's text for locating keys and positions, or None when it is refused or unreadable
    (what ``open(path, encoding="utf-8").read()`` gave, newlines translated, without following a link
    in the last component, opening a FIFO for a blocking read or reading past ``max_bytes``)."""
    try:
        text = read_file(path, root, max_bytes).decode("utf-8")
    except (OSError, Refused, UnicodeDecodeError):
        return None
    return text.replace("\r\n", "\n").replace("\r", "\n") if universal_newlines else text
