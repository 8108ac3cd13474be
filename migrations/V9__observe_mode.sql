-- Observe-only routes (issue 16, the adoption path's first step): a route with
-- mode = "observe" converges, renders, decides consent and freezes its intents like any
-- other, then leaves them 'observed': no outbox row, no due time, never sent. The mode is
-- decided when the intent is created; a held intent keeps it on its hold, so a release
-- after the route was switched to "deliver" still freezes it 'observed'.
--
-- On a large table, each ADD CONSTRAINT below scans notification_intents under an ACCESS
-- EXCLUSIVE lock (as V5 did): run it while ingest is stopped, or add the constraints
-- NOT VALID and VALIDATE them afterwards by hand.

ALTER TABLE notification_intents DROP CONSTRAINT notification_intents_state_check;
ALTER TABLE notification_intents ADD CONSTRAINT notification_intents_state_check CHECK (state IN
    ('pending', 'sending', 'accepted', 'rejected', 'retry_scheduled', 'unknown', 'failed', 'suppressed',
     'awaiting_profile', 'observed'));

-- An observed intent keeps whatever consent decision it was frozen with (what delivery
-- would have acted on); only a delivering route's intent is 'suppressed' for the lack of it.
ALTER TABLE notification_intents DROP CONSTRAINT notification_intents_suppressed_iff_no_consent;
ALTER TABLE notification_intents ADD CONSTRAINT notification_intents_suppressed_iff_no_consent
    CHECK (state = 'observed' OR (consent = 'granted') = (state <> 'suppressed'));

-- Never due: nothing claims an observed intent.
ALTER TABLE notification_intents ADD CONSTRAINT notification_intents_observed_never_due
    CHECK (state <> 'observed' OR next_attempt_at IS NULL);

ALTER TABLE intent_holds ADD COLUMN observe boolean NOT NULL DEFAULT false;

-- The partial index of live intents (V1) leaves out the observed ones too: an observe phase
-- would otherwise fill it with every intent of the route. (On a large table, build the new
-- index CONCURRENTLY under another name by hand first, then drop and rename.)
DROP INDEX notification_intents_state_idx;
CREATE INDEX notification_intents_state_idx ON notification_intents (state)
    WHERE state NOT IN ('accepted', 'rejected', 'failed', 'suppressed', 'observed');
