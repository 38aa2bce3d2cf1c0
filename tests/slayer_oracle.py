"""Run motley-slayer (in its own venv) as an oracle for the memory-writer tests.

Everything SLayer is asked goes in one JSON request on stdin and comes back as one JSON answer, so
a test pays SLayer's import cost once. ``slayer_python()`` is ``None`` when no SLayer venv exists;
tests then skip with that reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# The venv the benchmarks create (bench/_slayer_env.py) and CI prepares; a developer may point elsewhere.
DEFAULT_VENVS = (REPO / "bench" / ".work" / "slayer-venv", Path("/work/.slayer-venv"))

# A quiet, offline SLayer: no usage reporting, no cost-map download, no embedding provider keys.
QUIET_ENV = {"SLAYER_USAGE_REPORTING": "off", "DO_NOT_TRACK": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
_PROVIDER_KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "AZURE_API_KEY", "COHERE_API_KEY", "GEMINI_API_KEY")


def slayer_python() -> str | None:
    """The venv interpreter that has motley-slayer: ``$SLAYER_BENCH_VENV``, else the benchmarks' venv.
    In CI (``CI`` set) a missing oracle is an error, never a silent skip."""
    for venv in (os.environ.get("SLAYER_BENCH_VENV"), *map(str, DEFAULT_VENVS)):
        if venv:
            python = Path(venv) / "bin" / "python"
            if python.is_file() and os.access(python, os.X_OK):
                return str(python)
    return None


SKIP_REASON = (
    "motley-slayer venv not found (set SLAYER_BENCH_VENV, or run a benchmark once to create "
    "bench/.work/slayer-venv); the SLayer compatibility checks need it as an oracle"
)
if os.environ.get("CI") and slayer_python() is None:
    raise RuntimeError("CI must provide the motley-slayer oracle venv: " + SKIP_REASON)


def slayer_env(home: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _PROVIDER_KEYS and k != "PYTHONPATH"}
    env.update(QUIET_ENV)
    if home is not None:
        env["HOME"] = str(home)
        env["XDG_CONFIG_HOME"] = str(home / ".config")
    return env


# The oracle program, run by the SLayer venv's interpreter. Each op answers {"ok": ...} or
# {"error": "<Type>: <message>"}.
ORACLE = r"""
import asyncio, json, sys
from slayer.core.query import SlayerQuery
from slayer.memories.models import Memory
from slayer.memories.service import MemoryService
from slayer.storage.base import resolve_storage


async def run(op):
    kind = op["op"]
    if kind == "normalize":
        return SlayerQuery.model_validate(op["query"]).model_dump(mode="json")
    if kind == "format_created_at":
        return [Memory(learning="x", created_at=v).model_dump(mode="json")["created_at"] for v in op["values"]]
    storage = resolve_storage(op["store"])
    if kind == "load":
        memories, errors = await storage.load_memories()
        return {"memories": {m.id: m.model_dump(mode="json") for m in memories},
                "order": [m.id for m in memories], "errors": [str(e) for e in errors]}
    if kind == "models":
        models, errors = await storage.load_models()
        return {"models": {f"{m.data_source}.{m.name}": m.model_dump(mode="json", exclude_none=True) for m in models},
                "errors": [str(e) for e in errors]}
    if kind == "get":
        return {i: (await storage.get_memory(i)).model_dump(mode="json") for i in op["ids"]}
    if kind == "write_row":
        fields = dict(op["memory"])
        if fields.get("query") is not None:
            fields["query"] = SlayerQuery.model_validate(fields["query"])
        memory = Memory(**fields)
        await storage._save_memory_row(memory)
        return memory.model_dump(mode="json")
    if kind == "service_save":
        linked = op["query"] if op.get("query") is not None else op["entities"]
        response = await MemoryService(storage=storage).save_memory(
            learning=op["learning"], linked_entities=linked, id=op.get("id"), description=op.get("description"))
        return response.model_dump(mode="json")
    if kind == "service_forget":
        return (await MemoryService(storage=storage).forget_memory(identifier=op["id"])).model_dump(mode="json")
    raise ValueError(f"unknown op {kind}")


async def main():
    answers = []
    for op in json.load(sys.stdin):
        try:
            answers.append({"ok": await run(op)})
        except Exception as exc:
            answers.append({"error": f"{type(exc).__name__}: {exc}"})
    json.dump(answers, sys.stdout)


asyncio.run(main())
"""


def ask(ops: list[dict[str, Any]], *, timeout: float = 300.0) -> list[dict[str, Any]]:
    """Run ``ops`` through SLayer; one answer per op."""
    python = slayer_python()
    if python is None:
        raise RuntimeError(SKIP_REASON)
    proc = subprocess.run(
        [python, "-c", ORACLE],
        input=json.dumps(ops),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=slayer_env(),
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise RuntimeError(f"SLayer oracle failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def ok(answer: dict[str, Any]) -> Any:
    """The value of a successful answer (an oracle error fails the test with SLayer's message)."""
    assert "error" not in answer, f"SLayer refused: {answer['error']}"
    return answer["ok"]
