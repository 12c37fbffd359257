"""Preemption signals in one process: real signals raised with signal.raise_signal."""

from __future__ import annotations

import signal
import threading

import pytest
import torch

from shardsafe import CheckpointManager
from shardsafe.manager.preemption import PreemptionWatcher

SIG = signal.SIGUSR1


@pytest.fixture
def previous_handler():
    calls: list[int] = []

    def handler(signum, frame) -> None:
        calls.append(signum)

    old = signal.signal(SIG, handler)
    yield handler, calls
    signal.signal(SIG, old)


def test_signal_makes_the_next_step_due(tmp_path, previous_handler) -> None:
    handler, calls = previous_handler
    state = {"w": torch.zeros(4)}
    with CheckpointManager(tmp_path, save_interval_steps=100, preemption_signals=(SIG,)) as mgr:
        assert signal.getsignal(SIG) != handler
        mgr.save(0, state)
        assert not mgr.should_save(5) and not mgr.reached_preemption(5)
        signal.raise_signal(SIG)
        assert calls == []  # the first signal is ours
        # the signal came after step 5's save decision: step 5 was not saved, so not reached
        assert not mgr.reached_preemption(5)
        assert mgr.should_save(6)
        assert mgr.save(6, state)
        assert mgr.reached_preemption(6)
        assert not mgr.should_save(7)  # one save answers the signal; the schedule resumes
        assert mgr.reached_preemption(7)
        mgr.wait_until_finished()
        assert mgr.all_steps() == [0, 6]
    assert signal.getsignal(SIG) == handler  # restored on close


def test_signal_after_a_save_of_the_same_step(tmp_path) -> None:
    with CheckpointManager(tmp_path, preemption_signals=(SIG,)) as mgr:
        mgr.save(3, {"w": torch.zeros(2)})
        signal.raise_signal(SIG)
        assert mgr.reached_preemption(3)  # step 3 is saved: nothing more to do
        assert not mgr.reached_preemption(4)


def test_second_signal_reaches_the_previous_handler(tmp_path, previous_handler) -> None:
    handler, calls = previous_handler
    with CheckpointManager(tmp_path, preemption_signals=(SIG,)):
        signal.raise_signal(SIG)
        signal.raise_signal(SIG)
        assert calls == [SIG]


def test_second_sigint_interrupts() -> None:
    # Python's own SIGINT handler first: code run earlier in this process (a library's
    # launcher, say) may have replaced it, and the second Ctrl-C goes to the one before ours
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        w = PreemptionWatcher((signal.SIGINT,))
        try:
            signal.raise_signal(signal.SIGINT)
            assert w.received == signal.SIGINT
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)
        finally:
            w.close()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


def test_handlers_need_the_main_thread(tmp_path) -> None:
    errors: list[BaseException] = []

    def build() -> None:
        try:
            CheckpointManager(tmp_path, preemption_signals=(SIG,))
        except ValueError as e:
            errors.append(e)

    t = threading.Thread(target=build)
    t.start()
    t.join()
    assert errors and "main thread" in str(errors[0])


def test_failed_constructor_leaves_no_handler(tmp_path, previous_handler) -> None:
    handler, _ = previous_handler
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(OSError):
        CheckpointManager(tmp_path / "file" / "ckpt", preemption_signals=(SIG,))
    assert signal.getsignal(SIG) == handler
