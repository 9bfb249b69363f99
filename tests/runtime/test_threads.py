"""An offloaded model runs one forward at a time: a trap called from a second thread while
another thread is inside a trap is refused with a message that says so, and no forward from
several unlocked threads ever returns a wrong output (the check used to race with the schedule
state: a forward could slip between another's checks and read overwritten block bytes)."""

from __future__ import annotations

import sys
import threading

import torch

from flextensor_runtime.errors import InstallError
from tests.runtime.conftest import deploy
from tests.runtime.models import block_names, tiny_lm
from tests.runtime.plans import build_profile


def _forward_with_another_inside(model, ids, block: int) -> tuple[torch.Tensor, list]:
    """A forward during which another thread runs a whole forward while blocks.`block` runs;
    returns this forward's output and what the other thread raised."""
    errors: list[BaseException] = []

    def other_thread() -> None:
        try:
            with torch.no_grad():
                model(ids)
        except BaseException as exc:
            errors.append(exc)

    def inside(_module, _args) -> None:
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()

    hook = model.blocks[block].down.register_forward_pre_hook(inside)
    try:
        with torch.no_grad():
            return model(ids), errors
    finally:
        hook.remove()


def test_a_forward_from_another_thread_during_a_forward_names_threads() -> None:
    model, plain = tiny_lm(), tiny_lm()
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(0))
    deploy(model, build_profile(model, block_names(model), num_blocks=2))
    _, errors = _forward_with_another_inside(model, ids, 2)
    assert len(errors) == 1 and isinstance(errors[0], InstallError)
    message = str(errors[0])
    assert "called from another thread while trap 'blocks.2' runs" in message
    assert "one forward at a time" in message and "\n" not in message
    with torch.no_grad():  # the refused forward left the schedule intact
        assert torch.equal(model(ids), plain(ids))


def test_another_threads_forward_is_refused_inside_a_trap_that_streams_nothing() -> None:
    """No block bytes conflict here, so only the one-thread rule can refuse: a trap's entry
    and exit change schedule state another thread's checks read."""
    model, plain = tiny_lm(), tiny_lm()
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(0))
    streamed = [n for n in block_names(model) if n != "blocks.1"]
    deploy(model, build_profile(model, block_names(model), streamed=streamed, num_blocks=2))
    out, errors = _forward_with_another_inside(model, ids, 1)
    assert len(errors) == 1 and isinstance(errors[0], InstallError)
    assert "while trap 'blocks.1' runs" in str(errors[0])
    with torch.no_grad():
        assert torch.equal(out, plain(ids)) and torch.equal(model(ids), plain(ids))


def test_forwards_under_a_lock_from_several_threads_are_correct() -> None:
    n_threads = 3
    model, plain = tiny_lm(), tiny_lm()
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(0))
    deploy(model, build_profile(model, block_names(model), num_blocks=2))
    with torch.no_grad():
        expected = plain(ids)
    lock, results = threading.Lock(), []

    def worker() -> None:
        for _ in range(5):
            with lock, torch.no_grad():
                results.append(torch.equal(model(ids), expected))

    threads = [threading.Thread(target=worker) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 5 * n_threads


def test_unlocked_forwards_from_several_threads_are_right_or_refused() -> None:
    model, plain = tiny_lm(), tiny_lm()
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(0))
    deploy(model, build_profile(model, block_names(model), num_blocks=2))
    with torch.no_grad():
        expected = plain(ids)
    outcomes: list[str] = []
    start = threading.Barrier(3)

    def worker() -> None:
        start.wait()
        for _ in range(30):
            try:
                with torch.no_grad():
                    out = model(ids)
            except InstallError:
                outcomes.append("refused")
                continue
            outcomes.append("right" if torch.equal(out, expected) else "wrong")

    threads = [threading.Thread(target=worker) for _ in range(3)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads between almost any two bytecodes
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert len(outcomes) == 90 and "wrong" not in outcomes and "right" in outcomes
    with torch.no_grad():  # refusals left the schedule intact for the next single forward
        assert torch.equal(model(ids), expected)
