"""The idle collector: full GC passes wait for a quiet moment, and a build's frozen cycles are still
collected. Each case runs in a fresh interpreter (the collector's settings are process-wide)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PRELUDE = textwrap.dedent(
    """
    import gc, time, weakref
    from slayer_lsp import collector
    from slayer_lsp.collector import IdleCollector, FULL_AFTER

    class Node:
        pass

    def garbage_cycle(flag):
        a, b = Node(), Node()
        a.other, b.other = b, a
        weakref.finalize(a, flag.append, "gone")
        return a

    def churn():  # enough surviving young objects for FULL_AFTER generation-1 passes
        keep = []
        while gc.get_count()[2] < FULL_AFTER:
            keep.append([[] for _ in range(200)])
        return keep
    """
)

CASES = {
    "busy_then_idle": """
        c = IdleCollector(idle_s=0.2, max_defer_s=60.0, tick_s=0.01)
        c.start()
        assert gc.get_threshold()[2] > 10**6, gc.get_threshold()
        flag = []
        held = garbage_cycle(flag)
        gc.collect(1)  # the cycle reaches the oldest generation, then becomes garbage there
        del held
        keep = churn()
        end = time.monotonic() + 0.5
        while time.monotonic() < end:  # a busy server: a message every 20 ms
            c.touch()
            time.sleep(0.02)
        assert c.collections == 0 and not flag, (c.collections, flag)
        deadline = time.monotonic() + 5
        while not flag and time.monotonic() < deadline:
            time.sleep(0.02)
        assert flag == ["gone"] and c.collections >= 1, (flag, c.collections)
        c.stop()
        assert gc.get_threshold()[2] < 1000
    """,
    "busy_for_too_long": """
        c = IdleCollector(idle_s=10.0, max_defer_s=0.3, tick_s=0.01)
        c.start()
        flag = []
        held = garbage_cycle(flag)
        gc.collect(1)
        del held
        keep = churn()
        assert not flag
        deadline = time.monotonic() + 5
        while not flag and time.monotonic() < deadline:
            c.touch()
            time.sleep(0.02)
        assert flag == ["gone"], "a server never idle still collects its cycles"
        c.stop()
    """,
    "settle_waits_for_idle": """
        c = IdleCollector(idle_s=0.2, max_defer_s=60.0, tick_s=0.01)
        c.start()
        flag = []
        held = garbage_cycle(flag)
        gc.freeze()  # as the engine does when a build ends
        del held
        collector.settle()
        end = time.monotonic() + 0.4
        while time.monotonic() < end:
            c.touch()
            time.sleep(0.02)
        assert not flag, "settled while busy"
        deadline = time.monotonic() + 5
        while not flag and time.monotonic() < deadline:
            time.sleep(0.02)
        assert flag == ["gone"], "a frozen cycle is collected by the settle"
        assert gc.get_freeze_count() > 0, "what survived is frozen again"
        c.stop()
    """,
    "settle_without_collector": """
        flag = []
        held = garbage_cycle(flag)
        gc.freeze()
        del held
        gc.collect()
        assert not flag, "a frozen cycle is not collected by an ordinary pass"
        collector.settle()
        assert flag == ["gone"] and gc.get_freeze_count() > 0
    """,
    "only_a_later_build_settles": """
        from tests.conftest import YAML_STORE
        from slayer_lsp.engine import Engine

        settled = []
        collector.settle = lambda: settled.append(1)
        Engine(YAML_STORE, use_cache=False).refresh()
        assert gc.get_freeze_count() > 0, "the first build is frozen"
        assert not settled, "and not walked: nothing frozen before it can be garbage"
        Engine(YAML_STORE, use_cache=False).refresh()
        assert settled == [1], "a later build's end collects what the earlier one held"
    """,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_idle_collector(case: str) -> None:
    code = PRELUDE + textwrap.dedent(CASES[case]) + "\nprint('ok')\n"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]
