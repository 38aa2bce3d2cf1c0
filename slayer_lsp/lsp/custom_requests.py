"""The one table of the ``slayer/*`` requests: each names its method, its params type (what
``lsp.params.decode`` decodes into, and what ``protocol/generate.py`` writes the params schema from),
its result type (the result schema), its handler, and its ``workspace/executeCommand`` twin (the
method with a dot instead of the slash). ``lsp.server`` registers both from here.

A command's ``arguments`` is a one-element list holding the request's params; ``shorthand`` reads
other argument lists a generic client may send (``slayer.inspect "orders" "memory:1"``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from slayer_lsp import protocol_types as p
from slayer_lsp.lsp.errors import answering
from slayer_lsp.lsp.handlers import custom as h
from slayer_lsp.lsp.params import command_params, decode
from slayer_lsp.lsp.state import SlayerLanguageServer
from slayer_lsp.search.facet_ranking import SearchFacetsParams, SearchFacetsResponse
from slayer_lsp.search.types import SearchParams, SearchResponse

Handler = Callable[[SlayerLanguageServer, Any], Awaitable[Any]]
Shorthand = Callable[[tuple[Any, ...]], dict[str, Any] | None]


@dataclass(frozen=True)
class CustomRequest:
    method: str
    params: type[msgspec.Struct]
    result: type[msgspec.Struct]
    handler: Handler
    shorthand: Shorthand | None = None  # command arguments other than [params] -> params (None: not one)

    @property
    def command(self) -> str:
        return self.method.replace("/", ".")

    async def answer(self, ls: SlayerLanguageServer, raw: Any) -> Any:
        """The request: params decoded into ``params``, then the handler."""
        params = decode(self.method, raw, self.params)
        return await answering(self.method, self.handler(ls, params))

    async def answer_command(self, ls: SlayerLanguageServer, args: tuple[Any, ...]) -> Any:
        """The command twin: its arguments as the request's params."""
        raw = self.shorthand(args) if self.shorthand is not None else None
        return await self.answer(ls, raw if raw is not None else command_params(self.command, args))


def refs_alone(args: tuple[Any, ...]) -> dict[str, Any] | None:
    """``slayer.inspect "ref" "ref2"``: each string is one reference."""
    return {"refs": list(args)} if args and all(isinstance(a, str) for a in args) else None


def entity_alone(args: tuple[Any, ...]) -> dict[str, Any] | None:
    return {"entity": args[0]} if len(args) == 1 and isinstance(args[0], str) else None


def id_alone(args: tuple[Any, ...]) -> dict[str, Any] | None:
    if len(args) == 1 and isinstance(args[0], (str, int)) and not isinstance(args[0], bool):
        return {"id": args[0]}
    return None


CUSTOM_REQUESTS: tuple[CustomRequest, ...] = (
    CustomRequest("slayer/search", SearchParams, SearchResponse, h.search),
    CustomRequest("slayer/searchFacets", SearchFacetsParams, SearchFacetsResponse, h.search_facets),
    CustomRequest("slayer/inspect", p.InspectRequestParams, p.InspectResult, h.inspect, refs_alone),
    CustomRequest("slayer/impact", p.ImpactParams, p.ImpactResult, h.impact, entity_alone),
    CustomRequest("slayer/status", p.StatusParams, p.ServerStatus, h.status),
    CustomRequest("slayer/saveMemory", p.SaveMemoryParams, p.SaveMemoryResult, h.save_memory),
    CustomRequest(
        "slayer/forgetMemory", p.ForgetMemoryParams, p.ForgetMemoryResult, h.forget_memory, id_alone
    ),
)
CUSTOM_METHODS = tuple(r.method for r in CUSTOM_REQUESTS)
