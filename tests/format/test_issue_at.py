"""The three meanings of `issue_at` (version 2): earlier, on entry, previous iteration."""

from __future__ import annotations

import dataclasses

import pytest

from flextensor_runtime.errors import ProfileFormatError
from flextensor_runtime.profile import Transfer, check_profile, issue_time, occupied_slots
from profiles.golden import format_golden


def test_occupied_slots_for_each_issue_at_case() -> None:
    n = 7
    assert occupied_slots(Transfer(3, 0, 0, 8, 1, 4), n) == [1, 2, 3, 4]  # earlier
    assert occupied_slots(Transfer(3, 0, 0, 8, 3, 4), n) == [3, 4]  # on entry
    assert occupied_slots(Transfer(3, 0, 0, 8, 5, 4), n) == [5, 6, 0, 1, 2, 3, 4]  # cyclic
    assert [issue_time(Transfer(3, 0, 0, 8, a, 3), n) for a in (1, 3, 5)] == [1, 3, -2]


def test_transfers_for_lists_a_trap_in_issue_order() -> None:
    golden = format_golden()
    s = list(golden.schedule)
    first = s[0]  # trap 1: issued at trap 5 of the previous iteration, block 0
    assert (first.trap, first.issue_at) == (1, 5)
    # (ordering only: these extra transfers carry no tensor, so the profile is not checked)
    later = dataclasses.replace(first, block=1, issue_at=1, release_after=1)
    profile = dataclasses.replace(golden, schedule=(later, *s))
    assert profile.schedule[:2] == (first, later)  # canonical: (trap, block, offset)
    assert profile.transfers_for(1) == (first, later)  # cyclic first, on entry last
    earlier = dataclasses.replace(first, block=1, issue_at=0, release_after=1)
    reordered = dataclasses.replace(golden, schedule=(earlier, *s))
    assert reordered.transfers_for(1) == (first, earlier)
    assert reordered.transfer_for(1) == first and reordered.transfer_for(0) is None


def test_on_entry_copy_is_not_held_over_the_iteration_end() -> None:
    golden = format_golden()
    s = list(golden.schedule)
    # trap 3 (block 0) copied at its own entry: held during trap 3 only, so it no longer
    # collides with trap 1's cyclic copy (5..1) the way a previous-iteration copy would
    on_entry = dataclasses.replace(
        golden, schedule=(*s[:2], dataclasses.replace(s[2], issue_at=3), s[3])
    )
    check_profile(on_entry)
    # trap 3 prefetched during trap 1, which still holds those bytes: rejected
    early = dataclasses.replace(
        golden, schedule=(*s[:2], dataclasses.replace(s[2], issue_at=1), s[3])
    )
    with pytest.raises(
        ProfileFormatError, match="transfer 1 of trap 1 and transfer 1 of trap 3 hold"
    ):
        check_profile(early)
    # cyclic copies still may not be held for more than one iteration
    long = dataclasses.replace(
        golden, schedule=(dataclasses.replace(s[0], release_after=5), *s[1:])
    )
    with pytest.raises(ProfileFormatError, match="transfer 1 of trap 1 is held for more than one"):
        check_profile(long)
