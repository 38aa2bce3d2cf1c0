"""The dense channel's embedding layer: providers, SLayer's vector table, the in-memory index, the
background worker and the text embedded for each entity. Search wires it in; nothing here imports
the search pipeline, and nothing heavy (onnxruntime, tokenizers, litellm) is imported until used."""

from slayer_lsp.embed.facets import FACETS, facet_texts
from slayer_lsp.embed.index import DenseHits, VectorIndex
from slayer_lsp.embed.parts import PartItems, feed_parts, part_id, parts_for
from slayer_lsp.embed.providers import (
    LOCAL_MODEL_NAME,
    EmbeddingError,
    EmbeddingProvider,
    FakeProvider,
    LiteLLMProvider,
    MiniLMProvider,
    ModelIntegrityError,
    ProviderUnavailableError,
    TransientEmbeddingError,
    configured_model_name,
    provider_for,
)
from slayer_lsp.embed.store import VectorStore, VectorStoreError, content_hash
from slayer_lsp.embed.text import CatalogItems, EmbedItem, entity_text, facets, memory_text
from slayer_lsp.embed.worker import EmbeddingStatus, EmbeddingWorker, PartsStatus, default_worker

__all__ = [
    "FACETS", "LOCAL_MODEL_NAME", "CatalogItems", "DenseHits", "EmbedItem", "EmbeddingError", "EmbeddingProvider",
    "EmbeddingStatus", "EmbeddingWorker", "FakeProvider", "LiteLLMProvider", "MiniLMProvider",
    "ModelIntegrityError", "PartItems", "PartsStatus", "ProviderUnavailableError", "TransientEmbeddingError", "VectorIndex",
    "VectorStore", "VectorStoreError", "configured_model_name", "content_hash", "default_worker",
    "entity_text", "facet_texts", "facets", "feed_parts", "memory_text", "part_id", "parts_for", "provider_for",
]
