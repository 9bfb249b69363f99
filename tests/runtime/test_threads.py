"""An offloaded model runs one forward at a time: a second thread's forward is refused with a
message that says so (it used to blame only the profile)."""

from __future__ import annotations

import threading

import torch

from flextensor_runtime.errors import InstallError
from tests.runtime.conftest import deploy
from tests.runtime.models import block_names, tiny_lm
from tests.runtime.plans import build_profile


def test_a_forward_from_another_thread_during_a_forward_names_threads() -> None:
    model, plain = tiny_lm(), tiny_lm()
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(0))
    deploy(model, build_profile(model, block_names(model), num_blocks=2))
    errors: list[BaseException] = []

    def other_thread() -> None:
        try:
            with torch.no_grad():
                model(ids)
        except BaseException as exc:
            errors.append(exc)

    def inside_blocks_2(_module, _args) -> None:  # another thread's forward while blocks.2 runs
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()

    hook = model.blocks[2].down.register_forward_pre_hook(inside_blocks_2)
    with torch.no_grad():
        model(ids)
    hook.remove()
    assert len(errors) == 1 and isinstance(errors[0], InstallError)
    assert "another thread in a forward" in str(errors[0])
    assert "one forward at a time" in str(errors[0]) and "\n" not in str(errors[0])
    with torch.no_grad():  # the refused forward left the schedule intact
        assert torch.equal(model(ids), plain(ids))


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
