"""The adapter registry record: versions, what new jobs get, rollback as an undo stack."""

from __future__ import annotations

from tokenq.shared.lora_registry import AdapterRecord


def test_rollback_undoes_loads_and_unloads_in_order() -> None:
    rec = AdapterRecord(name="a", base="m", engine="llama", status="unloaded", current=None)
    assert rec.ref() is None and not rec.rollback()
    rec.load(1, "/v1")
    rec.load(2, "/v2")
    ref = rec.ref()
    assert ref is not None and (ref.id, ref.path) == (2, "/v2")
    rec.unload()
    assert rec.ref() is None  # unloaded: new jobs cannot name it
    assert rec.rollback()  # undo the unload: v2 again
    ref = rec.ref()
    assert ref is not None and ref.id == 2
    assert rec.rollback()  # undo the v2 load: v1
    ref = rec.ref()
    assert ref is not None and (ref.id, ref.path) == (1, "/v1")
    assert rec.rollback()  # undo the first load: nothing served
    assert rec.ref() is None and rec.status == "unloaded" and not rec.rollback()
    assert [v.id for v in rec.versions] == [1, 2]  # the history of versions is kept


def test_record_round_trips_through_json() -> None:
    rec = AdapterRecord(name="a", base="m", engine="vllm", status="unloaded", current=None)
    rec.load(7, "/p")
    rec.unload()
    again = AdapterRecord.model_validate_json(rec.model_dump_json())
    assert again == rec and again.rollback() and again.ref() is not None
