"""Our tantivy indexes change their searcher only on ``reload`` (the automatic reload contended
with ours for the meta lock: a 100 ms retry after most commits)."""

from __future__ import annotations

import time

import tantivy

from slayer_lsp.search.tantivy_open import open_index


def test_a_commit_is_seen_only_after_our_reload():
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("text", stored=False)
    index = open_index(builder.build())
    writer = index.writer(heap_size=15_000_000, num_threads=1)
    doc = tantivy.Document()
    doc.add_text("text", "hello")
    writer.add_document(doc)
    writer.commit()
    time.sleep(0.6)  # what an automatic reload would have needed (tantivy reloads ~0.5 s after a commit)
    assert index.searcher().num_docs == 0
    index.reload()
    assert index.searcher().num_docs == 1
