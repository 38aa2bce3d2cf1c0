"""The dense channel's embedding layer: providers, SLayer's vector table, the in-memory index and
the background worker. The texts it embeds are ``texts/``'s; search wires it in. Nothing here imports
the search pipeline, and nothing heavy (onnxruntime, tokenizers, litellm) is imported until used."""
