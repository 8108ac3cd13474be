-- The provider's own evidence (issue 15): SES event records read from an SQS queue (the
-- `reconcile` role) settle `unknown` attempts, and bounces and complaints feed a
-- suppression list that ingest consults; SNS's SMS delivery status, read from CloudWatch
-- Logs, is stored against the accepted SMS attempts.
--
-- No recipient address and no content is stored here: events name their attempt, the SES
-- message id and what happened; the suppression list holds destination digests.
--
-- Two indexes cover existing tables. On a large ledger build them first by hand, without
-- blocking writes, and this migration then finds them in place (on a partitioned table,
-- CONCURRENTLY per partition, then the parent):
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS notification_intents_awaiting_evidence_idx ...;
--   CREATE INDEX IF NOT EXISTS notification_attempts_provider_message_idx ... (after each
--   partition's own index was built CONCURRENTLY).

-- One row per distinct provider event (SNS and SQS deliver at least once: duplicates
-- converge on event_key). Append-only.
CREATE TABLE provider_events (
    id                  bigint      GENERATED ALWAYS AS IDENTITY,
    event_key           text        NOT NULL,
    channel             text        NOT NULL CHECK (channel IN ('email', 'sms')),
    -- SES's event type in snake case ('send', 'delivery', 'bounce', 'rendering_failure', ...),
    -- or an SMS delivery status ('delivered', 'failed').
    event_type          text        NOT NULL CHECK (event_type <> ''),
    provider_message_id text        NOT NULL,
    occurred_at         timestamptz NOT NULL,
    -- What the event says of the attempt: the provider had the message ('accepted': Send,
    -- Delivery, Bounce, Complaint, DeliveryDelay), refused it ('rejected': Reject,
    -- Rendering Failure), or nothing about that (NULL: Open, Click, Subscription).
    verdict             text        CHECK (verdict IN ('accepted', 'rejected')),
    -- The attempt it was matched to, and how: by Herald's tags (intent, attempt) or by the
    -- message id SendEmail returned. NULL: no attempt of this ledger (another sender on
    -- the configuration set, an attempt already removed by retention).
    intent_id           uuid,
    attempt_id          uuid,
    matched_by          text        CHECK (matched_by IN ('tags', 'message_id')),
    bounce_type         text,
    bounce_subtype      text,
    complaint_type      text,
    detail              text,
    -- An SMS delivery status's price (SNS's priceInUSD).
    price_usd           double precision,
    -- What the event did to the ledger: 'settled' an unknown attempt, 'suppressed' a
    -- destination, both, or nothing ('recorded').
    effect              text        NOT NULL DEFAULT 'recorded'
                            CHECK (effect IN ('recorded', 'settled', 'suppressed', 'settled_suppressed')),
    received_at         timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT provider_events_pkey PRIMARY KEY (id),
    CONSTRAINT provider_events_key UNIQUE (event_key),
    CONSTRAINT provider_events_matched CHECK ((intent_id IS NULL) = (matched_by IS NULL)
                                              AND (attempt_id IS NULL) = (intent_id IS NULL))
);
CREATE INDEX provider_events_intent_idx ON provider_events (intent_id, attempt_id) WHERE intent_id IS NOT NULL;
-- Retention removes events with the attempts' clock (retention.attempt_months).
CREATE INDEX provider_events_received_idx ON provider_events (received_at);

-- Queue messages that are not provider events: kept with their reason, then deleted from
-- the queue (never retried forever). The body is cut to 16 KiB; it may hold addresses, so
-- rows here are removed with the attempts' retention (as provider_events are).
CREATE TABLE provider_event_rejects (
    id            bigint      GENERATED ALWAYS AS IDENTITY,
    source        text        NOT NULL,
    message_id    text        NOT NULL,
    reason        text        NOT NULL CHECK (reason <> ''),
    body_prefix   text        NOT NULL,
    body_size     integer     NOT NULL,
    received_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT provider_event_rejects_pkey PRIMARY KEY (id),
    -- A message redelivered after a crash before its delete records nothing new.
    CONSTRAINT provider_event_rejects_message UNIQUE (source, message_id)
);
CREATE INDEX provider_event_rejects_received_idx ON provider_event_rejects (received_at);

-- How far the reconcile role has read each CloudWatch Logs group of SMS delivery status
-- (the newest event timestamp it stored). Reading starts a little before it again: events
-- reach CloudWatch Logs late, and those read twice converge on their key.
CREATE TABLE provider_log_cursors (
    source      text        NOT NULL,
    position    timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT provider_log_cursors_pkey PRIMARY KEY (source)
);

-- Matching by message id, for events without Herald's tags. Hash: equality only, and the
-- index entry does not grow with the id's length.
CREATE INDEX IF NOT EXISTS notification_attempts_provider_message_idx
    ON notification_attempts USING hash (provider_message_id) WHERE provider_message_id IS NOT NULL;

-- Who settled an `unknown` intent, and how: an operator (as before), the provider's
-- evidence, or the channel's policy once the silence window passed without evidence.
ALTER TABLE intent_resolutions DROP CONSTRAINT intent_resolutions_resolved_as_check;
ALTER TABLE intent_resolutions
    ADD CONSTRAINT intent_resolutions_resolved_as_check
        CHECK (resolved_as IN ('accepted', 'retry', 'rejected', 'hold')),
    ADD COLUMN settled_by text NOT NULL DEFAULT 'operator'
        CHECK (settled_by IN ('operator', 'evidence', 'silence')),
    ADD COLUMN attempt_id uuid,
    -- The event that settled it. Retention removes events with the attempts they concern
    -- (retention.attempt_months); the resolution stays, settled_by still says 'evidence'.
    ADD COLUMN provider_event_id bigint REFERENCES provider_events (id) ON DELETE SET NULL,
    ADD CONSTRAINT intent_resolutions_event_only_for_evidence
        CHECK (provider_event_id IS NULL OR settled_by = 'evidence');
-- Retention deletes events (ON DELETE SET NULL looks for the rows naming each one).
CREATE INDEX intent_resolutions_provider_event_idx
    ON intent_resolutions (provider_event_id) WHERE provider_event_id IS NOT NULL;

-- `unknown` intents waiting for evidence: next_attempt_at is when the silence window ends.
CREATE INDEX IF NOT EXISTS notification_intents_awaiting_evidence_idx
    ON notification_intents (next_attempt_at) WHERE state = 'unknown' AND next_attempt_at IS NOT NULL;

-- The digest that names a destination on the suppression list: computed here only, so
-- that the reconcile role (from the event's recipients) and ingest (from the seller's
-- profile) always agree. An e-mail address is trimmed and lowercased (providers do not
-- tell addresses apart by case); a phone number is trimmed.
CREATE FUNCTION herald_destination_digest(channel text, address text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN encode(sha256(convert_to('destination-v1:' || channel || ':'
                                    || CASE WHEN channel = 'email' THEN lower(btrim(address)) ELSE btrim(address) END,
                                    'UTF8')), 'hex');

-- Destinations the provider reported as permanently bounced or complaining. Ingest
-- suppresses later intents to an entry that is not lifted (consent 'bounced' or
-- 'complained'). One live entry per destination; lifted entries stay as the record.
CREATE TABLE suppressions (
    id                  bigint      GENERATED ALWAYS AS IDENTITY,
    channel             text        NOT NULL CHECK (channel IN ('email', 'sms')),
    destination_digest  text        NOT NULL,
    reason              text        NOT NULL CHECK (reason IN ('bounced', 'complained')),
    -- The report that put it here (NULL once retention removed the event; the entry stays
    -- until an operator lifts it).
    provider_event_id   bigint      REFERENCES provider_events (id) ON DELETE SET NULL,
    created_at          timestamptz NOT NULL DEFAULT now(),
    lifted_at           timestamptz,
    lifted_by           text,
    lift_reason         text,
    CONSTRAINT suppressions_pkey PRIMARY KEY (id),
    CONSTRAINT suppressions_lifted CHECK ((lifted_at IS NULL) = (lifted_by IS NULL)
                                         AND (lifted_at IS NULL) = (lift_reason IS NULL))
);
CREATE UNIQUE INDEX suppressions_live ON suppressions (channel, destination_digest) WHERE lifted_at IS NULL;
-- Retention deletes events (ON DELETE SET NULL looks for the entries naming each one).
CREATE INDEX suppressions_provider_event_idx ON suppressions (provider_event_id) WHERE provider_event_id IS NOT NULL;

ALTER TABLE notification_payloads DROP CONSTRAINT notification_payloads_consent_check;
ALTER TABLE notification_payloads ADD CONSTRAINT notification_payloads_consent_check CHECK (consent IN
    ('granted', 'opted_out', 'no_destination', 'invalid_destination', 'no_seller_profile', 'bounced', 'complained'));
ALTER TABLE notification_intents DROP CONSTRAINT notification_intents_consent_check;
ALTER TABLE notification_intents ADD CONSTRAINT notification_intents_consent_check CHECK (consent IN
    ('granted', 'opted_out', 'no_destination', 'invalid_destination', 'no_seller_profile', 'bounced', 'complained'));
