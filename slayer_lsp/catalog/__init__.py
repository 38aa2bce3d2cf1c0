"""The immutable catalog snapshot and canonical ids."""

from slayer_lsp.catalog.snapshot import Catalog, Delta, Entity, load_catalog

__all__ = ["Catalog", "Delta", "Entity", "load_catalog"]
