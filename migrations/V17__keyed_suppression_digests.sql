-- The suppression list's digests become keyed (issue 43). Until now an entry named its
-- destination by SHA-256 of a public prefix and the address (V8): whoever could read the
-- list and held a list of addresses could tell who was on it. New entries carry an
-- HMAC-SHA-256 keyed with `suppression.key` (herald-store's `destination`), computed by
-- Herald, never here: the key is not a statement parameter (a slow statement's parameters
-- reach the server's log).
--
-- digest_version 1: an entry made before this migration (herald_destination_digest, kept
-- for them); 2: keyed, digest_key naming the key (its id, not the key). Ingest and the
-- reconcile role match both while version 1 entries remain; retention re-keys them from
-- the addresses of the sellers table.
--
-- Adding a column with a constant default rewrites nothing. The default stays: an
-- instance of the previous version, still running during a rolling upgrade, inserts
-- without naming the column and writes an unkeyed entry (matched, then re-keyed).
-- Herald's own inserts name the version they write.
ALTER TABLE suppressions ADD COLUMN IF NOT EXISTS digest_version smallint NOT NULL DEFAULT 1;
ALTER TABLE suppressions ADD COLUMN IF NOT EXISTS digest_key text;
ALTER TABLE suppressions ADD CONSTRAINT suppressions_digest_version
    CHECK (digest_version IN (1, 2) AND (digest_version = 2) = (digest_key IS NOT NULL));

-- Retention's re-keying and the gauge of entries left unkeyed: live version 1 entries.
CREATE INDEX IF NOT EXISTS suppressions_unkeyed_idx ON suppressions (id)
    WHERE digest_version = 1 AND lifted_at IS NULL;

-- A purged payload's destination digest (V16) is version 1 when the purge ran before this
-- migration, keyed (version 2) after it; the reconcile role compares an event's address
-- with both.

-- The key the list is keyed with, recorded by the first instance that uses one (its id,
-- not the key): an instance or a retention run with another key refuses to work, before
-- the list holds a single keyed entry (`Store::check_destination_key`).
CREATE TABLE IF NOT EXISTS suppression_key (
    singleton   boolean     NOT NULL DEFAULT true,
    key_id      text        NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT suppression_key_pkey PRIMARY KEY (singleton),
    CONSTRAINT suppression_key_singleton CHECK (singleton)
);
