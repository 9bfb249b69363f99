"""The discrete-event simulator on cases small enough to work out by hand."""

from __future__ import annotations

from flextensor_compile.solve import CopyJob, simulate


def test_no_copies_is_the_sum_of_compute() -> None:
    sim = simulate((1.0, 2.0, 3.0), ())
    assert sim.makespan_ms == 6.0 and sim.stall_ms == 0.0
    assert sim.trap_spans_ms == ((0.0, 1.0), (1.0, 3.0), (3.0, 6.0))


def test_copy_hidden_by_the_previous_trap() -> None:
    # trap 1's copy (1.5 ms) is issued at the entry of trap 0 (3 ms of compute): no stall.
    sim = simulate((3.0, 1.0), (CopyJob(trap=1, issue_at=0, copy_ms=1.5),))
    assert sim.makespan_ms == 4.0 and sim.stall_ms == 0.0


def test_copy_longer_than_its_window_stalls_by_the_difference() -> None:
    # issued at entry of trap 0 (1 ms), takes 3 ms: trap 1 waits 2 ms.
    sim = simulate((1.0, 1.0), (CopyJob(trap=1, issue_at=0, copy_ms=3.0),))
    assert sim.trap_stall_ms == (0.0, 2.0)
    assert sim.makespan_ms == 4.0


def test_one_copy_engine_serialises_copies() -> None:
    # both copies issued at trap 0's entry; trap 2's copy queues behind trap 1's.
    jobs = (CopyJob(1, 0, 2.0), CopyJob(2, 0, 2.0))
    sim = simulate((1.0, 1.0, 1.0), jobs)
    # trap 1 starts at 2 (stall 1), ends 3; trap 2's copy ends at 4: stall 1, ends 5.
    assert sim.trap_stall_ms == (0.0, 1.0, 1.0)
    assert sim.makespan_ms == 5.0


def test_cyclic_prefetch_hides_the_first_traps_copy_in_steady_state() -> None:
    # trap 0's copy is issued at trap 1's entry of the previous iteration (issue_at > trap).
    sim = simulate((1.0, 2.0), (CopyJob(trap=0, issue_at=1, copy_ms=1.5),))
    assert sim.stall_ms == 0.0 and sim.makespan_ms == 3.0
    # a 2.5 ms copy in trap 1's 2 ms window: trap 0 of the next iteration waits 0.5 ms.
    slow = simulate((1.0, 2.0), (CopyJob(trap=0, issue_at=1, copy_ms=2.5),))
    assert abs(slow.trap_stall_ms[0] - 0.5) < 1e-12
