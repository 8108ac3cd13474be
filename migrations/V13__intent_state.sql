-- The intent's moving parts in a table of their own (issue 19, BENCHMARKS.md).
--
-- A claim and a record each move an intent's state. `state` is in the predicates of the
-- live intents' partial indexes, so neither update could be HOT: each wrote a new version
-- of the whole frozen row (subject, bodies' digest, trace context, source: about 700
-- bytes) and a new entry in every index of the table, the business key's four-column btree
-- and the payload digest's hash among them. Now:
--
--   intent_contents  what is frozen when the intent is created (or, for a held intent,
--                    when its profile arrives or its wait runs out), never changed after;
--   intent_states    the state, the attempt counters, the due time and the lease: one
--                    narrow row per intent, the only row claim, record, the lease and
--                    silence sweeps and evidence write (a held intent's release or expiry
--                    also writes its decision on the contents), with the partial indexes
--                    of live intents, expired leases and `unknown` intents awaiting
--                    evidence.
--
-- `notification_intents` is now a view joining the two, column for column what the table
-- was: what inspection, retention's reads, operators' queries and the tests read. Writing
-- through it works row by row (INSTEAD OF triggers, for operators and tests; not
-- `INSERT ... ON CONFLICT`); Herald's own statements write and lock the tables. A broken
-- invariant found by a deferred check is reported at COMMIT, not at the statement.
--
-- The checks that tied `state` to the frozen decision span the two tables now. They are
-- triggers under the old constraints' names, raising check_violation:
--   notification_intents_frozen_unless_held     exactly the held intents lack a payload;
--   notification_intents_suppressed_iff_no_consent  a delivering intent is suppressed iff
--                                                its consent is not granted;
--   notification_intents_both_rows              every intent has both rows;
--   intent_contents_frozen                      a frozen decision never changes.
-- They run only where the invariants can break: once per inserting statement, on a change
-- of state into or out of `awaiting_profile`, `suppressed` or `observed`, and on a change
-- of the frozen columns. Claims and records pay nothing for them.
--
-- On a large ledger this migration copies every intent's state into intent_states under an
-- ACCESS EXCLUSIVE lock on the intents: run `herald migrate` with ingest and delivery
-- stopped. Dropping the columns rewrites nothing; the existing rows keep their bytes until
-- the table is rewritten (VACUUM FULL, or pg_repack without the lock).

ALTER TABLE notification_intents RENAME TO intent_contents;

CREATE TABLE intent_states (
    intent_id        uuid        NOT NULL,
    state            text        NOT NULL,
    attempt_count    integer     NOT NULL DEFAULT 0,
    unsent_attempts  integer     NOT NULL DEFAULT 0,
    had_unknown      boolean     NOT NULL DEFAULT false,
    next_attempt_at  timestamptz,
    lease_owner      text,
    lease_until      timestamptz,
    lease_attempt_id uuid,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    -- No foreign key to intent_contents: its check would run once per new intent, row by
    -- row, and lock the contents row (ingest measured 8% slower with it). Both rows are
    -- inserted by one statement, checked at its end, and deleted by one statement.
    CONSTRAINT intent_states_pkey PRIMARY KEY (intent_id),
    CONSTRAINT notification_intents_state_check CHECK (state IN
        ('pending', 'sending', 'accepted', 'rejected', 'retry_scheduled', 'unknown', 'failed', 'suppressed',
         'awaiting_profile', 'observed')),
    CONSTRAINT notification_intents_attempt_count_check CHECK (attempt_count >= 0),
    CONSTRAINT notification_intents_unsent_attempts_check CHECK (unsent_attempts >= 0),
    -- Never due: nothing claims an observed intent.
    CONSTRAINT notification_intents_observed_never_due CHECK (state <> 'observed' OR next_attempt_at IS NULL)
);

INSERT INTO intent_states (intent_id, state, attempt_count, unsent_attempts, had_unknown, next_attempt_at,
                           lease_owner, lease_until, lease_attempt_id, updated_at)
SELECT id, state, attempt_count, unsent_attempts, had_unknown, next_attempt_at,
       lease_owner, lease_until, lease_attempt_id, updated_at
  FROM intent_contents;

-- The three partial indexes go with the columns they index (DROP COLUMN drops them), under
-- their old names.
ALTER TABLE intent_contents
    DROP CONSTRAINT notification_intents_frozen_unless_held,
    DROP CONSTRAINT notification_intents_suppressed_iff_no_consent,
    DROP CONSTRAINT notification_intents_observed_never_due,
    DROP CONSTRAINT notification_intents_state_check,
    DROP CONSTRAINT notification_intents_attempt_count_check,
    DROP CONSTRAINT notification_intents_unsent_attempts_check,
    DROP COLUMN state,
    DROP COLUMN attempt_count,
    DROP COLUMN unsent_attempts,
    DROP COLUMN had_unknown,
    DROP COLUMN next_attempt_at,
    DROP COLUMN lease_owner,
    DROP COLUMN lease_until,
    DROP COLUMN lease_attempt_id,
    DROP COLUMN updated_at,
    -- The frozen decision is all there or all missing (held).
    ADD CONSTRAINT intent_contents_decided_together CHECK (
        (payload_digest IS NULL) = (template_revision IS NULL)
        AND (payload_digest IS NULL) = (consent IS NULL));

-- Live intents (the stranded sweep, inspection).
CREATE INDEX notification_intents_state_idx ON intent_states (state)
    WHERE state NOT IN ('accepted', 'rejected', 'failed', 'suppressed', 'observed');
-- Intents whose worker may have died: state 'sending' with an expired lease.
CREATE INDEX notification_intents_sending_lease_idx ON intent_states (lease_until) WHERE state = 'sending';
-- `unknown` intents waiting for evidence: next_attempt_at is when the silence window ends.
CREATE INDEX notification_intents_awaiting_evidence_idx ON intent_states (next_attempt_at)
    WHERE state = 'unknown' AND next_attempt_at IS NOT NULL;

CREATE VIEW notification_intents AS
SELECT c.id, c.marketplace_id, c.order_id, c.event_kind, c.channel, c.idempotency_key, c.request_fingerprint,
       c.seller_id, c.template, c.template_revision, c.payload_digest, c.consent, s.state, s.attempt_count,
       s.next_attempt_at, s.lease_owner, s.lease_until, c.trace_context, c.event_id, c.occurred_at,
       c.source_topic, c.source_partition, c.source_offset, c.created_at, s.updated_at, s.lease_attempt_id,
       s.unsent_attempts, s.had_unknown
  FROM intent_contents c
  JOIN intent_states s ON s.intent_id = c.id;

-- Whether an intent keeps the invariants (`state` NULL: it has no state row): exactly the
-- held intents lack their frozen decision; a delivering intent is suppressed exactly when
-- its consent is not granted (an observed one keeps whatever it was frozen with).
CREATE FUNCTION herald_intent_holds_together(state text, consent text, payload_digest text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN state IS NOT NULL
       AND (state = 'awaiting_profile') = (payload_digest IS NULL)
       AND (state IN ('observed', 'awaiting_profile') OR (consent = 'granted') = (state <> 'suppressed'));

-- Raises check_violation under the name of the constraint the intent breaks.
CREATE FUNCTION herald_refuse_intent(id uuid, state text, consent text, payload_digest text) RETURNS void
    LANGUAGE plpgsql AS $$
BEGIN
    IF state IS NULL THEN
        RAISE EXCEPTION 'intent % has no state row', id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'notification_intents_both_rows',
                  TABLE = 'intent_states';
    ELSIF (state = 'awaiting_profile') <> (payload_digest IS NULL) THEN
        RAISE EXCEPTION 'intent % in state % with payload %: only a held intent lacks its payload',
                        id, state, coalesce(payload_digest, 'none')
            USING ERRCODE = 'check_violation', CONSTRAINT = 'notification_intents_frozen_unless_held',
                  TABLE = 'intent_states';
    ELSE
        RAISE EXCEPTION 'intent % in state % with consent %: suppressed exactly when consent is not granted',
                        id, state, coalesce(consent, 'none')
            USING ERRCODE = 'check_violation', CONSTRAINT = 'notification_intents_suppressed_iff_no_consent',
                  TABLE = 'intent_states';
    END IF;
END
$$;

-- The invariants of the intents `ids`, which must exist.
CREATE FUNCTION herald_check_intents(ids uuid[]) RETURNS void
    LANGUAGE plpgsql AS $$
DECLARE
    bad record;
BEGIN
    SELECT c.id, s.state, c.consent, c.payload_digest INTO bad
      FROM intent_contents c LEFT JOIN intent_states s ON s.intent_id = c.id
     WHERE c.id = ANY (ids) AND herald_intent_holds_together(s.state, c.consent, c.payload_digest) IS NOT TRUE
     LIMIT 1;
    IF FOUND THEN
        PERFORM herald_refuse_intent(bad.id, bad.state, bad.consent, bad.payload_digest);
    END IF;
END
$$;

-- New intents: once per statement, at its end (both rows are inserted by one statement),
-- reading the new contents from the statement's own rows: one probe of intent_states each.
CREATE FUNCTION herald_check_new_intents() RETURNS trigger
    LANGUAGE plpgsql AS $$
DECLARE
    bad record;
BEGIN
    SELECT c.id, s.state, c.consent, c.payload_digest INTO bad
      FROM new_intents c LEFT JOIN intent_states s ON s.intent_id = c.id
     WHERE herald_intent_holds_together(s.state, c.consent, c.payload_digest) IS NOT TRUE
     LIMIT 1;
    IF FOUND THEN
        PERFORM herald_refuse_intent(bad.id, bad.state, bad.consent, bad.payload_digest);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER intent_contents_checked AFTER INSERT ON intent_contents
    REFERENCING NEW TABLE AS new_intents FOR EACH STATEMENT EXECUTE FUNCTION herald_check_new_intents();

-- The two rows of an intent go together (one statement deletes both), and a state row
-- never moves to another intent.
CREATE FUNCTION herald_check_removed_rows() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'intent_states' THEN
        IF EXISTS (SELECT 1 FROM gone g JOIN intent_contents c ON c.id = g.intent_id) THEN
            RAISE EXCEPTION 'an intent''s state row is deleted while the intent stays'
                USING ERRCODE = 'check_violation', CONSTRAINT = 'notification_intents_both_rows',
                      TABLE = 'intent_states';
        END IF;
    ELSIF EXISTS (SELECT 1 FROM gone g JOIN intent_states s ON s.intent_id = g.id) THEN
        RAISE EXCEPTION 'an intent is deleted while its state row stays'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'notification_intents_both_rows',
                  TABLE = 'intent_contents';
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER intent_states_removed AFTER DELETE ON intent_states
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION herald_check_removed_rows();
CREATE TRIGGER intent_contents_removed AFTER DELETE ON intent_contents
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION herald_check_removed_rows();
CREATE FUNCTION herald_refuse_moved_state() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the state row of intent % cannot move to intent %', OLD.intent_id, NEW.intent_id
        USING ERRCODE = 'check_violation', CONSTRAINT = 'notification_intents_both_rows', TABLE = 'intent_states';
END
$$;
CREATE TRIGGER intent_states_kept BEFORE UPDATE OF intent_id ON intent_states FOR EACH ROW
    WHEN (OLD.intent_id IS DISTINCT FROM NEW.intent_id)
    EXECUTE FUNCTION herald_refuse_moved_state();

-- A change of state that could break an invariant (into or out of the states that do not
-- deliver), and a held intent's decision being frozen: checked at commit, when both rows
-- have their new values.
CREATE FUNCTION herald_check_changed_intent() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'intent_states' THEN
        PERFORM herald_check_intents(ARRAY[NEW.intent_id]);
    ELSE
        PERFORM herald_check_intents(ARRAY[NEW.id]);
    END IF;
    RETURN NULL;
END
$$;
CREATE CONSTRAINT TRIGGER intent_states_checked AFTER UPDATE OF state ON intent_states
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state
          AND (OLD.state IN ('awaiting_profile', 'suppressed', 'observed')
               OR NEW.state IN ('awaiting_profile', 'suppressed', 'observed')))
    EXECUTE FUNCTION herald_check_changed_intent();
CREATE CONSTRAINT TRIGGER intent_contents_decided AFTER UPDATE OF payload_digest, consent ON intent_contents
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN ((OLD.payload_digest, OLD.consent) IS DISTINCT FROM (NEW.payload_digest, NEW.consent))
    EXECUTE FUNCTION herald_check_changed_intent();

-- Once frozen, an intent's decision and its identity never change.
CREATE FUNCTION herald_refuse_refreeze() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'intent % is frozen: its content does not change', OLD.id
        USING ERRCODE = 'check_violation', CONSTRAINT = 'intent_contents_frozen', TABLE = 'intent_contents';
END
$$;
CREATE TRIGGER intent_contents_frozen BEFORE UPDATE ON intent_contents FOR EACH ROW
    WHEN ((OLD.id, OLD.marketplace_id, OLD.order_id, OLD.event_kind, OLD.channel, OLD.idempotency_key,
           OLD.request_fingerprint, OLD.seller_id, OLD.template)
              IS DISTINCT FROM
          (NEW.id, NEW.marketplace_id, NEW.order_id, NEW.event_kind, NEW.channel, NEW.idempotency_key,
           NEW.request_fingerprint, NEW.seller_id, NEW.template)
          OR (OLD.payload_digest IS NOT NULL
              AND (OLD.payload_digest, OLD.template_revision, OLD.consent)
                  IS DISTINCT FROM (NEW.payload_digest, NEW.template_revision, NEW.consent)))
    EXECUTE FUNCTION herald_refuse_refreeze();

-- Writing through the view, row by row: for operators' SQL and tests. Herald's own
-- statements write the tables. An insert writes both rows in one statement (the new
-- intents' check runs at its end).
CREATE FUNCTION herald_write_intent_view() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        WITH contents AS (
            INSERT INTO intent_contents (id, marketplace_id, order_id, event_kind, channel, idempotency_key,
                                         request_fingerprint, seller_id, template, template_revision,
                                         payload_digest, consent, trace_context, event_id, occurred_at,
                                         source_topic, source_partition, source_offset, created_at)
            VALUES (NEW.id, NEW.marketplace_id, NEW.order_id, NEW.event_kind, NEW.channel, NEW.idempotency_key,
                    NEW.request_fingerprint, NEW.seller_id, NEW.template, NEW.template_revision,
                    NEW.payload_digest, NEW.consent, NEW.trace_context, NEW.event_id, NEW.occurred_at,
                    NEW.source_topic, NEW.source_partition, NEW.source_offset, coalesce(NEW.created_at, now()))
            RETURNING id
        )
        INSERT INTO intent_states (intent_id, state, attempt_count, unsent_attempts, had_unknown, next_attempt_at,
                                   lease_owner, lease_until, lease_attempt_id, updated_at)
        SELECT id, NEW.state, coalesce(NEW.attempt_count, 0), coalesce(NEW.unsent_attempts, 0),
               coalesce(NEW.had_unknown, false), NEW.next_attempt_at, NEW.lease_owner, NEW.lease_until,
               NEW.lease_attempt_id, coalesce(NEW.updated_at, now())
          FROM contents;
        RETURN NEW;
    ELSIF TG_OP = 'UPDATE' THEN
        UPDATE intent_contents
           SET id = NEW.id, marketplace_id = NEW.marketplace_id, order_id = NEW.order_id,
               event_kind = NEW.event_kind, channel = NEW.channel, idempotency_key = NEW.idempotency_key,
               request_fingerprint = NEW.request_fingerprint, seller_id = NEW.seller_id, template = NEW.template,
               template_revision = NEW.template_revision, payload_digest = NEW.payload_digest,
               consent = NEW.consent, trace_context = NEW.trace_context, event_id = NEW.event_id,
               occurred_at = NEW.occurred_at, source_topic = NEW.source_topic,
               source_partition = NEW.source_partition, source_offset = NEW.source_offset,
               created_at = NEW.created_at
         WHERE id = OLD.id
           AND (id, marketplace_id, order_id, event_kind, channel, idempotency_key, request_fingerprint, seller_id,
                template, template_revision, payload_digest, consent, trace_context, event_id, occurred_at,
                source_topic, source_partition, source_offset, created_at)
               IS DISTINCT FROM
               (NEW.id, NEW.marketplace_id, NEW.order_id, NEW.event_kind, NEW.channel, NEW.idempotency_key,
                NEW.request_fingerprint, NEW.seller_id, NEW.template, NEW.template_revision, NEW.payload_digest,
                NEW.consent, NEW.trace_context, NEW.event_id, NEW.occurred_at, NEW.source_topic,
                NEW.source_partition, NEW.source_offset, NEW.created_at);
        UPDATE intent_states
           SET state = NEW.state, attempt_count = NEW.attempt_count, unsent_attempts = NEW.unsent_attempts,
               had_unknown = NEW.had_unknown, next_attempt_at = NEW.next_attempt_at, lease_owner = NEW.lease_owner,
               lease_until = NEW.lease_until, lease_attempt_id = NEW.lease_attempt_id, updated_at = NEW.updated_at
         WHERE intent_id = OLD.id;
        RETURN NEW;
    ELSE
        WITH state AS (DELETE FROM intent_states WHERE intent_id = OLD.id)
        DELETE FROM intent_contents WHERE id = OLD.id;
        RETURN OLD;
    END IF;
END
$$;
CREATE TRIGGER notification_intents_write INSTEAD OF INSERT OR UPDATE OR DELETE ON notification_intents
    FOR EACH ROW EXECUTE FUNCTION herald_write_intent_view();
