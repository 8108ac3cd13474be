-- Held intents (issue 18): an order whose seller has no profile yet. Its intents are created
-- at once, so the business key and fingerprint are fixed and duplicates converge as
-- before, but with no payload: state 'awaiting_profile', payload_digest, template_revision
-- and consent NULL. The payload is rendered and frozen when the profile arrives; after
-- ingest.profile_wait_secs without one, the intent is 'suppressed' / 'no_seller_profile'.

ALTER TABLE notification_intents DROP CONSTRAINT notification_intents_state_check;
ALTER TABLE notification_intents ADD CONSTRAINT notification_intents_state_check CHECK (state IN
    ('pending', 'sending', 'accepted', 'rejected', 'retry_scheduled', 'unknown', 'failed', 'suppressed',
     'awaiting_profile'));

ALTER TABLE notification_intents
    ALTER COLUMN payload_digest DROP NOT NULL,
    ALTER COLUMN template_revision DROP NOT NULL,
    ALTER COLUMN consent DROP NOT NULL,
    -- Exactly the held intents lack the frozen decision, and they lack all of it.
    ADD CONSTRAINT notification_intents_frozen_unless_held CHECK (
        (state = 'awaiting_profile') = (payload_digest IS NULL)
        AND (payload_digest IS NULL) = (template_revision IS NULL)
        AND (payload_digest IS NULL) = (consent IS NULL));

-- One row per held intent, kept after the decision as the ledger of the hold: when it was
-- held, until when, what decided it (the profile version it was rendered with, or the
-- wait running out) and the last failure to render it.
CREATE TABLE intent_holds (
    intent_id        uuid        NOT NULL REFERENCES notification_intents (id),
    marketplace_id   text        NOT NULL,
    seller_id        text        NOT NULL,
    -- The order event as received: what is rendered when the profile arrives. Cleared
    -- once the hold is decided (the intent's payload or the fallback is then frozen).
    event            jsonb,
    -- The payload rendered without a profile (consent 'no_seller_profile'), stored when
    -- the intent was held: what an expired hold freezes, with no rendering at expiry.
    fallback_digest  text        NOT NULL REFERENCES notification_payloads (digest),
    held_at          timestamptz NOT NULL DEFAULT now(),
    hold_until       timestamptz NOT NULL,
    decision         text        CHECK (decision IN ('released', 'expired')),
    decided_at       timestamptz,
    profile_version  bigint,
    last_error       text,
    CONSTRAINT intent_holds_pkey PRIMARY KEY (intent_id),
    CONSTRAINT intent_holds_decided CHECK ((decision IS NULL) = (decided_at IS NULL)),
    CONSTRAINT intent_holds_event_until_decided CHECK (decision IS NOT NULL OR event IS NOT NULL),
    CONSTRAINT intent_holds_released_with_version CHECK ((decision = 'released') = (profile_version IS NOT NULL))
);
-- Open holds of a seller: what a profile's arrival releases.
CREATE INDEX intent_holds_open_seller_idx
    ON intent_holds (marketplace_id, seller_id) WHERE decision IS NULL;
-- Open holds by deadline: what expires next, and the oldest hold for the gauge.
CREATE INDEX intent_holds_open_until_idx
    ON intent_holds (hold_until) WHERE decision IS NULL;
-- Whether a payload is some hold's fallback: retention keeps those (hash: equality only,
-- a 4-byte hash per entry instead of the 64-character digest).
CREATE INDEX intent_holds_fallback_idx ON intent_holds USING hash (fallback_digest);
