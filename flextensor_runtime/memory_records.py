"""World-model memory records: a bounded store of retrievable records and a memory template.

Owns: `MemoryRecord` and `MemoryQuery` (plain data), `MemoryStore` (bounded, oldest-first
eviction, filtering and top-k ranking) and `BaseMemory` (the five-stage template: record,
manage, select, compress, process). These are *semantic* memories of an agent or world model
(observations, actions, captions, latents): they never allocate or place GPU memory.
Must not know: VRAM, offloading, devices, caches. It imports no torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from flextensor_runtime.errors import ConfigError
from flextensor_runtime.memory_match import matches_metadata, words

__all__ = ["REQUIRED_KEYS", "BaseMemory", "MemoryQuery", "MemoryRecord", "MemoryStore"]

REQUIRED_KEYS = ("content", "kind", "timestamp", "metadata")


@dataclass(frozen=True)
class MemoryRecord:
    """One memory: any `content`, a `kind` tag, a `timestamp`, free `metadata`, an optional score."""

    content: Any
    kind: str = "other"
    timestamp: int | float | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    score: float | None = None

    def __post_init__(self) -> None:
        _check_fields(self.kind, self.metadata, self.timestamp, self.score)

    def to_dict(self) -> dict[str, Any]:
        """The record as the dict a `MemoryStore` holds."""
        return {
            "content": self.content,
            "kind": self.kind,
            "timestamp": self.timestamp,
            "metadata": dict(self.metadata)
            if isinstance(self.metadata, Mapping)
            else self.metadata,
            "score": self.score,
        }


_QUERY_TYPES: Mapping[str, type | tuple[type, ...]] = MappingProxyType(
    {"kind": str, "metadata": Mapping, "since": (int, float), "until": (int, float),
     "min_score": (int, float), "text": str}
)  # fmt: skip
_QUERY_WANTED: Mapping[str, str] = MappingProxyType(
    {"kind": "a str", "metadata": "a mapping", "since": "a number", "until": "a number",
     "min_score": "a number", "text": "a str"}
)  # fmt: skip


@dataclass(frozen=True)
class MemoryQuery:
    """Filters and ranking for `MemoryStore.query`.

    Filters: `kind`, `metadata` (every given key must be equal), `since`/`until` (inclusive
    timestamp bounds), `min_score`, `text` (records whose content, as text, shares at least one
    word with it). Ranking, best first: share of `text` words found (when given), then score
    (records without one rank last), then newest timestamp, then latest insertion. `top_k=None`
    returns every match.
    """

    top_k: int | None = 5
    kind: str | None = None
    metadata: Mapping[str, Any] | None = None
    since: int | float | None = None
    until: int | float | None = None
    min_score: float | None = None
    text: str | None = None

    def __post_init__(self) -> None:
        k = self.top_k
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
            raise ConfigError(f"MemoryQuery top_k={k!r} is invalid; pass an integer >= 0 or None")
        for name, types in _QUERY_TYPES.items():
            value = getattr(self, name)
            bad_type = isinstance(value, bool) or not isinstance(value, types)
            if value is not None and (bad_type or value != value):  # NaN bounds match nothing
                raise ConfigError(
                    f"MemoryQuery {name}={value!r} is invalid; pass {_QUERY_WANTED[name]} or None"
                )


def _is_number(value: object) -> bool:
    """An int or float that orders against others (NaN would scramble every ranking)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value == value


def _check_fields(kind: object, metadata: object, timestamp: object, score: object) -> None:
    """The checks every record passes, made or added (one-line `ConfigError`s)."""
    if not isinstance(kind, str) or not isinstance(metadata, Mapping):
        raise ConfigError(
            f"memory record kind={kind!r} metadata={metadata!r} is invalid; pass a str kind and "
            "a mapping metadata"
        )
    for name, value in (("timestamp", timestamp), ("score", score)):
        if value is not None and not _is_number(value):
            raise ConfigError(
                f"memory record {name}={value!r} is invalid; pass a number (not NaN) or None"
            )


def _check_capacity(capacity: object) -> int | None:
    if capacity is None:
        return None
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ConfigError(f"memory capacity={capacity!r} is invalid; pass an integer >= 1 or None")
    return capacity


class MemoryStore:
    """Bounded in-process memory store; records are dicts with at least `REQUIRED_KEYS`.

    At capacity, adding a record evicts the oldest (first inserted) ones. A record added
    without a timestamp gets the current length counting the records evicted since the store
    was made or last replaced, so default timestamps keep increasing past the capacity.
    """

    def __init__(
        self,
        capacity: int | None = None,
        records: Iterable[Mapping[str, Any] | MemoryRecord] = (),
    ) -> None:
        self._capacity = _check_capacity(capacity)
        self._records: list[dict[str, Any]] = []
        self._evicted = 0  # records evicted since the last replace: default timestamps count them
        self.replace(records)

    @property
    def capacity(self) -> int | None:
        return self._capacity

    @property
    def records(self) -> list[dict[str, Any]]:
        """The live list of stored record dicts, oldest first."""
        return self._records

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._records)

    def append(
        self,
        content: Any,
        kind: str = "other",
        timestamp: int | float | None = None,
        metadata: Mapping[str, Any] | None = None,
        score: float | None = None,
    ) -> dict[str, Any]:
        """Append a new record; *timestamp* defaults to the current length.

        The length counts the records evicted at capacity since the store was made or last
        replaced, so a default timestamp is never one an earlier default already used.
        """
        meta = {} if metadata is None else metadata
        return self.add(MemoryRecord(content, kind, timestamp, meta, score))

    def add(self, record: Mapping[str, Any] | MemoryRecord) -> dict[str, Any]:
        """Normalise *record* to a dict, append it, and evict if over capacity."""
        stored = self._normalise(record)
        self._records.append(stored)
        self.evict()
        return stored

    def latest(
        self, prefer_type: str | None = None, metadata: Mapping[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """The newest record matching `metadata`, preferring kind `prefer_type` when one exists.

        Newest means the largest timestamp, ties broken by later insertion. If no record of
        `prefer_type` matches, the newest matching record of any kind is returned.
        """
        if metadata is not None and not isinstance(metadata, Mapping):
            raise ConfigError(f"latest metadata={metadata!r} is invalid; pass a mapping or None")
        matching = [r for r in self._records if matches_metadata(r, metadata)]
        preferred = [r for r in matching if r.get("kind") == prefer_type]
        pool = preferred or matching
        if not pool:
            return None
        order = {id(r): i for i, r in enumerate(self._records)}
        return max(pool, key=lambda r: (self._time(r), order[id(r)]))

    def query(self, query: MemoryQuery | None = None, **overrides: Any) -> list[dict[str, Any]]:
        """Rank stored records and return the top-`query.top_k` matches (see `MemoryQuery`)."""
        q = MemoryQuery() if query is None else query
        if not isinstance(q, MemoryQuery):
            raise ConfigError(
                f"query of type {type(q).__name__} is invalid; pass a MemoryQuery, or its fields "
                "as keywords, e.g. query(text='door', top_k=3)"
            )
        try:
            q = dataclasses.replace(q, **overrides)
        except TypeError:
            names = ", ".join(f.name for f in dataclasses.fields(MemoryQuery))
            raise ConfigError(
                f"query overrides {sorted(overrides)} are not all MemoryQuery fields; use {names}"
            ) from None
        wanted = words(q.text) if q.text else set()
        ranked = []
        for position, record in enumerate(self._records):
            if not self._passes(record, q):
                continue
            text = str(record.get("content", ""))
            overlap = len(wanted & words(text)) / len(wanted) if wanted else 0.0
            if wanted and overlap == 0.0:
                continue
            score = record.get("score")
            key = (overlap, score is not None, score or 0.0, self._time(record), position)
            ranked.append((key, record))
        ranked.sort(key=lambda item: item[0], reverse=True)
        top = ranked if q.top_k is None else ranked[: q.top_k]
        return [record for _, record in top]

    def evict(self) -> list[dict[str, Any]]:
        """Drop oldest records until `len(self) <= capacity` (no-op if unbounded); return them."""
        if self._capacity is None or len(self._records) <= self._capacity:
            return []
        excess = len(self._records) - self._capacity
        dropped, self._records[:excess] = self._records[:excess], []
        self._evicted += excess
        return dropped

    def replace(self, records: Iterable[Mapping[str, Any] | MemoryRecord]) -> None:
        """Clear the store and append *records* in order (the list object stays the same).

        *records* is read in full before the store is cleared, so it may be (or be computed
        from) the store's own records: `store.replace(r for r in store.records if ...)`.
        If a record is invalid the store keeps its previous records.
        """
        if isinstance(records, (str, bytes)) or not isinstance(records, Iterable):
            raise ConfigError(
                f"records of type {type(records).__name__} are invalid; pass a list of record "
                "mappings or MemoryRecords"
            )
        incoming = list(records)  # before clearing: a generator over self._records would see []
        saved, saved_evicted = list(self._records), self._evicted
        self._records.clear()
        self._evicted = 0
        try:
            for record in incoming:
                self.add(record)
        except BaseException:
            self._records[:] = saved
            self._evicted = saved_evicted
            raise

    def _normalise(self, record: Mapping[str, Any] | MemoryRecord) -> dict[str, Any]:
        if not isinstance(record, (Mapping, MemoryRecord)):
            raise ConfigError(
                f"memory record of type {type(record).__name__} is invalid; pass a mapping with "
                "a 'content' key or a MemoryRecord"
            )
        data = record.to_dict() if isinstance(record, MemoryRecord) else dict(record)
        if "content" not in data:
            raise ConfigError(f"memory record {sorted(data)} lacks 'content'; add a content key")
        data.setdefault("kind", "other")
        data.setdefault("metadata", {})
        data.setdefault("score", None)
        if data.get("timestamp") is None:
            data["timestamp"] = len(self._records) + self._evicted
        _check_fields(data["kind"], data["metadata"], data["timestamp"], data["score"])
        data["metadata"] = dict(data["metadata"])
        return data

    @staticmethod
    def _time(record: Mapping[str, Any]) -> float:
        stamp = record.get("timestamp")
        return float(stamp) if isinstance(stamp, (int, float)) else float("-inf")

    @staticmethod
    def _passes(record: Mapping[str, Any], q: MemoryQuery) -> bool:
        stamp = MemoryStore._time(record)
        score = record.get("score")
        return (
            (q.kind is None or record.get("kind") == q.kind)
            and matches_metadata(record, q.metadata)
            and (q.since is None or stamp >= q.since)
            and (q.until is None or stamp <= q.until)
            and (q.min_score is None or (score is not None and score >= q.min_score))
        )


class BaseMemory:
    """Generic multimodal memory template for VLM and generative tasks.

    Subclasses implement the five-stage pipeline. Commands (mutate state): `record(data, ...)`
    ingests raw interaction data; `manage()` evicts, merges or consolidates. Queries: `select`
    retrieves relevant records, `compress` distils them, `process` adapts them to a model input
    format. The defaults here append, evict oldest-first and rank with `MemoryQuery`;
    `compress` and `process` have no generic meaning and raise NotImplementedError.
    Extra keyword arguments are kept in `config` for subclasses.
    """

    content_types: tuple[str, ...] = ("text", "image", "video", "audio", "action", "state", "other")

    def __init__(self, capacity: int | None = None, **kwargs: Any) -> None:
        self.store = MemoryStore(capacity)
        self.config: dict[str, Any] = dict(kwargs)

    @property
    def records(self) -> list[dict[str, Any]]:
        """Live list of persisted record dicts (same object the store holds)."""
        return self.store.records

    def replace_records(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Replace the backing records, preserving `capacity` (see `MemoryStore.replace`)."""
        self.store.replace(records)

    def schema(self, **kwargs: Any) -> dict[str, Any]:
        """Return required record keys and supported content types."""
        return {"required_keys": list(REQUIRED_KEYS), "content_types": list(self.content_types)}

    def append_record(
        self,
        content: Any,
        kind: str = "other",
        timestamp: int | float | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Append one typed record through the bounded store."""
        if kind not in self.content_types:
            raise ConfigError(
                f"record kind {kind!r} is not a content type of {type(self).__name__}; "
                f"use one of {list(self.content_types)}"
            )
        return self.store.append(content, kind, timestamp, metadata)

    def latest_record(
        self, prefer_type: str | None = None, metadata: Mapping[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """Return the newest matching record, or `None` (see `MemoryStore.latest`)."""
        return self.store.latest(prefer_type, metadata)

    def record(self, data: Any, metadata: Mapping[str, Any] | None = None, **kwargs: Any) -> Any:
        """Ingest raw interaction data and assign metadata tags (`kind=`, `timestamp=` accepted)."""
        kind = kwargs.get("kind", "other")
        return self.append_record(data, kind, kwargs.get("timestamp"), metadata)

    def select(self, context_query: Any, **kwargs: Any) -> Any:
        """Retrieve records relevant to the context: a MemoryQuery, a mapping of its fields,
        a text, or None (the newest first); keyword arguments override query fields."""
        if isinstance(context_query, MemoryQuery) or context_query is None:
            return self.store.query(context_query, **kwargs)
        if isinstance(context_query, str):
            return self.store.query(None, text=context_query, **kwargs)
        if isinstance(context_query, Mapping):
            return self.store.query(None, **{**context_query, **kwargs})
        raise ConfigError(
            f"context_query of type {type(context_query).__name__} is not supported; "
            "pass a MemoryQuery, a mapping of its fields, a str or None"
        )

    def compress(self, _memory_items: Any, **kwargs: Any) -> Any:
        """Distill selected memories to reduce dimensionality or token count."""
        raise NotImplementedError(f"{type(self).__name__}.compress is not defined; override it")

    def process(self, _refined_data: Any, _target_format: str = "kv_cache", **kwargs: Any) -> Any:
        """Convert refined memories into a model-ready format such as KV cache."""
        raise NotImplementedError(f"{type(self).__name__}.process is not defined; override it")

    def manage(self, **kwargs: Any) -> Any:
        """Maintain the memory lifecycle; the default evicts oldest records over capacity."""
        return self.store.evict()
