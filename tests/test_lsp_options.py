"""Options from initializationOptions / didChangeConfiguration: valid values apply, invalid ones are
reported and keep the previous value, nothing raises."""

from __future__ import annotations

import pytest

from slayer_lsp.lsp.options import DEFAULT_QUERY_PATTERNS, Options, parse_options


def test_defaults():
    opts, problems = parse_options(None)
    assert opts == Options() and problems == []
    assert opts.files.query_patterns == DEFAULT_QUERY_PATTERNS
    assert opts.diagnostics.enable and opts.storage is None


@pytest.mark.parametrize(
    "raw",
    [
        {
            "storage": "/s",
            "diagnostics": {"enable": False, "debounceMs": 50},
            "hover": {"maxChars": 900},
            "files": {"queryPatterns": ["**/*.q.yaml"], "memoryPatterns": ["notes/*.md"]},
            "embedding": {"model": "bge-small"},
            "scope": {"datasources": ["jaffle"], "accessTags": ["pii"]},
        },
        {
            "storage": "/s",
            "diagnostics": {"enable": False, "debounce_ms": 50},
            "hover": {"max_chars": 900},
            "files": {"query_patterns": ["**/*.q.yaml"], "memory_patterns": "notes/*.md"},
            "embedding": {"model": "bge-small"},
            "scope": {"datasources": "jaffle", "access_tags": ["pii"]},
        },
        {
            "slayerLsp": {
                "storage": "/s",
                "diagnostics": {"enable": False, "debounceMs": 50},
                "hover": {"maxChars": 900},
                "files": {"queryPatterns": ["**/*.q.yaml"], "memoryPatterns": ["notes/*.md"]},
                "embedding": {"model": "bge-small"},
                "scope": {"datasources": ["jaffle"], "accessTags": ["pii"]},
                "trace": {"server": "off"},
                "server": {"command": []},
            }
        },
    ],
    ids=["camel", "snake-and-scalars", "pushed-section"],
)
def test_valid(raw):
    opts, problems = parse_options(raw)
    assert problems == []
    assert opts.storage == "/s" and opts.diagnostics.enable is False and opts.diagnostics.debounce_ms == 50
    assert opts.hover.max_chars == 900 and opts.embedding.model == "bge-small"
    assert opts.files.query_patterns == ("**/*.q.yaml",) and opts.files.memory_patterns == ("notes/*.md",)
    assert opts.scope.datasources == ("jaffle",) and opts.scope.access_tags == ("pii",)


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (
            {"diagnostics": {"enable": "yes"}},
            "'diagnostics.enable': expected true or false, got a string; using True",
        ),
        (
            {"diagnostics": {"debounceMs": -1}},
            "'diagnostics.debounceMs': expected a value between 0 and 10000",
        ),
        ({"diagnostics": {"debounceMs": 1.5}}, "'diagnostics.debounceMs': expected an integer, got a number"),
        ({"hover": {"maxChars": 10}}, "'hover.maxChars': expected a value between 200"),
        ({"files": {"queryPatterns": [1]}}, "'files.queryPatterns': expected a list of non-empty strings"),
        ({"storage": 3}, "'storage': expected a string, got a number; using None"),
        ({"diagnostics": []}, "'diagnostics' must be an object, got a list; ignored"),
        ({"colour": "red"}, "unknown option 'colour'; ignored"),
        ("nope", "options must be an object, got a string; ignored"),
    ],
)
def test_invalid_values_fall_back(raw, problem):
    opts, problems = parse_options(raw)
    assert opts == Options()
    assert len(problems) == 1 and problems[0].startswith(problem)


def test_invalid_keeps_the_previous_value_and_empty_string_means_default():
    base, _ = parse_options({"storage": "/s", "hover": {"maxChars": 900}})
    opts, problems = parse_options({"hover": {"maxChars": "big"}}, base)
    assert opts.hover.max_chars == 900 and opts.storage == "/s" and len(problems) == 1
    opts, _ = parse_options({"storage": "", "embedding": {"model": ""}}, base)
    assert opts.storage is None and opts.embedding.model is None


def test_to_dict_round_trips():
    opts, _ = parse_options({"storage": "/s", "scope": {"accessTags": ["x"]}})
    again, problems = parse_options(opts.to_dict())
    assert again == opts and problems == []
