"""The line-by-line YAML reader against libyaml: on everything PyYAML's emitter writes, on the fixture
stores, and on those texts broken at random, it either gives exactly libyaml's value (types, key
order) or declines with ``Unhandled``; it never misreads and never raises anything else."""

from __future__ import annotations

import random
from typing import Any

import pytest
import yaml

from slayer_lsp.store import blockyaml, fastyaml
from slayer_lsp.store.yamlscalar import Unhandled
from tests.conftest import FIXTURES


class _TimestampsAsText(yaml.CSafeLoader):
    """libyaml with the store's one difference from ``safe_load``: timestamps stay as written."""


_TimestampsAsText.add_constructor(
    "tag:yaml.org,2002:timestamp", lambda loader, node: loader.construct_scalar(node)
)


def reference(text: str) -> Any:
    return yaml.load(text, Loader=_TimestampsAsText)


def read(text: str) -> Any:
    """blockyaml's value, or the Unhandled class when it declines."""
    try:
        return blockyaml.load(text)
    except Unhandled:
        return Unhandled


def same(a: Any, b: Any) -> bool:
    return repr(a) == repr(b)  # types and key order too (1, 1.0 and True are all equal)


# Scalars chosen for what YAML makes of them: implicit types, indicators, quoting, escapes,
# characters libyaml refuses or treats as line breaks, and lengths that fold over lines.
# fmt: off
SCALARS: list[Any] = [
    "id", "INT", "TEXT", "true", "yes", "No", "off", "~", "null", "", " ", "0", "007", "0x1F",
    "0o17", "1_000", "1:20", "-1", "+.5", ".inf", ".NaN", "1e3", "1.5e3", "2026-12-02",
    "2026-12-02 10:00:00", "2026-12-02T10:00:00Z", "a: b", "a:b", "a #b", "a#b", "#a", "- a",
    "-a", "? a", "?a", ":a", ": a", "a:", "'q'", '"q"', "it's", 'say "hi"', "back\\slash",
    "{}", "[]", "{a: 1}", "[1, 2]", "&anchor", "*alias", "!tag", "|", ">", "%x", "@x", "`x",
    "a, b, c", "Crème brûlée", "東京", "emoji 🙂", "tab\there", "line\nbreak", "two\n\nbreaks",
    "trailing ", " leading", "nel\x85", "ls\u2028", "bom\ufeff", "del\x7f", "bell\x07",
    "=", "<<", "a" * 90, "word " * 30, "x-" * 50, ("long description with: colon " * 4).strip(),
    ("quoted 'bits' and \"more\" " * 5).strip(), "é" * 100, ("mixed é and ascii " * 8).strip(),
    "   indented start", "end with space " * 6, "---", "...", 0, 1, -7, 1.5, 1e20,
    True, False, None,
]
KEYS: list[Any] = [
    "name", "sql", "type", "description", "a.b", "x-y", "k/1", "0", "yes", "on", "null",
    "key with space", "é", "'", "a: b", 1, True, None, 2.5,
]
# fmt: on


def random_value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth < 4 and roll < 0.2:
        return {rng.choice(KEYS): random_value(rng, depth + 1) for _ in range(rng.randint(0, 5))}
    if depth < 4 and roll < 0.35:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return rng.choice(SCALARS)


def random_document(rng: random.Random) -> str:
    data = {rng.choice(KEYS): random_value(rng) for _ in range(rng.randint(1, 6))}
    if rng.random() < 0.5:  # how SLayer writes models and datasources
        return yaml.dump(data, sort_keys=False, width=rng.choice([80, 80, 30, 200]))
    return yaml.safe_dump(
        data, sort_keys=False, default_flow_style=False, allow_unicode=True, width=rng.choice([80, 30])
    )


def test_generated_documents_read_as_libyaml_reads_them():
    rng = random.Random(20261203)
    handled = 0
    for _ in range(3000):
        text = random_document(rng)
        got = read(text)
        if got is not Unhandled:
            handled += 1
            assert same(got, reference(text)), text
    assert handled > 1500  # most of what the emitter writes is read here, not handed on


def _mutate(rng: random.Random, text: str) -> str:
    pieces = [
        " ",
        "  ",
        ":",
        ": ",
        "#",
        " #",
        "-",
        "- ",
        "'",
        '"',
        "\\",
        "\n",
        "\n\n",
        "\t",
        "{",
        "]",
        "&a ",
        "*a",
        "!",
        "|",
        ">",
        "x",
        "\ufeff",
        "\r",
        "...",
    ]
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(text) + 1)
        cut = rng.choice([0, 0, 1, 2])
        text = text[:at] + rng.choice(pieces) + text[at + cut :]
    return text


def test_broken_documents_are_declined_or_read_exactly():
    rng = random.Random(7)
    declined = 0
    for _ in range(4000):
        text = _mutate(rng, random_document(rng))
        got = read(text)
        if got is Unhandled:
            declined += 1
            continue
        try:
            want = reference(text)
        except yaml.YAMLError:
            pytest.fail(f"read a text libyaml refuses: {text!r} -> {got!r}")
        assert same(got, want), text
    assert declined > 500  # the mutations do reach what is outside the subset


def _store_texts() -> list[tuple[str, str]]:
    out = []
    for path in sorted(FIXTURES.rglob("*")):
        if path.suffix in (".yaml", ".yml"):
            out.append((str(path), path.read_text(encoding="utf-8")))
        elif path.suffix == ".md" and path.parent.name == "memories":
            text = path.read_text(encoding="utf-8")
            end = text.find("\n---\n", 3)
            if text.startswith("---\n") and end > 0:
                out.append((str(path), text[4:end]))
    return out


def test_every_fixture_document_is_read_here_and_exactly():
    texts = _store_texts()
    assert len(texts) > 20
    for path, text in texts:
        got = read(text)
        assert got is not Unhandled, path  # SLayer's own output is inside the subset
        assert same(got, reference(text)), path


@pytest.mark.parametrize(
    "text",
    [
        "a: 1 # note\n",  # comments
        "a:\n\tb: 1\n",  # tabs
        "a: &x 1\nb: *x\n",  # anchors and aliases
        "a: !!str 5\n",  # tags
        "a: {b: 1}\n",  # flow collections
        "a: |\n  text\n",  # block scalars
        "? a\n: b\n",  # complex keys
        "'a' : 1\n",  # a space before the colon
        "a:  1\n",  # two spaces after it
        "a: 1\n\nb: 2\n",  # blank lines between entries
        "- a\n- b\n",  # a sequence at the top
        "a\n",  # a scalar at the top
        "a: b: c\n",  # an error libyaml reports
        "a: 1\n   b: 2\n",  # odd indentation
        "a:\n  b: 1\n c: 2\n",
        "a: 'unterminated\n",
        'a: "\\q"\n',  # an unknown escape
        'a: "\\ud800"\n',  # a surrogate libyaml refuses
        "<<: {a: 1}\n",
        "a: " + "[" * 100 + "\n",
    ],
)
def test_outside_the_subset_is_declined(text):
    assert read(text) is Unhandled


def test_deep_nesting_is_declined_for_the_full_reader_to_refuse():
    text = "".join(" " * i + f"k{i}:\n" for i in range(200)) + " " * 200 + "k: 1\n"
    assert read(text) is Unhandled
    from slayer_lsp.store.limits import LimitError

    with pytest.raises(LimitError):
        fastyaml.load(text)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("a: 'x\n  y'\n", {"a": "x y"}),
        ("a: 'x\n\n  y'\n", {"a": "x\ny"}),
        ('a: "x\\\n  y"\n', {"a": "xy"}),
        ('a: "x\\\n  \\ y"\n', {"a": "x y"}),
        ("a: long plain\n  folded text\n", {"a": "long plain folded text"}),
        ("a:\n- - 1\n  - 2\n- b: c\n  d:\n  - e\n", {"a": [[1, 2], {"b": "c", "d": ["e"]}]}),
        ("yes: no\n2: 0x10\n", {True: False, 2: 16}),
        ("t: 2026-12-02T10:00:00Z\n", {"t": "2026-12-02T10:00:00Z"}),
        ("a: it's\nb: 'it''s'\n", {"a": "it's", "b": "it's"}),
        ('a: "\\xE9\\u2013\\U0001F642"\n', {"a": "é–🙂"}),
        (
            "'yes': 1\n\"\\xE9\": 2\nkey with space: 3\na:b: 4\n",
            {"yes": 1, "é": 2, "key with space": 3, "a:b": 4},
        ),
    ],
)
def test_what_the_emitter_writes_reads_back(text, value):
    assert same(read(text), value)
    assert same(read(text), reference(text))
