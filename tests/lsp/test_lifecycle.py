"""initialize / initialized / configuration / shutdown: capabilities, option problems, progress of the
initial indexing, didChangeConfiguration, a store that is missing."""

from __future__ import annotations

import pytest
import pytest_asyncio
from lsprotocol import types as t

from .support import CLIENTS, codes, copy_store, diagnostics, eventually, open_doc, start_client, stop_client

pytestmark = pytest.mark.asyncio(loop_scope="module")

BAD_OPTIONS = {"diagnostics": {"debounceMs": "soon"}, "hover": {"maxChars": 5}, "colour": "red"}


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=CLIENTS)
async def client(request, tmp_path_factory):
    store = copy_store(tmp_path_factory)
    c = await start_client(store, request.param, options=BAD_OPTIONS)
    c.client_name = request.param  # type: ignore[attr-defined]
    yield c
    await stop_client(c)


async def status(client):
    return await client.protocol.send_request_async("slayer/status", {})


async def test_capabilities(client):
    caps = client.init_result.capabilities
    assert client.init_result.server_info.name == "slayer-lsp"
    assert set(caps.completion_provider.trigger_characters) >= {".", ":", "(", '"'}
    assert caps.hover_provider and caps.definition_provider and caps.references_provider
    assert caps.document_symbol_provider and caps.workspace_symbol_provider
    # quick fixes of diagnostics; refactor.rewrite writes a planned rename to a SQLite store
    assert list(caps.code_action_provider.code_action_kinds) == [
        t.CodeActionKind.QuickFix,
        t.CodeActionKind.RefactorRewrite,
    ]
    assert caps.rename_provider and caps.signature_help_provider and caps.inlay_hint_provider
    assert caps.code_lens_provider and caps.code_lens_provider.resolve_provider
    assert set(caps.execute_command_provider.commands) >= {
        "slayer.search",
        "slayer.inspect",
        "slayer.status",
        "slayer.impact",
        "slayer.applyStoreRename",
    }


async def test_invalid_options_are_shown_and_defaulted(client):
    shown = [m.message for m in client.messages if m.type == t.MessageType.Warning]
    assert any("'diagnostics.debounceMs': expected an integer" in m for m in shown)
    assert any("'hover.maxChars'" in m for m in shown) and any("unknown option 'colour'" in m for m in shown)
    s = await status(client)
    assert s.options.diagnostics.debounceMs == 300 and s.options.hover.maxChars == 4000
    assert len(s.option_problems) == 3


async def test_initial_indexing_reports_progress_when_supported(client):
    await eventually(lambda: status(client), lambda s: s.ready, "the initial index")

    def index_reports() -> list:
        return [
            r for token, rs in client.progress_reports.items() if token.startswith("slayer-index") for r in rs
        ]

    # the end notification is sent from the loop once the index is served: it may follow the status
    reports = await eventually(index_reports, lambda rs: len(rs) >= 2, "the end of the progress")
    supported = client.capabilities.window and client.capabilities.window.work_done_progress
    assert supported  # all three capability sets declare window.workDoneProgress
    assert [r.kind for r in reports] == ["begin", "end"]
    assert reports[-1].message == "81 entities"


async def test_did_change_configuration(client):
    uri = "file:///ws/a.query.yaml"
    open_doc(client, uri, "source_model: orders\ndimensions: [nope]\n")
    await diagnostics(client, uri, lambda d: codes(d) == [("unknown-entity", 1)])
    client.workspace_did_change_configuration(
        t.DidChangeConfigurationParams(settings={"slayerLsp": {"diagnostics": {"enable": False}}})
    )
    await diagnostics(client, uri, lambda d: len(d) == 0, "diagnostics switched off")
    client.workspace_did_change_configuration(
        t.DidChangeConfigurationParams(
            settings={
                "slayerLsp": {
                    "diagnostics": {"enable": True, "debounceMs": 10},
                    "files": {"queryPatterns": ["**/*.q.yaml"]},
                }
            }
        )
    )
    other = "file:///ws/b.q.yaml"
    open_doc(client, other, "source_model: orders\ndimensions: [nope]\n")
    await diagnostics(client, other, lambda d: codes(d) == [("unknown-entity", 1)], "the new pattern applies")
    await diagnostics(client, uri, lambda d: len(d) == 0, "the old pattern no longer applies")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def missing_store_client(tmp_path_factory):
    missing = tmp_path_factory.mktemp("empty") / "not-there"
    c = await start_client(missing, "bare")
    c.missing = missing  # type: ignore[attr-defined]
    yield c
    await stop_client(c)


async def test_a_missing_store_is_reported_not_fatal(missing_store_client):
    c = missing_store_client
    s = await eventually(lambda: status(c), lambda s: s.ready, "the (empty) index")
    assert "does not exist" in s.error and s.readable is False
    assert c.progress_reports == {}  # no window.workDoneProgress, no $/progress
    assert any("cannot be read" in m.message for m in c.messages)
    uri = "file:///ws/a.query.yaml"
    open_doc(c, uri, "source_model: orders\n")
    found = await diagnostics(c, uri)
    assert codes(found) == [("unknown-entity", 0)]  # answered, from an empty catalog
    # the store appears: the watcher (on its parent) notices and the next answers see it
    import shutil

    from .support import YAML_STORE

    shutil.copytree(YAML_STORE, c.missing)
    await eventually(lambda: status(c), lambda s: s.readable and s.counts.model == 8, "the store to appear")
    await diagnostics(c, uri, lambda d: len(d) == 0, "diagnostics once the store exists")


async def test_pull_configuration_when_settings_are_not_pushed(client):
    caps = client.capabilities.workspace
    if not (caps and caps.configuration):
        pytest.skip("this client cannot answer workspace/configuration")
    client.set_configuration({"hover": {"maxChars": 777}}, section="slayerLsp")
    client.workspace_did_change_configuration(t.DidChangeConfigurationParams(settings=None))
    s = await eventually(
        lambda: status(client), lambda s: s.options.hover.maxChars == 777, "the pulled option"
    )
    assert s.option_problems == []
