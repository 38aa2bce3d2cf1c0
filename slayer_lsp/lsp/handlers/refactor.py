"""Code actions, rename and code lenses: the features that change files or count dependents."""

from __future__ import annotations

import logging
from typing import Any

from lsprotocol import types as t

from slayer_lsp.analysis import impact as imp
from slayer_lsp.analysis import rename as ren
from slayer_lsp.catalog.ids import split_canonical
from slayer_lsp.lsp import convert
from slayer_lsp.lsp.edits import rename_edit, store_rename_action
from slayer_lsp.lsp.errors import request_failed
from slayer_lsp.lsp.params import plain
from slayer_lsp.lsp.state import SlayerLanguageServer

log = logging.getLogger(__name__)

CODE_ACTION_KINDS = [t.CodeActionKind.QuickFix, t.CodeActionKind.RefactorRewrite]
LENS_COMMAND = "slayer.impact"


async def code_action(ls: SlayerLanguageServer, params: t.CodeActionParams) -> list[t.CodeAction] | None:
    """The quick fixes of the diagnostics in the range, and the pending store rename (if any)."""
    snap = ls.snapshot(params.text_document.uri)
    if snap is None:
        return None
    want = params.range
    client_diags = list(params.context.diagnostics or [])
    only = params.context.only

    def work() -> list[t.CodeAction] | None:
        actions = []
        pending = ls.store_rename
        if pending is not None and (
            not only or any(t.CodeActionKind.RefactorRewrite.value.startswith(k) for k in only)
        ):
            actions.append(store_rename_action(*pending))
        for x in ls.diagnostics.diagnose(snap):
            if not x.fixes:
                continue
            rng = convert.to_range(x.span, snap.lines, snap.codec)
            if not convert.overlaps(rng, want):
                continue
            lsp_diag = next(
                (cd for cd in client_diags if cd.code == x.code and cd.range == rng),
                convert.diagnostic(x, snap),
            )
            actions.extend(convert.quick_fixes(x, lsp_diag, snap))
        return actions or None

    return await ls.run(work, default=None)


async def prepare_rename(ls: SlayerLanguageServer, params: t.PrepareRenameParams) -> Any:
    snap = ls.snapshot(params.text_document.uri)
    if snap is None:
        return None

    def work() -> Any:
        doc = ls.parse(snap)
        if doc.kind == "other":
            return None
        line, col = convert.from_client(snap, params.position)
        try:
            target = ren.target_at(doc, line, col, ls.catalog())
        except ren.RenameError as exc:
            raise request_failed(str(exc)) from exc
        return convert.rename_placeholder(target.span, target.name, snap)

    return await ls.run(work, default=None)


async def rename(ls: SlayerLanguageServer, params: t.RenameParams) -> t.WorkspaceEdit | None:
    snap = ls.snapshot(params.text_document.uri)
    if snap is None:
        return None
    snaps = ls.open_snapshots()

    def work() -> t.WorkspaceEdit | None:
        doc = ls.parse(snap)
        if doc.kind == "other":
            return None
        line, col = convert.from_client(snap, params.position)
        catalog = ls.catalog()
        try:
            target = ren.target_at(doc, line, col, catalog)
            state = ls.current_state()
            if catalog.location.backend != "yaml" and state is not None and state.full is not None:
                raise ren.RenameError(
                    "a scoped session cannot rename in a SQLite store: the rename would rewrite "
                    "rows (memories, models) the session cannot see"
                )
            read, text_of = ls.store_readers(snaps)
            plan = ren.plan_rename(
                catalog, target.entity, params.new_name, ls.workspace_docs(snaps), read=read, text_of=text_of
            )
        except ren.RenameError as exc:
            raise request_failed(str(exc)) from exc
        log.info(
            "rename %s -> %s: %d edits in %d files, %d file renames",
            plan.entity,
            plan.new_entity,
            plan.edit_count,
            len(plan.files),
            len(plan.renames),
        )
        return rename_edit(ls, plan)

    return await ls.run(work, default=None)


async def code_lens(ls: SlayerLanguageServer, params: t.CodeLensParams) -> list[t.CodeLens] | None:
    """Unresolved lenses on a model file's model and column declarations: counting is left to
    ``codeLens/resolve``, for the lenses the editor shows."""
    snap = ls.snapshot(params.text_document.uri)
    if snap is None:
        return None

    def work() -> list[t.CodeLens] | None:
        doc = ls.parse(snap)
        catalog = ls.catalog()
        if doc.kind != "model" or doc.model_id is None or doc.model_id not in catalog:
            return None
        leaves = {split_canonical(c)[2]: c for c in catalog.children(doc.model_id)}
        lenses = []
        for sym in doc.symbols:
            entries = [(sym, doc.model_id)] + [
                (c, leaves.get(c.name)) for c in sym.children if c.kind == "column"
            ]
            for s, canonical in entries:
                if canonical is not None and canonical in catalog:
                    lenses.append(
                        t.CodeLens(
                            range=convert.to_range(s.selection, snap.lines, snap.codec),
                            data={"entity": canonical},
                        )
                    )
        return lenses or None

    return await ls.run(work, default=None)


async def code_lens_resolve(ls: SlayerLanguageServer, lens: t.CodeLens) -> t.CodeLens:
    data = plain(lens.data)
    entity = data.get("entity") if isinstance(data, dict) else None
    snaps = ls.open_snapshots()

    def work() -> t.CodeLens:
        if not isinstance(entity, str):
            return lens
        try:
            found = imp.impact(ls.catalog(), entity, ls.workspace_docs(snaps), locate=False)
        except imp.ImpactError:
            lens.command = t.Command(title="not in the store", command="")
            return lens
        lens.command = t.Command(title=found.summary(), command=LENS_COMMAND, arguments=[{"entity": entity}])
        return lens

    return await ls.run(work, default=lens)
