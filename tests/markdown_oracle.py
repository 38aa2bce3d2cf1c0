"""Render Markdown with markdown-it (the CommonMark engine VS Code uses), through Node, to see what
an editor would make of a hover. Used by the hostile-input tests: escaping is checked against a real
renderer, not against our own idea of Markdown.

Node and markdown-it come from ``npm ci`` in editors/vscode (``.ci/run`` does it and exports
``NODE_PATH``). Where they are missing the caller skips, except in CI (``CI`` set): there it fails."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).resolve().parent / "render_markdown.cjs"
_TAG = re.compile(r"<(/?)([a-zA-Z][a-zA-Z0-9]*)([^>]*)>")


def _node_path() -> str | None:
    candidates = [p for p in os.environ.get("NODE_PATH", "").split(os.pathsep) if p]
    candidates.append(str(REPO / "editors" / "vscode" / "node_modules"))
    found = [p for p in candidates if (Path(p) / "markdown-it" / "package.json").is_file()]
    return os.pathsep.join(found) or None


def require_renderer() -> tuple[str, str]:
    node, node_path = shutil.which("node"), _node_path()
    if node is None or node_path is None:
        missing = "node" if node is None else "markdown-it (npm ci in editors/vscode, then NODE_PATH)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must provide {missing} for the Markdown rendering checks")
        pytest.skip(f"{missing} is not installed")
    return node, node_path


def render(texts: list[str], linkify: bool = True) -> list[str]:
    """The HTML markdown-it makes of each text (raw HTML enabled: the worst case)."""
    node, node_path = require_renderer()
    proc = subprocess.run(
        [node, str(SCRIPT)],
        input=json.dumps({"linkify": linkify, "texts": texts}),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NODE_PATH": node_path},
        encoding="utf-8",
        errors="surrogateescape",
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def tags(rendered: str) -> list[tuple[str, str]]:
    """(tag name, attributes) of every element the HTML opens."""
    return [(m.group(2).lower(), m.group(3)) for m in _TAG.finditer(rendered) if not m.group(1)]


def text_of(rendered: str) -> str:
    """The text a reader sees, whitespace collapsed."""
    return " ".join(html.unescape(_TAG.sub(" ", rendered)).split())
