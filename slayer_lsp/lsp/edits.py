"""A rename plan (``analysis.rename.RenamePlan``, plain data) as the client's WorkspaceEdit, and the
code action that writes a SQLite store's part of it.

Edits of store files carry a change annotation that asks the user to confirm, when the client
supports them: the store is SLayer's, and its files change with the edit. A SQLite store's rows are
never in the edit: that part is kept as the session's pending store rename and written only by the
``slayer.applyStoreRename`` command of a ``refactor.rewrite`` code action.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from lsprotocol import types as t

from slayer_lsp.analysis import rename as ren
from slayer_lsp.lsp.convert import range_in, uri_of
from slayer_lsp.lsp.errors import request_failed

if TYPE_CHECKING:
    from slayer_lsp.lsp.state import SlayerLanguageServer

STORE_ANNOTATION = "slayer-store"
STORE_RENAME_COMMAND = "slayer.applyStoreRename"

TextEdit = t.TextEdit | t.AnnotatedTextEdit


def store_summary(store: ren.StoreRename) -> str:
    return (
        f"{store.models} model row{'s' * (store.models != 1)} and {store.memories} "
        f"memor{'ies' if store.memories != 1 else 'y'}"
    )


def store_rename_action(plan_id: str, plan: ren.RenamePlan) -> t.CodeAction:
    """The code action that writes a SQLite store's part of a rename (refactor.rewrite)."""
    assert plan.store is not None
    title = (
        f"Write the rename of {plan.entity} to {plan.new_entity} to the SLayer store "
        f"({store_summary(plan.store)})"
    )
    return t.CodeAction(
        title=title,
        kind=t.CodeActionKind.RefactorRewrite,
        is_preferred=True,
        command=t.Command(title=title, command=STORE_RENAME_COMMAND, arguments=[plan_id]),
    )


def _text_edits(ls: SlayerLanguageServer, f: ren.FileEdits, note: str | None) -> list[TextEdit]:
    return [
        t.AnnotatedTextEdit(range=range_in(ls, f.key, e.span), new_text=e.new_text, annotation_id=note)
        if note
        else t.TextEdit(range=range_in(ls, f.key, e.span), new_text=e.new_text)
        for e in f.edits
    ]


def _document_edit(ls: SlayerLanguageServer, f: ren.FileEdits, note: str | None) -> t.TextDocumentEdit:
    uri = uri_of(f.key)
    return t.TextDocumentEdit(
        text_document=t.OptionalVersionedTextDocumentIdentifier(uri=uri, version=ls.document_version(uri)),
        edits=list(_text_edits(ls, f, note)),
    )


def _changes(ls: SlayerLanguageServer, plan: ren.RenamePlan) -> t.WorkspaceEdit:
    """The edit for a client without ``documentChanges``: text edits per URI."""
    return t.WorkspaceEdit(
        changes={
            uri_of(f.key): [
                t.TextEdit(range=range_in(ls, f.key, e.span), new_text=e.new_text) for e in f.edits
            ]
            for f in plan.files
        }
    )


def rename_edit(ls: SlayerLanguageServer, plan: ren.RenamePlan) -> t.WorkspaceEdit:
    """The plan as one WorkspaceEdit: text edits per file, then the store's file renames."""
    caps = ls.edit_capabilities()
    if plan.store is not None:
        return _sqlite_rename_edit(ls, plan)
    store = str(ls.live_engine().location.path)
    if plan.renames and not (caps.document_changes and caps.file_renames):
        raise request_failed(
            f"renaming '{plan.entity}' renames its file in the store, and this editor does not "
            f"accept file renames in an edit (workspace.workspaceEdit.resourceOperations)"
        )
    if not caps.document_changes:
        return _changes(ls, plan)
    out: list[t.TextDocumentEdit | t.CreateFile | t.RenameFile | t.DeleteFile] = []
    for f in plan.files:
        in_store = "://" not in f.key and ren.is_inside(f.key, store)
        out.append(_document_edit(ls, f, STORE_ANNOTATION if caps.change_annotations and in_store else None))
    for r in plan.renames:
        out.append(
            t.RenameFile(
                old_uri=uri_of(r.old),
                new_uri=uri_of(r.new),
                options=t.RenameFileOptions(overwrite=False, ignore_if_exists=False),
                annotation_id=STORE_ANNOTATION if caps.change_annotations else None,
            )
        )
    anns = (
        {
            STORE_ANNOTATION: t.ChangeAnnotation(
                label=f"Rename {plan.entity} to {plan.new_entity} in the SLayer store",
                needs_confirmation=True,
                description="These files belong to the SLayer store; SLayer reads them as changed.",
            )
        }
        if caps.change_annotations
        else None
    )
    return t.WorkspaceEdit(document_changes=out, change_annotations=anns)


def _sqlite_rename_edit(ls: SlayerLanguageServer, plan: ren.RenamePlan) -> t.WorkspaceEdit:
    """A rename in a SQLite store: the workspace files' edits, each under a change annotation that
    needs confirmation and says what the store part will write; that part is kept as the pending
    store rename, offered by the code action ``store_rename_action`` (the only way it is written)."""
    caps = ls.edit_capabilities()
    plan_id = uuid.uuid4().hex[:12]
    ls.store_rename = (plan_id, plan) if plan.store and plan.store.rows else None
    if not caps.document_changes:
        return _changes(ls, plan)
    note = STORE_ANNOTATION if caps.change_annotations else None
    out: list[t.TextDocumentEdit | t.CreateFile | t.RenameFile | t.DeleteFile] = [
        _document_edit(ls, f, note) for f in plan.files
    ]
    if not caps.change_annotations:
        return t.WorkspaceEdit(document_changes=out)
    if ls.store_rename is None or plan.store is None:
        description = "The SLayer store (a SQLite file) holds nothing else that names it."
    else:
        description = (
            f"The SLayer store is a SQLite file: its {store_summary(plan.store)} that name "
            f'{plan.entity} are written only by the code action "{store_rename_action(plan_id, plan).title}" '
            f"(command {STORE_RENAME_COMMAND} {plan_id}), all in one transaction."
        )
    anns = {
        STORE_ANNOTATION: t.ChangeAnnotation(
            label=f"Rename {plan.entity} to {plan.new_entity}",
            needs_confirmation=True,
            description=description,
        )
    }
    return t.WorkspaceEdit(document_changes=out, change_annotations=anns)
