-- Delivery fencing and append-only evidence (DESIGN.md, "Fencing").

-- The fencing token: the attempt that holds the intent's lease. Every record and state
-- change of a worker is guarded by it, so a worker that lost its lease changes nothing.
ALTER TABLE notification_intents
    ADD COLUMN lease_attempt_id uuid,
    -- Attempts recorded `not_sent`: claimed, nothing sent. The retry policy counts the
    -- attempts that could have reached the provider: attempt_count - unsent_attempts.
    ADD COLUMN unsent_attempts integer NOT NULL DEFAULT 0 CHECK (unsent_attempts >= 0),
    -- Whether an attempt of this intent was ever recorded `unknown`: kept on the intent
    -- whatever settles it later (provider evidence, a late outcome, an operator).
    ADD COLUMN had_unknown boolean NOT NULL DEFAULT false;

UPDATE notification_intents i SET had_unknown = true
 WHERE EXISTS (SELECT 1 FROM notification_attempts a WHERE a.intent_id = i.id AND a.outcome = 'unknown');

-- Intents being sent right now (a worker of the previous version holds them): their
-- newest `started` attempt holds the lease.
UPDATE notification_intents i SET lease_attempt_id = a.id
  FROM notification_attempts a
 WHERE i.state = 'sending' AND a.intent_id = i.id AND a.attempt_no = i.attempt_count
   AND a.outcome = 'started';

-- `not_sent`: claimed, and no request went to the provider (the lease could no longer
-- cover a send, or the worker released the attempt at shutdown or revoke).
ALTER TABLE notification_attempts DROP CONSTRAINT notification_attempts_outcome_check;
ALTER TABLE notification_attempts ADD CONSTRAINT notification_attempts_outcome_check
    CHECK (outcome IN ('started', 'accepted', 'rejected', 'retryable', 'unknown', 'not_sent'));

-- A worker's outcome that arrived after its attempt had been recorded `unknown` (the lease
-- expired while the worker was paused, slow, or cut off from PostgreSQL). Stored beside the
-- `unknown`, which stays: the ledger keeps both facts.
ALTER TABLE notification_attempts
    ADD COLUMN late_outcome text CHECK (late_outcome IN
        ('accepted', 'rejected', 'retryable', 'unknown', 'not_sent')),
    ADD COLUMN late_provider_message_id text,
    ADD COLUMN late_error_category text,
    ADD COLUMN late_error_detail text,
    ADD COLUMN late_recorded_at timestamptz,
    ADD CONSTRAINT notification_attempts_late_only_after_unknown
        CHECK (late_outcome IS NULL OR outcome = 'unknown');
