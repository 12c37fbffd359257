"""Python's collector is paused only while the caller's own thread plans a save.

CPython's collector is process-wide: a pause made by any thread stops collections for
the training thread too. A save pauses it while it flattens and plans the state on the
caller's thread (the caller waits for that anyway) and never from its writer thread, so
while an async save writes and commits in the background the training thread keeps its
collections.
"""

from __future__ import annotations

import gc
import threading

import torch

import shardsafe
from shardsafe import _gc_pause


def test_collection_stays_on_while_an_async_save_writes_and_commits(tmp_path) -> None:
    state = {f"t{i}": torch.full((4,), float(i)) for i in range(20_000)}  # a commit with work to do
    assert gc.isenabled()
    seen: list[bool] = []
    with shardsafe.Checkpointer() as ckpt:
        for step in range(3):
            h = ckpt.async_save(state, str(tmp_path / f"s{step}"))
            while not h.done():  # what the training thread sees meanwhile
                seen.append(gc.isenabled())
            h.result()
    assert seen and all(seen), f"collection was off in {seen.count(False)} of {len(seen)} samples"
    assert gc.isenabled()


def test_the_pause_covers_planning_on_the_callers_thread(tmp_path, monkeypatch) -> None:
    observed: list[tuple[str, bool]] = []
    prepare = shardsafe.engine.save.saver.prepare

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        observed.append((threading.current_thread().name, gc.isenabled()))
        return prepare(*args, **kwargs)

    monkeypatch.setattr(shardsafe.engine.save.saver, "prepare", spy)
    shardsafe.async_save({"x": torch.ones(8)}, str(tmp_path / "a")).result()
    assert observed == [(threading.current_thread().name, False)]
    assert gc.isenabled()


def test_nested_and_threaded_pauses_restore_the_collector() -> None:
    barrier = threading.Barrier(2)

    def worker() -> None:
        with _gc_pause.paused():
            barrier.wait()
            barrier.wait()

    t = threading.Thread(target=worker)
    t.start()
    with _gc_pause.paused():
        barrier.wait()
        with _gc_pause.paused():
            assert not gc.isenabled()
        barrier.wait()
    t.join()
    assert gc.isenabled()
