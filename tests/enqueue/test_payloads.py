"""Payload size: the ``MAX_PAYLOAD_BYTES`` limit at enqueue, big payloads that fit, and bulk
enqueues whose wake-up notifications stay tiny (case C24)."""

import hashlib
import json

import pytest
from django.conf import settings
from django.db import transaction
from django.test import override_settings

from django_leasequeue import enqueue, enqueue_many, enqueue_on_commit
from django_leasequeue.conf import build
from django_leasequeue.exceptions import ConfigurationError, PayloadTooLarge
from django_leasequeue.models import Job
from django_leasequeue.notify import listen_connection
from tests.support import claim, run_claimed

MIB = 1024 * 1024


def blob_for(total: int) -> str:
    """A string whose job, enqueued as ``qa.digest(blob=...)``, encodes to exactly ``total`` bytes
    (args ``[]`` plus kwargs ``{"blob":"..."}``)."""
    overhead = len("[]") + len('{"blob":""}')
    return "x" * (total - overhead)


@pytest.mark.django_db
def test_payload_at_the_default_limit_is_accepted_one_byte_more_is_refused():
    assert enqueue("qa.digest", kwargs={"blob": blob_for(MIB)}).id
    with pytest.raises(PayloadTooLarge) as refused:
        enqueue("qa.digest", kwargs={"blob": blob_for(MIB + 1)})
    assert str(refused.value).startswith(f"job arguments are {MIB + 1} bytes, over LEASEQUEUE['MAX_PAYLOAD_BYTES'] "
                                         f"= {MIB}")
    assert Job.objects.count() == 1
    # Counted in encoded bytes, not characters: 2-byte characters reach the limit at half the length.
    with pytest.raises(PayloadTooLarge):
        enqueue("qa.digest", kwargs={"blob": "é" * (MIB // 2)})


@pytest.mark.django_db
def test_bulk_and_on_commit_enqueues_refuse_an_oversized_job_before_writing_anything():
    items = [([], {"blob": "small"}) for _ in range(50)] + [([], {"blob": blob_for(MIB + 10)})]
    with pytest.raises(PayloadTooLarge):
        enqueue_many("qa.digest", items)
    with transaction.atomic(), pytest.raises(PayloadTooLarge):
        enqueue_on_commit("qa.digest", kwargs={"blob": blob_for(2 * MIB)})  # refused at the call, not at commit
    assert Job.objects.count() == 0


@pytest.mark.django_db
def test_max_payload_bytes_is_configurable_and_zero_disables_it():
    with override_settings(LEASEQUEUE={**settings.LEASEQUEUE, "MAX_PAYLOAD_BYTES": 100}):
        enqueue("qa.digest", kwargs={"blob": blob_for(100)})
        with pytest.raises(PayloadTooLarge, match="101 bytes, over LEASEQUEUE\\['MAX_PAYLOAD_BYTES'\\] = 100"):
            enqueue("qa.digest", kwargs={"blob": blob_for(101)})
    with override_settings(LEASEQUEUE={**settings.LEASEQUEUE, "MAX_PAYLOAD_BYTES": 0}):
        enqueue("qa.digest", kwargs={"blob": blob_for(2 * MIB)})
    assert Job.objects.count() == 2
    for bad in (-1, "1MB", 1.5, True):
        with pytest.raises(ConfigurationError, match="MAX_PAYLOAD_BYTES"):
            build({"MAX_PAYLOAD_BYTES": bad})


@pytest.mark.django_db
def test_framework_task_with_an_oversized_argument_is_refused_at_enqueue():
    from tests.backends import fw_tasks

    with pytest.raises(PayloadTooLarge):
        fw_tasks.add.enqueue("x" * (MIB + 1), 1)
    assert Job.objects.count() == 0


@pytest.mark.django_db
def test_c24_one_megabyte_payload_runs_with_its_arguments_intact():
    blob = "".join(chr(0x41 + i % 26) for i in range(1_000_000))
    items = [{"n": i, "nested": {"k": [i, None, True]}} for i in range(1000)]
    job = enqueue("qa.digest", kwargs={"blob": blob, "items": items})
    assert len(json.dumps(job.kwargs, separators=(",", ":")).encode()) < MIB
    (claimed,) = claim()
    assert claimed.kwargs == {"blob": blob, "items": items}
    assert run_claimed(claimed) == "done"
    job.refresh_from_db()
    assert (job.status, job.result) == ("done", {"len": 1_000_000, "sha256": hashlib.sha256(blob.encode()).hexdigest(),
                                                 "items": 1000})


@pytest.mark.django_db(transaction=True)
def test_c24_five_thousand_jobs_in_one_transaction_wake_workers_with_tiny_notifications():
    """Enqueue 5,000 jobs and a 1 MB job in one transaction: the notifications carry only queue
    names, one per queue (PostgreSQL folds identical ones), and arrive only at commit."""
    channel = "leasequeue"
    listener = listen_connection("default", channel)
    try:
        with transaction.atomic():
            assert enqueue_many("qa.digest", [([], {"blob": f"j{i}"}) for i in range(5000)]) == 5000
            enqueue("qa.digest", kwargs={"blob": blob_for(MIB - 100)})
            for i in range(20):
                enqueue("qa.digest", kwargs={"blob": f"other {i}"}, queue="invoices")
            assert list(listener.notifies(timeout=0.3)) == []  # nothing before the commit
        notes = list(listener.notifies(timeout=1.0))
    finally:
        listener.close()
    assert sorted((n.channel, n.payload) for n in notes) == [(channel, "default"), (channel, "invoices")]
    assert Job.objects.count() == 5021
