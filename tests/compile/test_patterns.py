"""Include / exclude patterns: every form (module glob, `?`, parameter-level, class:, buffers,
exclude) and the default stack."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from flextensor_compile.discover.patterns import (
    _outermost,
    default_include,
    excluding_pattern,
    exclusion,
    select_traps,
)
from flextensor_runtime.errors import ConfigError
from tests.compile import models


def test_module_glob_keeps_outermost_matches():
    sel = select_traps(models.Stack(), ("layers.*",), ())
    assert sel.traps == ("layers.0", "layers.1", "layers.2")
    assert all(sel.only[t] is None for t in sel.traps)


def test_question_mark_matches_one_character():
    model = models.Stack(n=12)
    sel = select_traps(model, ("layers.?",), ())
    assert sel.traps == tuple(f"layers.{i}" for i in range(10))


def test_a_bracket_in_a_pattern_is_itself_not_a_character_class():
    """Patterns are globs of `*` and `?` only: `blocks.x[0]` (a ModuleDict key) was read as a
    character class, matched nothing, and the error suggested the very same pattern."""
    model = nn.Module()
    model.blocks = nn.ModuleDict({k: nn.Linear(2, 2) for k in ("x[0]", "x0", "y[1]")})
    assert select_traps(model, ("blocks.x[0]",), ()).traps == ("blocks.x[0]",)
    assert select_traps(model, ("blocks.?[?]",), ()).traps == ("blocks.x[0]", "blocks.y[1]")
    assert select_traps(model, ("blocks.*",), ("blocks.y[1]",)).traps == ("blocks.x[0]", "blocks.x0")
    with pytest.raises(ConfigError, match="matches no module"):
        select_traps(model, ("blocks.x[01]",), ())


def test_parameter_level_pattern_patches_parent_offloads_only_matches():
    sel = select_traps(models.Stack(), ("layers.*.fc?.weight",), ())
    assert sel.traps == tuple(f"layers.{i}.fc{j}" for i in range(3) for j in (1, 2))
    assert sel.only["layers.1.fc2"] == frozenset({"layers.1.fc2.weight"})


def test_class_pattern_selects_by_module_class():
    sel = select_traps(models.Stack(), ("class:Block",), ())
    assert sel.traps == ("layers.0", "layers.1", "layers.2")
    sel = select_traps(models.Stack(), ("class:Lin*",), ())
    assert "unused" in sel.traps and "head" in sel.traps and "layers.0.fc1" in sel.traps


def test_buffer_pattern_names_buffers_only_when_specific():
    assert select_traps(models.Stack(), ("layers.*",), ()).buffers == frozenset()
    sel = select_traps(models.Stack(), ("layers.*", "layers.*.scale"), ())
    assert sel.buffers == {f"layers.{i}.scale" for i in range(3)}


def test_exclude_modules_and_classes():
    sel = select_traps(models.Stack(), ("layers.*",), ("layers.1",))
    assert sel.traps == ("layers.0", "layers.2")
    sel = select_traps(models.Stack(), ("class:Linear",), ("class:Linear",))
    assert sel.traps == () and sel.excluded_by == ("class:Linear",)
    sel = select_traps(models.Stack(), ("layers.*",), ("layers.1", "head"))
    assert sel.excluded_by == ("layers.1",)  # 'head' removed no module the include chose
    sel = select_traps(models.Stack(), ("layers.0",), ("layers.0.*",), leaves=True)
    assert sel.traps == () and sel.excluded_by == ("layers.0.*",)  # every leaf excluded


def test_default_include_is_largest_repeated_stack():
    assert default_include(models.Stack()) == ("layers.?*",)

    class TwoStacks(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.big = nn.ModuleList(nn.Linear(64, 64) for _ in range(4))
            self.small = nn.ModuleList(nn.Linear(4, 4) for _ in range(4))  # < 10% of bytes
            self.also = nn.Sequential(*(nn.Linear(32, 32) for _ in range(4)))  # >= 10%

    assert default_include(TwoStacks()) == ("also.?*", "big.?*")


def test_default_without_stack_uses_top_level_children():
    model = nn.Sequential()
    model.add_module("a", nn.Linear(2, 2))
    model.add_module("b", nn.ReLU())
    model.add_module("c", nn.Conv1d(2, 2, 1))
    assert default_include(model) == ("a", "c")


def test_pattern_matching_nothing_suggests_the_closest_path():
    with pytest.raises(
        ConfigError, match=r"'layer\.\*' matches no module or tensor; did you mean 'layers\.0'"
    ):
        select_traps(models.Stack(), ("layer.*",), ())


def test_exclude_matching_nothing_is_an_error_like_include():
    with pytest.raises(
        ConfigError, match=r"'layer\.1' matches no module or tensor; did you mean 'layers\.1'"
    ):
        select_traps(models.Stack(), ("layers.*",), ("layer.1",))
    with pytest.raises(ConfigError, match=r"'class:Nope' matches no module or tensor"):
        select_traps(models.Stack(), (), ("class:Nope",))
    sel = select_traps(models.Stack(), ("layers.*",), ("*.fc1.weight", "class:Linear"))
    assert sel.traps == ("layers.0", "layers.1", "layers.2")


class _Repeated(nn.Module):
    """One layer object at three places in a ModuleList (weights shared, run three times)."""

    def __init__(self) -> None:
        super().__init__()
        shared = nn.Linear(32, 32)
        self.layers = nn.ModuleList([shared, shared, shared] + [nn.Linear(32, 32) for _ in range(4)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.parametrize("include", [(), ("layers.?*",), ("layers.*.weight",)])
def test_a_module_repeated_in_a_list_is_one_trap_at_its_first_path(include):
    sel = select_traps(_Repeated(), include, ())
    assert sel.traps == ("layers.0", "layers.3", "layers.4", "layers.5", "layers.6")


def test_a_pattern_naming_a_repeat_names_its_first_path():
    with pytest.raises(ConfigError, match=r"same module object as 'layers.0'.*include 'layers.0'"):
        select_traps(_Repeated(), ("layers.1",), ())


def test_a_class_exclude_covers_the_subtree_of_each_module_of_that_class():
    """The default include (`layers.?*`) also matches the layers inside each block: excluding
    the blocks by class must exclude those too, not promote them to traps."""
    sel = select_traps(models.Stack(), (), ("class:Block",))
    assert sel.traps == () and sel.excluded_by == ("class:Block",)
    sel = select_traps(models.Stack(), ("layers.?*", "head"), ("class:Block",))
    assert sel.traps == ("head",) and sel.excluded_by == ("class:Block",)
    sel = select_traps(models.Stack(), ("layers.0.fc?.weight",), ("class:Block",))
    assert sel.traps == () and sel.excluded_by == ("class:Block",)  # parameter-level too


@pytest.mark.parametrize("granularity", ["modules", "leaves"])
def test_a_class_exclude_drops_every_leaf_under_an_excluded_module(granularity):
    leaves = granularity == "leaves"
    sel = select_traps(models.Stack(), ("layers",), ("class:Block",), leaves=leaves)
    assert sel.traps == (() if leaves else ("layers",))  # the list itself is no Block
    assert sel.excluded_by == (("class:Block",) if leaves else ())
    sel = select_traps(models.Stack(), ("layers.?*",), ("class:LayerNorm",), leaves=leaves)
    kept = [f"layers.{i}.fc{j}" for i in range(3) for j in (1, 2)]
    assert sel.traps == (tuple(kept) if leaves else ("layers.0", "layers.1", "layers.2"))


def test_a_class_exclude_covers_every_path_of_a_repeated_module():
    class Repeated(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            shared = models.Block()
            self.layers = nn.ModuleList([shared, nn.Linear(8, 8), shared, models.Block()])
            self.body = nn.Sequential(shared, nn.Linear(8, 8))  # the same block again, nested

    model = Repeated()
    sel = select_traps(model, ("layers.?*", "body"), ("class:Block",))
    assert sel.traps == ("layers.1", "body")
    paths = sel.excluded_classes["class:Block"]
    assert {"layers.0", "layers.2", "layers.3", "body.0"} <= paths
    assert excluding_pattern("layers.2.fc1.weight", sel.exclude, sel.excluded_classes) == (
        "class:Block"
    )
    assert exclusion("body.0.norm.bias", sel.exclude, sel.excluded_classes) == (
        "class:Block", "body.0")  # fmt: skip
    assert excluding_pattern("body.1.weight", sel.exclude, sel.excluded_classes) is None


def test_the_first_exclude_pattern_covering_a_path_is_named():
    sel = select_traps(models.Stack(), ("layers.?*",), ("class:Linear", "layers.1"))
    assert exclusion("layers.1.fc1.weight", sel.exclude, sel.excluded_classes) == (
        "class:Linear", "layers.1.fc1")  # fmt: skip
    assert exclusion("layers.1.norm.weight", sel.exclude, sel.excluded_classes) == (
        "layers.1", "layers.1")  # fmt: skip
    assert sel.traps == ("layers.0", "layers.2")
    assert sel.excluded_by == ("class:Linear", "layers.1")  # each removed a chosen module


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from(["a", "ab", "b", "0", "10", "1"]), min_size=1,
                         max_size=4).map(".".join), max_size=12))  # fmt: skip
def test_outermost_paths_are_those_no_other_path_contains(paths: list[str]) -> None:
    expected = [p for p in paths if not any(p.startswith(q + ".") for q in paths)]
    assert _outermost(paths) == expected
