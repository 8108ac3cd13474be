-- Documents kept as evidence hold personal data (addresses, phone numbers, order details):
-- the offending event of a fingerprint conflict, the offending request of a reused
-- Idempotency-Key, the body of a queue message the reconcile role refused. Like payload
-- bodies (V6), they are purged after a window of their own ([retention]
-- conflict_document_days, reject_body_days) while the row stays: its fingerprints, ids,
-- reason and times remain the record that something was refused, and when.
--
-- Dropping NOT NULL and adding nullable columns rewrites nothing; each ALTER takes a
-- moment's ACCESS EXCLUSIVE lock on a table only ingest's conflicts, HTTP ingest's
-- mismatches and the reconcile role's rejects write.
ALTER TABLE intent_conflicts ALTER COLUMN offending_event DROP NOT NULL;
ALTER TABLE intent_conflicts ADD COLUMN IF NOT EXISTS document_purged_at timestamptz;
ALTER TABLE intent_conflicts ADD CONSTRAINT intent_conflicts_purged_or_kept
    CHECK ((offending_event IS NULL) = (document_purged_at IS NOT NULL)) NOT VALID;
-- The purge's candidates, oldest first: documents still there.
CREATE INDEX IF NOT EXISTS intent_conflicts_document_idx
    ON intent_conflicts (detected_at) WHERE offending_event IS NOT NULL;

ALTER TABLE http_request_mismatches ALTER COLUMN offending_request DROP NOT NULL;
ALTER TABLE http_request_mismatches ADD COLUMN IF NOT EXISTS document_purged_at timestamptz;
ALTER TABLE http_request_mismatches ADD CONSTRAINT http_request_mismatches_purged_or_kept
    CHECK ((offending_request IS NULL) = (document_purged_at IS NOT NULL)) NOT VALID;
CREATE INDEX IF NOT EXISTS http_request_mismatches_document_idx
    ON http_request_mismatches (detected_at) WHERE offending_request IS NOT NULL;

ALTER TABLE provider_event_rejects ALTER COLUMN body_prefix DROP NOT NULL;
ALTER TABLE provider_event_rejects ADD COLUMN IF NOT EXISTS body_purged_at timestamptz;
ALTER TABLE provider_event_rejects ADD CONSTRAINT provider_event_rejects_purged_or_kept
    CHECK ((body_prefix IS NULL) = (body_purged_at IS NOT NULL)) NOT VALID;
CREATE INDEX IF NOT EXISTS provider_event_rejects_body_idx
    ON provider_event_rejects (received_at) WHERE body_prefix IS NOT NULL;
