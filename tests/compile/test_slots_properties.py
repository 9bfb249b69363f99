"""Properties of order and time attribution over random call sequences (hypothesis)."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from flextensor_compile.discover.hooks import Event
from flextensor_compile.discover.slots import attribute, plan_slots

# one iteration: a list of (trap or None for outside compute, duration ms)
_step = st.tuples(st.sampled_from(["a", "b", "c", None]), st.integers(1, 50))
_iteration = st.lists(_step, min_size=1, max_size=12)


def _events(iterations: list[list[tuple[str | None, int]]]) -> list[Event]:
    events, now = [], 0.0
    for it in iterations:
        events.append(Event("begin", "", now))
        for trap, ms in it:
            if trap is None:
                events.append(Event("op", ""))
                now += ms
            else:
                events.append(Event("enter", trap, now))
                now += ms
                events.append(Event("exit", trap, now))
        events.append(Event("end", "", now))
    return events


@settings(max_examples=int(os.environ.get("FLEXTENSOR_SLOT_EXAMPLES", "60")), deadline=None)
@given(st.lists(_iteration, min_size=1, max_size=3))
def test_attribution_conserves_time_and_orders_every_trap(iterations):
    events = _events(iterations)
    plan = plan_slots(events, manual=set())
    called = {t for it in iterations for t, _ in it if t is not None}
    assert set(plan.traps) == called
    first_seen = list(dict.fromkeys(t for t, _ in iterations[0] if t is not None))
    assert [t for t in plan.traps if t in first_seen] == first_seen  # first calls' order
    ms = attribute(events, plan)
    assert all(v >= 0 for v in ms.values())
    total = sum(ms_ for it in iterations for _, ms_ in it) / len(iterations)
    # every stretch is either a trap call or outside compute that ran in a gap slot
    assert abs(sum(ms.values()) - total) < 1e-6
    for trap in called:
        assert (
            ms[trap]
            >= sum(d for it in iterations for t, d in it if t == trap) / len(iterations) - 1e-6
        )
