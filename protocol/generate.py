"""Write the JSON Schemas of the daemon's custom requests into ``protocol/schemas/``, and the MCP
server's tool list (``slayer-lsp mcp``) into ``protocol/mcp-tools.json``.

Each schema is ``msgspec.json.schema`` of the msgspec type the server decodes or encodes (the types
named in its request table, ``slayer_lsp.lsp.custom_requests``), so the schemas cannot drift from
the code: ``tests/test_protocol.py`` (and ``tests/mcp/test_mcp_tools_file.py``
for the tool list) fails when a file here is out of date. Run ``python protocol/generate.py`` after
changing a wire type (``--check`` only compares).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCHEMAS = HERE / "schemas"
MCP_TOOLS = HERE / "mcp-tools.json"
FILE_SCHEMAS = HERE / "file-schemas"  # query files and memory front matter (draft-07, for editors)
DIALECT = "https://json-schema.org/draft/2020-12/schema"


def types() -> dict[str, tuple[str, type]]:
    """File stem -> (title, msgspec type), for each method's params and result: the types of the
    server's request table, the very ones it decodes params with."""
    from slayer_lsp.lsp.custom_requests import CUSTOM_REQUESTS

    out: dict[str, tuple[str, type]] = {}
    for request in CUSTOM_REQUESTS:
        stem = request.method.replace("/", "-")
        out[f"{stem}.params"] = (f"{request.method} params", request.params)
        out[f"{stem}.result"] = (f"{request.method} result", request.result)
    return out


def render() -> dict[str, str]:
    """File name -> the schema text it should hold."""
    import msgspec

    out = {}
    for stem, (title, typ) in types().items():
        schema = {"$schema": DIALECT, "title": title, **msgspec.json.schema(typ)}
        out[f"{stem}.json"] = json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    return out


def render_file_schemas() -> dict[str, str]:
    """The schemas of SLayer query files and memory front matter (``slayer-lsp schema query|memory``),
    which the VS Code extension copies at build time for its YAML and JSON services."""
    from slayer_lsp.analysis.schemas import KINDS, schema

    return {
        f"{kind}-file.schema.json": json.dumps(schema(kind), indent=2, sort_keys=True, ensure_ascii=False)
        + "\n"
        for kind in KINDS
    }


def render_mcp_tools() -> str:
    """The text ``protocol/mcp-tools.json`` should hold: the tools exactly as ``tools/list`` answers."""
    from slayer_lsp.mcp.types import tool_list

    doc = {"server": "slayer-lsp mcp", "tools": tool_list()}
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a schema file is out of date")
    args = parser.parse_args(argv)
    wanted = render()
    present = {p.name for p in SCHEMAS.glob("*.json")} if SCHEMAS.is_dir() else set()
    stale = sorted(
        n
        for n, text in wanted.items()
        if not (SCHEMAS / n).is_file() or (SCHEMAS / n).read_text(encoding="utf-8") != text
    )
    extra = sorted(present - set(wanted))
    tools_text = render_mcp_tools()
    tools_stale = not MCP_TOOLS.is_file() or MCP_TOOLS.read_text(encoding="utf-8") != tools_text
    if args.check:
        if tools_stale:
            print("out of date: protocol/mcp-tools.json", file=sys.stderr)
        for name in stale:
            print(f"out of date: protocol/schemas/{name}", file=sys.stderr)
        for name in extra:
            print(f"not generated: protocol/schemas/{name}", file=sys.stderr)
        files_stale = [
            n
            for n, text in render_file_schemas().items()
            if not (FILE_SCHEMAS / n).is_file() or (FILE_SCHEMAS / n).read_text(encoding="utf-8") != text
        ]
        for name in files_stale:
            print(f"out of date: protocol/file-schemas/{name}", file=sys.stderr)
        return 1 if stale or extra or tools_stale or files_stale else 0
    SCHEMAS.mkdir(exist_ok=True)
    for name in stale:
        (SCHEMAS / name).write_text(wanted[name], encoding="utf-8")
    for name in extra:
        (SCHEMAS / name).unlink()
    files = render_file_schemas()
    files_stale = sorted(
        n
        for n, text in files.items()
        if not (FILE_SCHEMAS / n).is_file() or (FILE_SCHEMAS / n).read_text(encoding="utf-8") != text
    )
    FILE_SCHEMAS.mkdir(exist_ok=True)
    for name in files_stale:
        (FILE_SCHEMAS / name).write_text(files[name], encoding="utf-8")
        print(f"protocol/file-schemas/{name} written")
    if tools_stale:
        MCP_TOOLS.write_text(tools_text, encoding="utf-8")
        print("protocol/mcp-tools.json written")
    print(f"{len(stale)} written, {len(extra)} removed, {len(wanted) - len(stale)} up to date")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))  # run from a clone without installing
    raise SystemExit(main())
