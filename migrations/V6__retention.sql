-- Retention (DESIGN.md, "Retention"): the indexes the hourly pass relies on, so that no
-- pass reads notification_intents or notification_payloads from end to end.
--
-- On a large existing table build them first by hand, without blocking writes, and this
-- migration then finds them in place:
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS notification_payloads_unpurged_idx ...;
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS notification_intents_payload_digest_idx ...;

-- Payloads whose body is still held, oldest first: the body purge walks it (keyset on
-- created_at, digest) and purged rows leave it.
CREATE INDEX IF NOT EXISTS notification_payloads_unpurged_idx
    ON notification_payloads (created_at, digest) WHERE body_purged_at IS NULL;

-- "Which intents reference this digest": the purge's guard (no non-terminal intent may
-- reference a body it purges) and the deletion of payloads no intent references. HASH: an
-- entry holds a 4-byte hash code instead of the 64-character hex text a btree would copy
-- (measured in the README, "Retention"); WAL-logged and crash-safe since PostgreSQL 10.
CREATE INDEX IF NOT EXISTS notification_intents_payload_digest_idx
    ON notification_intents USING hash (payload_digest);
