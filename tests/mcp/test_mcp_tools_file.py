"""protocol/mcp-tools.json is what ``protocol/generate.py`` makes of the current MCP tool types, and
those types decode what their own schemas describe (one source of truth for both)."""

from __future__ import annotations

import importlib.util
import json
import sys

import msgspec
import pytest

from slayer_lsp.mcp import types as mt

from ..lsp.support import REPO

PROTOCOL = REPO / "protocol"


def _generate():
    spec = importlib.util.spec_from_file_location("protocol_generate_mcp", PROTOCOL / "generate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_tool_list_file_is_up_to_date():
    wanted = _generate().render_mcp_tools()
    assert (PROTOCOL / "mcp-tools.json").read_text(encoding="utf-8") == wanted, (
        "out of date: run python protocol/generate.py"
    )
    tools = json.loads(wanted)["tools"]
    assert [t["name"] for t in tools] == [s.name for s in mt.TOOLS]
    for tool in tools:
        assert tool["inputSchema"]["type"] == tool["outputSchema"]["type"] == "object"  # MCP wants objects
        assert tool["inputSchema"]["additionalProperties"] is False
        assert "$ref" not in tool["inputSchema"] and "$ref" not in tool["outputSchema"]


@pytest.mark.parametrize("spec", mt.TOOLS, ids=lambda s: s.name)
def test_each_description_example_decodes(spec):
    """The example in each description is valid arguments for the tool (what a model copies works)."""
    example = spec.description.rsplit("Example: ", 1)[1].removesuffix(".")
    msgspec.convert(json.loads(example), spec.params)


@pytest.mark.parametrize("spec", mt.TOOLS, ids=lambda s: s.name)
def test_params_refuse_unknown_fields_as_the_schema_says(spec):
    with pytest.raises(msgspec.ValidationError, match="unknown field"):
        msgspec.convert({"no_such_argument": 1}, spec.params)
