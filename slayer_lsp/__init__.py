"""slayer-lsp: a warm, incremental index and language server over a SLayer store."""

__version__ = "0.1.0"
