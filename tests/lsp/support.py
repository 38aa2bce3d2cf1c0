"""Helpers of the end-to-end tests: a private copy of the fixture store, a server started over stdio
with a given client's capabilities, and waits that poll for what the server pushes."""

from __future__ import annotations

import asyncio
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lsprotocol import types as t
from pytest_lsp import LanguageClient, client_capabilities
from pytest_lsp.client import make_test_lsp_client

from tests.conftest import FIXTURES

REPO = Path(__file__).resolve().parents[2]
YAML_STORE = FIXTURES / "store-yaml"
SQLITE_STORE = FIXTURES / "store.db"

# VS Code (work-done progress, configuration), Neovim 0.7 (no configuration, no pull diagnostics),
# Emacs 29 (eglot: utf-32 first among its position encodings); "bare" declares no capability at all
CLIENTS = ["visual-studio-code", "neovim@v0.7.0", "emacs"]
WAIT_S = 30.0


def copy_store(tmp_path_factory: Any, name: str = "store", sqlite: bool = False) -> Path:
    """A private, writable copy of a fixture store (the fixtures are read-only, and so would be a
    plain copy for a user who is not root)."""
    root = tmp_path_factory.mktemp(name)
    if sqlite:
        dst = root / "store.db"
        shutil.copyfile(SQLITE_STORE, dst)
        dst.chmod(0o644)
        return dst
    dst = root / "store"
    shutil.copytree(YAML_STORE, dst, copy_function=shutil.copyfile)
    for path in [dst, *dst.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return dst


# The real embedding model is loaded only where a test asks for it (``dense=True``): every other
# server runs the lexical channels alone.
NO_EMBEDDINGS = {"enable": False}


async def start_client(
    store: Path | None,
    client: str,
    options: dict[str, Any] | None = None,
    args: list[str] | None = None,
    workspace: Path | None = None,
    wait_ready: bool = True,
    dense: bool = False,
) -> LanguageClient:
    c = make_test_lsp_client()
    cmd = [
        sys.executable,
        "-m",
        "slayer_lsp.lsp",
        *(["--storage", str(store)] if store else []),
        *(args or []),
    ]
    await c.start_io(*cmd, cwd=str(REPO))
    init = dict(options) if options is not None else {"diagnostics": {"debounceMs": 20}}
    if not dense:
        init.setdefault("embedding", NO_EMBEDDINGS)
    result = await c.initialize_session(
        t.InitializeParams(
            capabilities=t.ClientCapabilities() if client == "bare" else client_capabilities(client),
            root_uri=workspace.as_uri() if workspace else None,
            initialization_options=init,
        )
    )
    c.init_result = result  # type: ignore[attr-defined]
    if wait_ready:  # requests wait for the first index anyway; status answers at once
        await eventually(
            lambda: c.protocol.send_request_async("slayer/status", {}), lambda s: s.ready, "the initial index"
        )
    return c


async def stop_client(c: LanguageClient) -> None:
    await c.shutdown_session()
    await c.stop()


def uri_of(path: Path) -> str:
    return path.resolve().as_uri()


def open_doc(c: LanguageClient, uri: str, text: str, language: str = "yaml", version: int = 1) -> None:
    c.text_document_did_open(
        t.DidOpenTextDocumentParams(
            text_document=t.TextDocumentItem(uri=uri, language_id=language, version=version, text=text)
        )
    )


def replace_doc(c: LanguageClient, uri: str, text: str, version: int) -> None:
    """A full-text change (every client may send those)."""
    c.text_document_did_change(
        t.DidChangeTextDocumentParams(
            text_document=t.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[t.TextDocumentContentChangeWholeDocument(text=text)],
        )
    )


def close_doc(c: LanguageClient, uri: str) -> None:
    c.text_document_did_close(t.DidCloseTextDocumentParams(text_document=t.TextDocumentIdentifier(uri=uri)))


async def eventually(
    probe: Callable[[], Any], check: Callable[[Any], bool], what: str, timeout: float = WAIT_S
) -> Any:
    """Poll ``probe`` (sync or async) until ``check`` holds; fail with the last value seen."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: Any = None
    while True:
        last = probe()
        if asyncio.iscoroutine(last):
            last = await last
        if check(last):
            return last
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last value: {last!r}")
        await asyncio.sleep(0.05)


async def diagnostics(
    c: LanguageClient,
    uri: str,
    check: Callable[[list[t.Diagnostic]], bool] | None = None,
    what: str = "diagnostics",
) -> list[t.Diagnostic]:
    return await eventually(
        lambda: c.diagnostics.get(uri),
        lambda d: d is not None and (check is None or check(d)),
        f"{what} of {uri}",
    )


def codes(diags: list[t.Diagnostic]) -> list[tuple[str, int]]:
    return sorted((str(d.code), d.range.start.line) for d in diags)


def pos(text: str, marker: str = "§", encoding: str = "utf-32") -> tuple[str, t.Position]:
    """Text without the cursor marker, and the cursor in the negotiated encoding's units."""
    before = text[: text.index(marker)]
    line = before.split("\n")[-1]
    units = {"utf-8": len(line.encode("utf-8")), "utf-16": len(line.encode("utf-16-le")) // 2}.get(
        encoding, len(line)
    )
    return text.replace(marker, ""), t.Position(line=before.count("\n"), character=units)


def encoding_of(c: LanguageClient) -> str:
    enc = c.init_result.capabilities.position_encoding  # type: ignore[attr-defined]
    return str(enc.value if hasattr(enc, "value") else enc or "utf-16")


async def complete(c: LanguageClient, uri: str, position: t.Position) -> list[t.CompletionItem]:
    res = await c.text_document_completion_async(
        t.CompletionParams(text_document=t.TextDocumentIdentifier(uri=uri), position=position)
    )
    if res is None:
        return []
    return list(res.items if isinstance(res, t.CompletionList) else res)


async def hover_text(c: LanguageClient, uri: str, position: t.Position) -> str | None:
    res = await c.text_document_hover_async(
        t.HoverParams(text_document=t.TextDocumentIdentifier(uri=uri), position=position)
    )
    if res is None:
        return None
    return res.contents.value  # type: ignore[union-attr]


async def atomic_write(path: Path, text: str) -> None:
    """Write as SLayer does: a dot-prefixed temp file in the same directory, renamed into place."""
    tmp = path.parent / f".{path.name}.tmp"
    tmp.write_text(text)
    tmp.replace(path)


def plain(value):
    """pygls' client decodes results into namedtuples: back to JSON data."""
    if hasattr(value, "_asdict"):
        return {k: plain(v) for k, v in value._asdict().items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


async def request(client, method: str, params):
    return plain(await client.protocol.send_request_async(method, params))
