"""Include / exclude patterns: which modules become traps and which tensors may stream.

Owns: matching globs (`*`, `?`, anchored at both ends, `*` crosses dots) against module paths
and tensor paths, `class:Name` selection by module class name (globs allowed), the rule that a
parameter-level pattern patches the parent module but offloads only the matching parameters,
the default include (each child of the largest repeated `nn.ModuleList` / `nn.Sequential`
stack, plus any other top-level repeated stack holding at least 10% of the weight bytes), the
leaf granularity (each selected module replaced by the descendants that own its parameters),
the rule that an exclude covers a module's whole subtree (a path exclude the path and every
path under it; a `class:` exclude every module of that class at each path it is reachable at,
and everything under those), and one-line errors for a pattern that matches nothing (with the
closest path suggested).
Must not know: execution order, timing, the profile.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from torch import nn

from flextensor_runtime.errors import ConfigError

__all__ = ["Selection", "class_paths", "default_include", "excluding_pattern", "exclusion",
           "leaf_traps", "select_traps"]  # fmt: skip

_STACK_SHARE = 0.10  # a second repeated stack joins the default include above this byte share
_OWN_SHARE = 64  # a module is split when its own parameters are under 1/64 of its bytes


@dataclass(frozen=True)
class Selection:
    """Trap modules (outermost first match wins) and which of their tensors may stream.

    `only[path]` is None for a module-level match (all parameters and inner fields stream) or the
    set of tensor paths a parameter-level pattern matched. `buffers` are buffer paths a pattern
    names explicitly (buffers otherwise stay resident).
    """

    traps: tuple[str, ...]
    only: dict[str, frozenset[str] | None]
    buffers: frozenset[str]
    include: tuple[str, ...]
    exclude: tuple[str, ...]
    default: bool
    excluded_by: tuple[str, ...] = ()  # exclude patterns that removed a module include chose
    # class: exclude pattern -> every path (aliases included) of a module whose class it matches
    excluded_classes: dict[str, frozenset[str]] = field(default_factory=dict)


def _glob(name: str, pattern: str) -> bool:
    """`*` and `?` are the only wildcards: `[` in a pattern is itself (a ModuleDict key such as
    'x[0]'), never a character class."""
    return fnmatchcase(name, pattern.replace("[", "[[]"))


def _match(pattern: str, path: str, module: nn.Module | None = None) -> bool:
    if pattern.startswith("class:"):
        return module is not None and _glob(type(module).__name__, pattern[6:])
    return _glob(path, pattern)


def _matches_ancestor(pattern: str, path: str) -> bool:
    parts = path.split(".")
    return any(_glob(".".join(parts[:i]), pattern) for i in range(1, len(parts)))


def _module_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def default_include(model: nn.Module) -> tuple[str, ...]:
    """Patterns naming each child of the largest repeated ModuleList/Sequential stack(s)."""
    stacks: list[tuple[int, str]] = []
    for path, module in model.named_modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)) or len(module) < 2:
            continue
        kinds = {type(child) for child in module}
        if len(kinds) != 1:
            continue
        stacks.append((_module_bytes(module), path))
    if not stacks:  # no repeated stack: each top-level child that holds weights
        return tuple(n for n, c in model.named_children() if any(True for _ in c.parameters()))
    total = max(_module_bytes(model), 1)
    stacks.sort(key=lambda s: (-s[0], s[1]))
    chosen: list[str] = []
    for nbytes, path in stacks:
        nested = any(path.startswith(c + ".") or c.startswith(path + ".") for c in chosen)
        if not nested and (not chosen or nbytes >= _STACK_SHARE * total):
            chosen.append(path)
    return tuple(sorted(f"{p}.?*" if p else "?*" for p in chosen))


def leaf_traps(path: str, module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The leaf traps of a selected module: a module whose children own no parameters is one
    trap (when it owns any); a module is split into its children's leaf traps when its own
    parameters are under 1/`_OWN_SHARE` of its bytes (they then stay resident, read outside
    every trap), else it stays one trap. Execution between leaf traps becomes gap traps."""
    children = [(f"{path}.{n}", c) for n, c in module.named_children() if _module_bytes(c)]
    own = sum(p.numel() * p.element_size() for p in module.parameters(recurse=False))
    if not children:
        return [(path, module)] if own else []
    if own * _OWN_SHARE >= _module_bytes(module):
        return [(path, module)]
    return [leaf for p, c in children for leaf in leaf_traps(p, c)]


def class_paths(model: nn.Module, exclude: tuple[str, ...]) -> dict[str, frozenset[str]]:
    """Each `class:` exclude pattern -> every path of every module whose class name it matches,
    the paths of a module reachable at several places (aliases) included."""
    classes = [p for p in exclude if p.startswith("class:")]
    paths: dict[str, set[str]] = {p: set() for p in classes}
    for path, module in model.named_modules(remove_duplicate=False):
        for p in classes:
            if path and _glob(type(module).__name__, p[6:]):
                paths[p].add(path)
    return {p: frozenset(v) for p, v in paths.items()}


def exclusion(
    path: str, exclude: tuple[str, ...], classes: Mapping[str, frozenset[str]]
) -> tuple[str, str] | None:
    """The first exclude pattern that covers a module or tensor `path`, with the path it
    matched (`path` itself or an ancestor): a glob matching it, or a `class:` pattern whose
    modules (`classes`, from `class_paths`) include it. None when no pattern covers `path`."""
    parts = path.split(".")
    prefixes = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for p in exclude:
        if p.startswith("class:"):
            hit = next((q for q in prefixes if q in classes.get(p, frozenset())), None)
        else:
            hit = next((q for q in prefixes if _glob(q, p)), None)
        if hit is not None:
            return p, hit
    return None


def excluding_pattern(
    path: str, exclude: tuple[str, ...], classes: Mapping[str, frozenset[str]]
) -> str | None:
    """The first exclude pattern that covers `path` (`exclusion`), or None."""
    found = exclusion(path, exclude, classes)
    return None if found is None else found[0]


def _aliases(model: nn.Module) -> dict[str, str]:
    """Path -> first path of the same module object, for modules reachable at several paths
    (one layer repeated in a ModuleList: `named_modules()` lists only the first)."""
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for path, module in model.named_modules(remove_duplicate=False):
        if first.setdefault(id(module), path) != path:
            aliases[path] = first[id(module)]
    return aliases


def _canonical(name: str, aliases: dict[str, str]) -> str:
    """A tensor path through a repeated module, as the first path of that module names it."""
    parent, _, leaf = name.rpartition(".")
    return f"{aliases[parent]}.{leaf}" if parent in aliases else name


def _no_match(pattern: str, candidates: list[str], aliases: dict[str, str]) -> ConfigError:
    same = [(a, c) for a, c in aliases.items() if _glob(a, pattern)]
    if same:
        alias, canonical = same[0]
        return ConfigError(
            f"pattern {pattern!r} names {alias!r}, the same module object as {canonical!r} (one "
            f"module repeated in the model, run at each place); include {canonical!r} instead"
        )
    probe = pattern.replace("*", "0").replace("?", "0")
    close = difflib.get_close_matches(probe, candidates, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}?" if close else "check the module paths with named_modules()"
    return ConfigError(f"pattern {pattern!r} matches no module or tensor; {hint}")


def _outermost(paths: list[str]) -> list[str]:
    """The paths with no ancestor among `paths` (one set lookup per dotted prefix, not a scan of
    every other path: a model of many experts has tens of thousands of modules; a module name
    never holds a dot, so an ancestor is always a dotted prefix)."""
    given = set(paths)
    out = []
    for path in paths:
        cut = path.rfind(".")
        while cut > 0 and path[:cut] not in given:
            cut = path.rfind(".", 0, cut)
        if cut <= 0:
            out.append(path)
    return out


def select_traps(
    model: nn.Module, include: tuple[str, ...], exclude: tuple[str, ...], leaves: bool = False
) -> Selection:
    """Resolve patterns to trap modules; an empty `include` means the default stack; `leaves`
    replaces each module-level match by its `leaf_traps`."""
    default = not include
    patterns = include or default_include(model)
    modules = [(p, m) for p, m in model.named_modules() if p]
    aliases = _aliases(model)
    params = list(dict.fromkeys(_canonical(n, aliases) for n, _ in
                                model.named_parameters(remove_duplicate=False)))  # fmt: skip
    buffers = list(dict.fromkeys(_canonical(n, aliases) for n, _ in
                                 model.named_buffers(remove_duplicate=False)))  # fmt: skip
    _check_excludes(exclude, modules, params, buffers, aliases)
    classes = class_paths(model, exclude)
    chosen, named_buffers = _chosen(patterns, modules, params, buffers, aliases, default)
    by_path = dict(modules)
    kept = [path for path in chosen if excluding_pattern(path, exclude, classes) is None]
    outermost = _outermost(kept)
    only = {p: chosen[p] for p in outermost}
    kept_set = set(kept)
    removed = [p for p in chosen if p not in kept_set]
    if leaves:
        only, dropped = _refined(only, by_path, exclude, classes)
        removed += dropped
    order = {p: i for i, (p, _) in enumerate(model.named_modules(remove_duplicate=False))}
    return Selection(
        traps=tuple(sorted(only, key=order.__getitem__)),
        only=only,
        buffers=frozenset(named_buffers),
        include=tuple(patterns),
        exclude=tuple(exclude),
        default=default,
        excluded_by=tuple(
            x for x in exclude if any(excluding_pattern(p, (x,), classes) for p in removed)
        ),
        excluded_classes=classes,
    )


def _chosen(
    patterns: tuple[str, ...], modules: list[tuple[str, nn.Module]], params: list[str],
    buffers: list[str], aliases: dict[str, str], default: bool,
) -> tuple[dict[str, frozenset[str] | None], set[str]]:  # fmt: skip
    """Every module an include pattern selects (None: all its tensors; else the tensors named),
    and the buffers named directly; a pattern that matches nothing is an error unless default."""
    chosen: dict[str, frozenset[str] | None] = {}
    named_buffers: set[str] = set()
    for pattern in patterns:
        hit_modules = [p for p, m in modules if _match(pattern, p, m)]
        hit_tensors = (
            [] if pattern.startswith("class:") else [n for n in params if _match(pattern, n)]
        )
        hit_buffers = (
            [] if pattern.startswith("class:") else [n for n in buffers if _match(pattern, n)]
        )
        if not (hit_modules or hit_tensors or hit_buffers) and not default:
            raise _no_match(pattern, [p for p, _ in modules] + params, aliases)
        named_buffers.update(b for b in hit_buffers if not _matches_ancestor(pattern, b))
        for path in hit_modules:
            chosen[path] = None
        for name in hit_tensors + hit_buffers:
            parent = name.rpartition(".")[0]
            if parent and chosen.get(parent, frozenset()) is not None and parent not in hit_modules:
                chosen[parent] = (chosen.get(parent) or frozenset()) | {name}
    return chosen, named_buffers


def _check_excludes(
    exclude: tuple[str, ...], modules: list[tuple[str, nn.Module]], params: list[str],
    buffers: list[str], aliases: dict[str, str],
) -> None:  # fmt: skip
    """An exclude pattern must match a module, or (unless `class:`) a tensor."""
    for pattern in exclude:
        if not any(_match(pattern, p, m) for p, m in modules) and not (
            not pattern.startswith("class:") and any(_match(pattern, n) for n in params + buffers)
        ):
            raise _no_match(pattern, [p for p, _ in modules] + params, aliases)


def _refined(
    only: dict[str, frozenset[str] | None],
    by_path: dict[str, nn.Module],
    exclude: tuple[str, ...],
    classes: Mapping[str, frozenset[str]],
) -> tuple[dict[str, frozenset[str] | None], list[str]]:
    """Module-level traps replaced by their leaf traps, and the excluded leaves (a leaf under an
    excluded module included) dropped; parameter-level traps kept as they are."""
    out: dict[str, frozenset[str] | None] = {}
    dropped: list[str] = []
    for path, names in only.items():
        if names is not None:
            out[path] = names
            continue
        for leaf, _ in leaf_traps(path, by_path[path]):
            if excluding_pattern(leaf, exclude, classes) is None:
                out[leaf] = None
            else:
                dropped.append(leaf)
    return out, dropped
