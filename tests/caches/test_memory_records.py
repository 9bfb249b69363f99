"""Memory records: store bounds and eviction order, latest, top-k ranking, BaseMemory template."""

from __future__ import annotations

from typing import Any

import pytest

from flextensor_runtime import BaseMemory, MemoryQuery, MemoryRecord, MemoryStore
from flextensor_runtime.errors import ConfigError


def test_append_defaults_timestamp_to_length_and_returns_the_stored_dict() -> None:
    store = MemoryStore()
    a = store.append("door opened", kind="text")
    b = store.append("frame", kind="image", metadata={"cam": 1}, score=0.5)
    assert a == {"content": "door opened", "kind": "text", "timestamp": 0, "metadata": {},
                 "score": None}  # fmt: skip
    assert b["timestamp"] == 1 and b["metadata"] == {"cam": 1}
    assert store.records == [a, b] and store.records[1] is b and len(store) == 2


def test_oldest_first_eviction_at_capacity() -> None:
    store = MemoryStore(capacity=3)
    for i in range(5):
        store.append(f"obs {i}", timestamp=100 - i)  # timestamps decrease: order is insertion
    assert [r["content"] for r in store] == ["obs 2", "obs 3", "obs 4"]


def test_constructor_records_and_replace_keep_newest_within_capacity() -> None:
    records = [MemoryRecord(f"r{i}") for i in range(4)]
    store = MemoryStore(capacity=2, records=records)
    assert [r["content"] for r in store] == ["r2", "r3"]
    live = store.records
    store.replace([{"content": "x"}])
    assert live is store.records and live == [
        {"content": "x", "kind": "other", "metadata": {}, "score": None, "timestamp": 0}
    ]


def test_evict_is_a_noop_when_unbounded_and_returns_dropped_records() -> None:
    store = MemoryStore(records=[{"content": i} for i in range(3)])
    assert store.evict() == [] and len(store) == 3
    bounded = MemoryStore(capacity=2)
    bounded.records.extend({"content": i, "kind": "other", "timestamp": i, "metadata": {}}
                           for i in range(4))  # fmt: skip
    assert [r["content"] for r in bounded.evict()] == [0, 1]
    assert [r["content"] for r in bounded] == [2, 3]


def test_latest_prefers_type_and_filters_metadata() -> None:
    store = MemoryStore()
    store.append("a", kind="text", metadata={"agent": 1})
    store.append("b", kind="image", metadata={"agent": 1})
    store.append("c", kind="text", metadata={"agent": 2})
    store.append("d", kind="image", timestamp=-5, metadata={"agent": 2})
    assert store.latest()["content"] == "c"  # d is older by timestamp
    assert store.latest(prefer_type="image")["content"] == "b"
    assert store.latest(prefer_type="text", metadata={"agent": 1})["content"] == "a"
    assert store.latest(prefer_type="audio")["content"] == "c"  # falls back to any kind
    assert store.latest(metadata={"agent": 3}) is None
    assert MemoryStore().latest() is None


def test_query_top_k_order_by_score_then_recency() -> None:
    store = MemoryStore()
    store.append("low", score=0.1)
    store.append("none")
    store.append("high", score=0.9)
    store.append("mid-old", score=0.5, timestamp=1)
    store.append("mid-new", score=0.5, timestamp=10)
    got = [r["content"] for r in store.query(MemoryQuery(top_k=4))]
    assert got == ["high", "mid-new", "mid-old", "low"]
    assert [r["content"] for r in store.query(top_k=None)][-1] == "none"
    assert [r["content"] for r in store.query(min_score=0.5, top_k=None)] == [
        "high", "mid-new", "mid-old"]  # fmt: skip


def test_query_filters_and_text_relevance() -> None:
    store = MemoryStore()
    store.append("red door on the left", kind="text", metadata={"room": "hall"})
    store.append("blue door", kind="text", metadata={"room": "hall"})
    store.append("red car", kind="text", metadata={"room": "garage"})
    store.append("red door", kind="image")
    got = store.query(text="red door", kind="text", top_k=3)
    assert [r["content"] for r in got] == ["red door on the left", "red car", "blue door"]
    assert [r["content"] for r in store.query(metadata={"room": "garage"})] == ["red car"]
    assert [r["content"] for r in store.query(since=1, until=2, top_k=None)] == [
        "red car", "blue door"]  # fmt: skip
    assert store.query(text="submarine") == []


def test_query_and_record_validation() -> None:
    store = MemoryStore()
    with pytest.raises(ConfigError, match="not all MemoryQuery fields"):
        store.query(topk=3)
    with pytest.raises(ConfigError, match="top_k"):
        MemoryQuery(top_k=-1)
    with pytest.raises(ConfigError, match="lacks 'content'"):
        store.add({"kind": "text"})
    with pytest.raises(ConfigError, match="capacity=0"):
        MemoryStore(capacity=0)


class CaptionMemory(BaseMemory):
    """A concrete memory: keeps captions, compresses by joining, processes to a prompt."""

    def compress(self, _memory_items: Any, **kwargs: Any) -> str:
        return " / ".join(r["content"] for r in _memory_items)

    def process(self, _refined_data: Any, _target_format: str = "kv_cache", **kwargs: Any) -> Any:
        return {"format": _target_format, "prompt": _refined_data}


def test_base_memory_five_stage_pipeline() -> None:
    memory = CaptionMemory(capacity=3, model="tiny")
    assert memory.config == {"model": "tiny"}
    for i, text in enumerate(["cat sits", "dog runs", "cat jumps", "bird sings"]):
        memory.record(text, metadata={"t": i}, kind="text")
    assert memory.manage() == []  # already bounded on append
    assert [r["content"] for r in memory.records] == ["dog runs", "cat jumps", "bird sings"]
    picked = memory.select("cat", top_k=2)
    assert [r["content"] for r in picked] == ["cat jumps"]
    assert memory.process(memory.compress(memory.select(None)), "prompt") == {
        "format": "prompt", "prompt": "bird sings / cat jumps / dog runs"}  # fmt: skip
    assert [r["content"] for r in memory.select({"metadata": {"t": 1}})] == ["dog runs"]


def test_base_memory_records_schema_and_helpers() -> None:
    memory = BaseMemory(capacity=2)
    live = memory.records
    rec = memory.append_record("frame-0", kind="image", metadata={"cam": 0})
    assert live == [rec] and memory.latest_record("image") is rec
    memory.replace_records([{"content": i} for i in range(5)])
    assert memory.records is live and [r["content"] for r in live] == [3, 4]
    assert memory.store.capacity == 2
    schema = memory.schema()
    assert schema["required_keys"] == ["content", "kind", "timestamp", "metadata"]
    assert "image" in schema["content_types"]
    with pytest.raises(ConfigError, match="not a content type"):
        memory.append_record("x", kind="smell")
    with pytest.raises(NotImplementedError, match="compress"):
        memory.compress([])
    with pytest.raises(NotImplementedError, match="process"):
        memory.process([])
    with pytest.raises(ConfigError, match="not supported"):
        memory.select(42)


def test_memory_records_do_not_import_torch() -> None:
    import subprocess
    import sys

    code = "import flextensor_runtime.memory_records, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"score": "hi"}, "score='hi'"), ({"timestamp": "now"}, "timestamp='now'"),
     ({"metadata": [1]}, "metadata=\\[1\\]")],
)  # fmt: skip
def test_bad_record_fields_are_rejected_before_they_break_ranking(kwargs, message) -> None:
    store = MemoryStore()
    store.append("a", score=0.5)
    with pytest.raises(ConfigError, match=message):
        store.append("b", **kwargs)
    with pytest.raises(ConfigError, match="memory record of type int"):
        store.add(5)  # type: ignore[arg-type]
    assert [r["content"] for r in store.query(top_k=None)] == ["a"]


def test_bad_query_fields_and_objects_are_config_errors() -> None:
    store = MemoryStore(records=[{"content": "door"}])
    with pytest.raises(ConfigError, match="text=5 is invalid"):
        store.query(text=5)
    with pytest.raises(ConfigError, match="metadata=\\[1\\] is invalid"):
        MemoryQuery(metadata=[1])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="query of type str is invalid"):
        store.query("door")  # type: ignore[arg-type]


def test_latest_with_non_mapping_metadata_is_a_config_error() -> None:
    store = MemoryStore(records=[{"content": "a"}])
    with pytest.raises(ConfigError, match=r"latest metadata=\[1\] is invalid"):
        store.latest(metadata=[1])  # type: ignore[arg-type]


def test_failed_replace_keeps_the_previous_records() -> None:
    store = MemoryStore(records=[{"content": "keep"}])
    with pytest.raises(ConfigError, match="lacks 'content'"):
        store.replace([{"content": "a"}, {"nocontent": 1}])
    assert [r["content"] for r in store.records] == ["keep"]
    with pytest.raises(ConfigError, match="records of type int are invalid"):
        store.replace(5)  # type: ignore[arg-type]
    assert [r["content"] for r in store.records] == ["keep"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"timestamp": float("nan")}, "timestamp=nan"), ({"score": float("nan")}, "score=nan"),
     ({"kind": 3}, "kind=3"), ({"metadata": [1]}, "metadata=\\[1\\]")],
)  # fmt: skip
def test_a_record_is_checked_when_made_as_when_added(kwargs, message) -> None:
    """`MemoryRecord(timestamp=nan)` used to be made, and only `MemoryStore.add` refused it."""
    with pytest.raises(ConfigError, match=message + ".* is invalid"):
        MemoryRecord("a", **kwargs)
    assert MemoryRecord("a", timestamp=3, score=0.5).to_dict()["timestamp"] == 3


def test_replace_with_the_stores_own_records_keeps_them() -> None:
    """`replace` cleared the live list before reading its argument, so a filter over the
    store's own records (or the records themselves) emptied the store."""
    store = MemoryStore()
    for i, kind in enumerate(["text", "image", "text", "action"]):
        store.append(f"item {i}", kind=kind)
    live = store.records
    store.replace(r for r in store.records if r["kind"] != "text")
    assert [r["content"] for r in store] == ["item 1", "item 3"] and store.records is live
    store.replace(store.records)
    assert [r["content"] for r in store] == ["item 1", "item 3"] and store.records is live
    memory = BaseMemory()
    memory.record("x", kind="text")
    memory.record("y", kind="image")
    memory.replace_records(memory.records)
    assert [r["content"] for r in memory.records] == ["x", "y"]


def test_default_timestamps_keep_increasing_past_capacity() -> None:
    """The default timestamp (the length) counts evicted records: it used to repeat once the
    store was full, so `since=` missed the newest records."""
    store = MemoryStore(capacity=2)
    for i in range(5):
        store.append(f"e{i}")
    assert [(r["content"], r["timestamp"]) for r in store] == [("e3", 3), ("e4", 4)]
    assert [r["content"] for r in store.query(since=3)] == ["e4", "e3"]
    store.replace([{"content": "fresh"}])  # a replaced store counts from its new records
    assert store.append("next")["timestamp"] == 1
    unbounded = MemoryStore()
    assert [unbounded.append(i)["timestamp"] for i in range(3)] == [0, 1, 2]


def test_failed_replace_keeps_the_eviction_count() -> None:
    store = MemoryStore(capacity=1)
    for i in range(3):
        store.append(i)
    with pytest.raises(ConfigError, match="lacks 'content'"):
        store.replace([{"content": "a"}, {"content": "b"}, {"nocontent": 1}])
    assert store.append("next")["timestamp"] == 3


def test_metadata_filters_compare_array_values_whole() -> None:
    """Tensor metadata (a camera pose) made every metadata filter on that key raise torch's
    "Boolean value of Tensor with more than one value is ambiguous"."""
    import numpy as np
    import torch

    store = MemoryStore()
    a = store.append(
        "left", metadata={"pose": torch.tensor([1.0, 2.0, 3.0]), "step": torch.tensor(4)}
    )
    b = store.append("right", metadata={"pose": torch.tensor([1.0, 2.0, 4.0]), "step": 5})
    c = store.append("latent", metadata={"pose": np.zeros(3)})
    assert store.query(metadata={"pose": torch.tensor([1.0, 2.0, 3.0])}) == [a]
    assert store.query(metadata={"pose": torch.tensor([1.0, 2.0])}) == []  # no broadcasting
    assert store.query(metadata={"pose": np.zeros(3)}) == [c]
    assert store.latest(metadata={"pose": torch.tensor([1.0, 2.0, 4.0])}) is b
    assert store.query(metadata={"step": 4}) == [a]  # a one-element tensor equals its number
    assert store.query(metadata={"pose": 1.0}) == []


def test_records_added_through_the_live_list_are_read_leniently() -> None:
    """`records` is the live list, so code may append plain dicts to it; latest(prefer_type=)
    raised KeyError on one without 'kind', and a text query on one without 'content'."""
    store = MemoryStore()
    kept = store.append("door opened", kind="text")
    store.records.append({"timestamp": 5, "metadata": {}})
    assert store.latest(prefer_type="text") is kept
    assert store.query(text="door") == [kept]


def test_text_queries_match_words_next_to_punctuation() -> None:
    """Words were split on spaces only, so "opened." never matched the query "opened"."""
    store = MemoryStore()
    caption = store.append("The door opened, slowly.", kind="text")
    store.append("a window", kind="text")
    assert store.query(text="opened") == [caption]
    assert store.query(text="Door slowly!") == [caption]
