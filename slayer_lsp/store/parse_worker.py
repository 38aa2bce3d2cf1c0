"""A worker process of the cold read: ``python -m slayer_lsp.store.parse_worker``.

Reads ``[store root, [path, ...]]`` (msgpack) on stdin, parses those files exactly as the YAML reader
does, and writes the cache entries it would export (msgpack) on stdout. A process of its own, not a
``multiprocessing`` child, so it never depends on how the parent's main module was started.
"""

from __future__ import annotations

import sys

import msgspec


def main() -> int:
    from slayer_lsp.store.reader import parse_paths

    root, paths = msgspec.msgpack.decode(sys.stdin.buffer.read(), type=tuple[str, list[str]])
    sys.stdout.buffer.write(parse_paths(root, paths))
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
