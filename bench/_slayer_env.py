"""Shared plumbing for the benchmark scripts: the motley-slayer oracle, generated stores, tables.

motley-slayer (SLayer) is the program we compare against, but its pins (``tantivy<0.27``, litellm,
...) must never touch the project's own environment, so it lives in a virtual environment of its own
and is only ever *run*, never imported. The API, all a benchmark needs:

* ``add_venv_option(parser)`` -- the common ``--slayer-venv PATH`` option;
* ``slayer_python(args_venv)`` -- the Python of that venv (found or created);
* ``slayer_env(home, extra)`` -- the environment every SLayer process runs with;
* ``run_in_slayer(code_or_script, *args, env=...)`` -- run a snippet there, return its JSON stdout;
* ``generated_store(models, memories, backend)`` -- a synthetic store written by SLayer, cached;
* ``copy_store(store, dest)`` -- a private copy to mutate (generated stores are shared);
* ``print_table(headers, rows, ratio=...)``, ``fmt_seconds``, ``median`` -- side-by-side figures.

Everything heavy lives under ``bench/.work/`` (ignored by git).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / "bench" / ".work"
SHARED = Path(os.environ.get("SLAYER_LSP_SHARED") or REPO.parent / "shared")
GENERATOR = SHARED / "tools" / "gen_slayer_storage.py"

SLAYER_VERSION = "1.4.1"
SLAYER_REQUIREMENT = f"motley-slayer[advanced-search]=={SLAYER_VERSION}"  # the extra is hyphenated
VENV_ENV_VAR = "SLAYER_BENCH_VENV"
DEFAULT_VENV = WORK / "slayer-venv"

# SLayer phones home, writes ~/.config and lets litellm fetch a cost map unless told otherwise.
HYGIENE = {"SLAYER_USAGE_REPORTING": "off", "DO_NOT_TRACK": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
# Variables that would leak the project's interpreter or the user's real store into the oracle.
_SCRUBBED = (
    "PYTHONPATH",
    "PYTHONHOME",
    "VIRTUAL_ENV",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_CACHE_HOME",
    "SLAYER_STORAGE",
    "SLAYER_MODELS_DIR",
)

_checked: dict[Path, Path] = {}


class SlayerEnvError(RuntimeError):
    """The oracle environment is missing, broken or a SLayer run failed."""


# --------------------------------------------------------------------------- the work area


def compile_bytecode() -> None:
    """Write the bytecode of slayer_lsp's modules, so that a timed daemon start runs as an installed
    package's does (pip writes it at install). A checkout run with PYTHONDONTWRITEBYTECODE set, as
    in CI, compiles every module at every start instead: 0.3-0.5 s more."""
    import compileall

    compileall.compile_dir(str(REPO / "slayer_lsp"), quiet=1)


def work_dir() -> Path:
    """``bench/.work``, created on first use with a ``.gitignore`` so nothing in it is ever staged."""
    WORK.mkdir(parents=True, exist_ok=True)
    ignore = WORK / ".gitignore"
    if not ignore.exists():
        ignore.write_text("*\n")
    return WORK


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` so two benchmarks never build the same venv or store at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# --------------------------------------------------------------------------- the venv


def add_venv_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--slayer-venv",
        metavar="PATH",
        default=None,
        help=f"venv holding {SLAYER_REQUIREMENT} (default: ${VENV_ENV_VAR}, "
        f"else {DEFAULT_VENV.relative_to(REPO)}, created when missing)",
    )


def _venv_python(venv: Path) -> Path:
    if venv.is_file():  # the interpreter itself was given
        return venv
    for rel in ("bin/python", "Scripts/python.exe"):
        if (venv / rel).exists():
            return venv / rel
    return venv / "bin" / "python"


def _create_default_venv(venv: Path) -> None:
    """``python -m venv`` + ``pip install`` of the pinned SLayer; a marker says it completed."""
    ready = venv / ".slayer-bench-ready"
    with _locked(work_dir() / ".slayer-venv.lock"):
        if ready.exists():
            return
        print(
            f"[slayer-env] creating {venv} with {SLAYER_REQUIREMENT} (one-off, a few minutes)",
            file=sys.stderr,
        )
        if not _venv_python(venv).exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        # An unfinished earlier attempt is simply resumed: pip install is idempotent.
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
        subprocess.run(
            [
                str(_venv_python(venv)),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                SLAYER_REQUIREMENT,
            ],
            check=True,
            env=env,
            stdout=sys.stderr,
        )
        ready.write_text(SLAYER_REQUIREMENT + "\n")


def slayer_python(args_venv: str | None = None) -> Path:
    """The Python of a venv with motley-slayer 1.4.1 and its ``advanced-search`` extra.

    Order: ``args_venv`` (``--slayer-venv``: a venv directory or its interpreter), else
    ``$SLAYER_BENCH_VENV``, else ``bench/.work/slayer-venv``, which is created when missing. An
    explicit venv is never modified; a wrong SLayer version there is reported on stderr."""
    chosen = args_venv or os.environ.get(VENV_ENV_VAR)
    venv = Path(chosen).expanduser().absolute() if chosen else DEFAULT_VENV
    if venv in _checked:
        return _checked[venv]
    if not chosen:
        _create_default_venv(venv)
    python = _venv_python(venv)
    if not python.exists():
        raise SlayerEnvError(
            f"no Python in {venv}; create it with `python -m venv {venv} && "
            f"{venv}/bin/pip install '{SLAYER_REQUIREMENT}'`"
        )
    probe = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('motley-slayer'))"],
        capture_output=True,
        text=True,
        env=slayer_env(None),
    )
    if probe.returncode != 0:
        raise SlayerEnvError(f"motley-slayer is not installed in {venv}: {probe.stderr.strip()[-300:]}")
    if probe.stdout.strip() != SLAYER_VERSION:
        print(
            f"[slayer-env] warning: {venv} has motley-slayer {probe.stdout.strip()}, the benchmarks "
            f"were written against {SLAYER_VERSION}",
            file=sys.stderr,
        )
    _checked[venv] = python
    return python


def slayer_env(home: str | os.PathLike[str] | None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a SLayer process: ours minus leaky variables, plus telemetry off and
    ``HOME=home`` (pass a throwaway directory; ``None`` keeps ours). ``extra`` wins over all."""
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
    env.update(HYGIENE)
    if home is not None:
        env["HOME"] = os.fspath(home)
    env.update(extra or {})
    return env


def run_in_slayer(
    code_or_script: str | os.PathLike[str],
    *args: object,
    env: Mapping[str, str] | None = None,
    venv: str | None = None,
    timeout: float | None = None,
) -> Any:
    """Run Python code (a string) or a script (a ``Path`` or an existing ``*.py`` path) in the SLayer
    venv with ``args`` as its argv, in a throwaway ``HOME``; return its stdout parsed as JSON.

    The last non-empty stdout line is parsed when the whole output is not one JSON value, so a
    snippet may print progress before its result. Raises ``SlayerEnvError`` with the tail of stderr
    when the process fails or prints no JSON."""
    python = slayer_python(venv)
    target = os.fspath(code_or_script)
    is_script = isinstance(code_or_script, os.PathLike) or (
        target.endswith(".py") and "\n" not in target and Path(target).is_file()
    )
    cmd = [str(python), target] if is_script else [str(python), "-c", target]
    cmd += [str(a) for a in args]
    with tempfile.TemporaryDirectory(prefix="slayer-home-") as home:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=slayer_env(home, env), timeout=timeout)
    if proc.returncode != 0:
        raise SlayerEnvError(f"SLayer run failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return _parse_json(proc.stdout, proc.stderr)


def _parse_json(stdout: str, stderr: str) -> Any:
    try:
        return json.loads(stdout)
    except json.JSONDecodeError:
        lines = [ln for ln in stdout.splitlines() if ln.strip()]
        if lines:
            with contextlib.suppress(json.JSONDecodeError):
                return json.loads(lines[-1])
    raise SlayerEnvError(
        f"SLayer run printed no JSON; stdout tail: {stdout[-500:]!r}; stderr tail: {stderr[-1000:]!r}"
    )


# --------------------------------------------------------------------------- generated stores


def generated_store(
    models: int,
    memories: int,
    backend: str,
    *,
    columns: int | None = None,
    datasources: int | None = None,
    venv: str | None = None,
) -> Path:
    """A synthetic store written by SLayer itself (``shared/tools/gen_slayer_storage.py``).

    Built once per size and backend under ``bench/.work/gen-<models>-<memories>/`` (with
    ``columns`` / ``datasources`` other than the generator's defaults: ``gen-<models>x<columns>-<memories>``
    and ``-ds<n>``), ``yaml/`` or ``slayer.db`` inside, and reused while its marker matches the
    generator's digest. Returns the YAML directory or the SQLite file. Never mutate it: copy it first
    (benchmarks share it)."""
    if backend not in ("yaml", "sqlite"):
        raise ValueError(f"backend must be 'yaml' or 'sqlite', not {backend!r}")
    if not GENERATOR.is_file():
        raise SlayerEnvError(f"generator not found at {GENERATOR} (shared/ must sit beside the repo)")
    shape = f"{models}x{columns}" if columns is not None else f"{models}"
    out = work_dir() / (f"gen-{shape}-{memories}" + (f"-ds{datasources}" if datasources is not None else ""))
    target = out / ("yaml" if backend == "yaml" else "slayer.db")
    marker = out / f".done-{backend}.json"
    digest = hashlib.sha256(GENERATOR.read_bytes()).hexdigest()[:16]
    with _locked(out / f".{backend}.lock"):
        if marker.is_file() and target.exists():
            with contextlib.suppress(ValueError, OSError):
                if json.loads(marker.read_text()).get("generator") == digest:
                    return target
        marker.unlink(missing_ok=True)
        print(
            f"[slayer-env] generating {backend} store {models} models x {memories} memories in {out} ...",
            file=sys.stderr,
        )
        t0 = time.perf_counter()
        extra: list[object] = []
        if columns is not None:
            extra += ["--columns", columns]
        if datasources is not None:
            extra += ["--datasources", datasources]
        report = run_in_slayer(
            Path(GENERATOR),
            out,
            "--models",
            models,
            "--memories",
            memories,
            "--backend",
            backend,
            *extra,
            venv=venv,
        )
        seconds = time.perf_counter() - t0
        marker.write_text(
            json.dumps(
                {
                    "generator": digest,
                    "models": models,
                    "memories": memories,
                    "backend": backend,
                    "seconds": round(seconds, 1),
                    "report": report,
                },
                indent=2,
            )
        )
        print(f"[slayer-env] generated in {seconds:.1f} s", file=sys.stderr)
    return target


# --------------------------------------------------------------------------- figures


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """``"100x1000,1000x5000"`` -> [(100, 1000), (1000, 5000)] (models x memories)."""
    sizes = []
    for part in text.split(","):
        try:
            m, n = part.lower().split("x")
            sizes.append((int(m), int(n)))
        except ValueError:
            raise SystemExit(f"bad size {part!r}: expected MODELSxMEMORIES, e.g. 100x1000") from None
    return sizes


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def fmt_seconds(seconds: float | None) -> str:
    """``1.23 s``, ``45.6 ms`` or ``789 µs``: three significant-ish digits at any scale."""
    if seconds is None:
        return "-"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} µs"


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return fmt_seconds(value)
    return str(value)


def print_table(
    headers: Sequence[str],
    rows: Iterable[Sequence[object]],
    *,
    title: str | None = None,
    ratio: tuple[int, int] | None = None,
    ratio_header: str = "ratio",
    file: TextIO | None = None,
) -> None:
    """Print an aligned plain-text (Markdown-compatible) table.

    Float cells are durations in seconds and print via ``fmt_seconds``; pass strings for anything
    else. ``ratio=(num, den)`` appends a column ``row[num] / row[den]`` as ``12.3x`` (``-`` when either
    is missing or zero), e.g. ``ratio=(theirs, ours)`` reads "ours is N times faster"."""
    out = file or sys.stdout
    head = list(headers) + ([ratio_header] if ratio else [])
    body: list[list[str]] = []
    for row in rows:
        cells = [_cell(v) for v in row]
        if ratio:
            num, den = row[ratio[0]], row[ratio[1]]
            ok = isinstance(num, int | float) and isinstance(den, int | float) and den
            cells.append(f"{num / den:.1f}x" if ok else "-")  # type: ignore[operator]
        body.append(cells)
    widths = [max([len(h)] + [len(r[i]) for r in body if i < len(r)]) for i, h in enumerate(head)]
    if title:
        print(f"\n{title}", file=out)
    print("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |", file=out)
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|", file=out)
    for r in body:
        print(
            "| "
            + " | ".join(
                (c.rjust(w) if i else c.ljust(w)) for i, (c, w) in enumerate(zip(r, widths, strict=False))
            )
            + " |",
            file=out,
        )
    out.flush()


def copy_store(store: Path, dest: Path) -> Path:
    """A private, mutable copy of a store (directory or SQLite file) at ``dest``, replacing it."""
    if dest.is_dir():
        shutil.rmtree(dest)
    elif dest.exists():
        dest.unlink()
    dest.parent.mkdir(parents=True, exist_ok=True)
    if store.is_dir():
        shutil.copytree(store, dest, ignore=shutil.ignore_patterns(".*.tmp.*"))
    else:
        shutil.copy2(store, dest)
    return dest


# --------------------------------------------------------------------------- SLayer writing beside us

# One op per stdin line, one answer per stdout line ({"ok": ..., "s": seconds} or {"error": ...}).
_WRITER_PROGRAM = r"""
import asyncio, json, sys, time
from slayer.core.models import Column
from slayer.memories.service import MemoryService
from slayer.storage.base import resolve_storage


async def run(storage, memories, op):
    kind = op["op"]
    if kind == "save_memory":
        saved = await memories.save_memory(learning=op["learning"], linked_entities=op["entities"],
                                           id=op.get("id"), description=op.get("description"))
        return saved.model_dump(mode="json")
    if kind == "forget_memory":
        return (await memories.forget_memory(identifier=op["id"])).model_dump(mode="json")
    if kind in ("add_column", "drop_column"):
        model = await storage.get_model(op["model"], data_source=op["datasource"])
        if model is None:
            raise LookupError(f"no model {op['datasource']}.{op['model']}")
        model.columns = [c for c in model.columns if c.name != op["name"]]
        if kind == "add_column":
            model.columns.append(Column(name=op["name"], sql=op["name"], type="TEXT",
                                        description=op.get("description")))
        await storage.save_model(model)
        return True
    raise ValueError(f"unknown op {kind}")


async def main():
    import slayer.search.service  # noqa: F401 - what the first save would import (litellm: seconds)
    from slayer.embeddings.client import is_available

    is_available()
    storage = resolve_storage(sys.argv[1])
    memories = MemoryService(storage=storage)
    print(json.dumps({"ok": "ready"}), flush=True)
    for line in sys.stdin:
        t0 = time.perf_counter()
        try:
            answer = {"ok": await run(storage, memories, json.loads(line))}
        except Exception as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        answer["s"] = round(time.perf_counter() - t0, 4)
        print(json.dumps(answer), flush=True)


asyncio.run(main())
"""


class SlayerWriter:
    """A long-lived SLayer process that changes one store on request, as SLayer itself would (its
    storage and ``MemoryService``), so a benchmark can churn a store from another process without
    paying SLayer's import per write. Ops: ``save_memory(learning, entities, id?, description?)``,
    ``forget_memory(id)``, ``add_column(datasource, model, name, description?)`` (replacing a column of
    that name) and ``drop_column(datasource, model, name)``. Not thread-safe: one caller at a time."""

    def __init__(self, store: Path, *, venv: str | None = None, log_path: Path | None = None) -> None:
        self._home = tempfile.mkdtemp(prefix="slayer-home-")
        self._log = open(log_path or os.devnull, "ab")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [str(slayer_python(venv)), "-c", _WRITER_PROGRAM, os.fspath(store)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=slayer_env(self._home),
        )
        self._answer()  # "ready": SLayer is imported

    def _answer(self) -> Any:
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise SlayerEnvError(f"the SLayer writer exited ({self.proc.poll()}); see its log")
        answer = json.loads(line)
        if "error" in answer:
            raise SlayerEnvError(answer["error"])
        return answer["ok"]

    def call(self, op: str, **fields: Any) -> Any:
        """Run one op; its result, or ``SlayerEnvError`` with SLayer's message."""
        self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return self._answer()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # type: ignore[union-attr]
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
        shutil.rmtree(self._home, ignore_errors=True)
