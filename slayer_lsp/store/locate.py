"""Where the store is and which backend reads it, decided exactly as SLayer decides."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")
_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True, slots=True)
class StoreLocation:
    backend: str  # "yaml" | "sqlite"
    path: Path

    def __str__(self) -> str:
        return f"{self.backend}:{self.path}"


def default_storage() -> str:
    """``$SLAYER_STORAGE``, else ``$SLAYER_MODELS_DIR``, else the XDG data directory."""
    for var in ("SLAYER_STORAGE", "SLAYER_MODELS_DIR"):
        value = os.environ.get(var)
        if value:
            return value
    xdg = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(xdg, "slayer")


def locate(storage: str | os.PathLike[str] | None = None) -> StoreLocation:
    """Pick the backend from a path or URI: ``sqlite://`` or a .db/.sqlite/.sqlite3 file is SQLite,
    ``yaml://`` or anything else is a YAML directory."""
    raw = os.fspath(storage) if storage is not None else default_storage()
    # absolute, so that file URIs (definitions, inspect locations) and cache keys never depend on the cwd
    if raw.startswith("sqlite://"):
        return StoreLocation("sqlite", Path(raw[len("sqlite://") :]).expanduser().absolute())
    if raw.startswith("yaml://"):
        return StoreLocation("yaml", Path(raw[len("yaml://") :]).expanduser().absolute())
    path = Path(raw).expanduser().absolute()
    if path.suffix.lower() in SQLITE_SUFFIXES:
        return StoreLocation("sqlite", path)
    return StoreLocation("yaml", path)


def expand_env(value: str) -> tuple[str, list[str]]:
    """Substitute ``${VAR}`` placeholders; return the text and the names that are unset.

    The catalog keeps stored strings verbatim; this is for display and for callers that connect.
    """
    missing: list[str] = []

    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in os.environ:
            return os.environ[name]
        missing.append(name)
        return match.group(0)

    return _ENV_RE.sub(sub, value), missing
