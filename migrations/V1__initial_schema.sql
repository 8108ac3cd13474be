-- Herald's schema. Names are chosen for an on-call engineer reading them with psql;
-- states and outcomes are text with CHECK constraints, values exactly as in DESIGN.md.

-- Immutable template revisions. One active revision per (template, channel, locale).
CREATE TABLE templates (
    template        text        NOT NULL,
    channel         text        NOT NULL CHECK (channel IN ('email', 'sms')),
    locale          text        NOT NULL CHECK (locale <> ''),
    revision        text        NOT NULL CHECK (revision <> ''),
    subject         text,
    body_text       text        NOT NULL,
    body_html       text,
    content_digest  text        NOT NULL,
    active          boolean     NOT NULL DEFAULT false,
    published_at    timestamptz NOT NULL DEFAULT now(),
    activated_at    timestamptz,
    CONSTRAINT templates_pkey PRIMARY KEY (template, channel, locale, revision)
);
CREATE UNIQUE INDEX templates_one_active_idx
    ON templates (template, channel, locale) WHERE active;

-- Seller profiles from the compacted seller-profiles topic; newest version wins.
CREATE TABLE sellers (
    marketplace_id  text        NOT NULL,
    seller_id       text        NOT NULL,
    email           text,
    phone           text,
    locale          text,
    email_opt_in    boolean     NOT NULL DEFAULT false,
    sms_opt_in      boolean     NOT NULL DEFAULT false,
    version         bigint      NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT sellers_pkey PRIMARY KEY (marketplace_id, seller_id)
);

-- Rendered content frozen at intent creation, stored once per blake3 digest.
CREATE TABLE notification_payloads (
    digest            text        NOT NULL,
    channel           text        NOT NULL CHECK (channel IN ('email', 'sms')),
    destination       text,
    locale            text        NOT NULL,
    consent           text        NOT NULL CHECK (consent IN
                          ('granted', 'opted_out', 'no_destination', 'invalid_destination', 'no_seller_profile')),
    template          text        NOT NULL,
    template_revision text        NOT NULL,
    subject           text,
    body_text         text,
    body_html         text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    body_purged_at    timestamptz,
    CONSTRAINT notification_payloads_pkey PRIMARY KEY (digest)
);

-- One immutable intent per business key.
CREATE TABLE notification_intents (
    id                 uuid        NOT NULL,
    marketplace_id     text        NOT NULL,
    order_id           text        NOT NULL,
    event_kind         text        NOT NULL,
    channel            text        NOT NULL CHECK (channel IN ('email', 'sms')),
    idempotency_key    text        NOT NULL,
    request_fingerprint text       NOT NULL,
    seller_id          text        NOT NULL,
    template           text        NOT NULL,
    template_revision  text        NOT NULL,
    payload_digest     text        NOT NULL REFERENCES notification_payloads (digest),
    consent            text        NOT NULL CHECK (consent IN
                           ('granted', 'opted_out', 'no_destination', 'invalid_destination', 'no_seller_profile')),
    state              text        NOT NULL CHECK (state IN
                           ('pending', 'sending', 'accepted', 'rejected', 'retry_scheduled', 'unknown', 'failed', 'suppressed')),
    attempt_count      integer     NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
    next_attempt_at    timestamptz,
    lease_owner        text,
    lease_until        timestamptz,
    trace_context      text,
    event_id           text        NOT NULL,
    occurred_at        timestamptz NOT NULL,
    source_topic       text        NOT NULL,
    source_partition   integer     NOT NULL,
    source_offset      bigint      NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT notification_intents_pkey PRIMARY KEY (id),
    CONSTRAINT notification_intents_business_key UNIQUE (marketplace_id, order_id, event_kind, channel),
    CONSTRAINT notification_intents_idempotency_key UNIQUE (idempotency_key),
    CONSTRAINT notification_intents_suppressed_iff_no_consent
        CHECK ((consent = 'granted') = (state <> 'suppressed'))
);
CREATE INDEX notification_intents_state_idx
    ON notification_intents (state) WHERE state NOT IN ('accepted', 'rejected', 'failed', 'suppressed');

-- A business key reused with different content: kept as evidence, never sent.
CREATE TABLE intent_conflicts (
    id                    bigint      GENERATED ALWAYS AS IDENTITY,
    intent_id             uuid        NOT NULL REFERENCES notification_intents (id),
    existing_fingerprint  text        NOT NULL,
    offending_fingerprint text        NOT NULL,
    offending_event_id    text        NOT NULL,
    offending_event       jsonb       NOT NULL,
    source_topic          text        NOT NULL,
    source_partition      integer     NOT NULL,
    source_offset         bigint      NOT NULL,
    detected_at           timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT intent_conflicts_pkey PRIMARY KEY (id),
    -- A replay of the same offending message after a crash records nothing new.
    CONSTRAINT intent_conflicts_source UNIQUE (intent_id, source_topic, source_partition, source_offset)
);

-- Transactional outbox: intent ids waiting to be published to herald.deliveries.
CREATE TABLE outbox (
    id             bigint      GENERATED ALWAYS AS IDENTITY,
    intent_id      uuid        NOT NULL REFERENCES notification_intents (id),
    available_at   timestamptz NOT NULL DEFAULT now(),
    trace_context  text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT outbox_pkey PRIMARY KEY (id)
);
CREATE INDEX outbox_available_at_idx ON outbox (available_at, id);

-- Wake relays as soon as rows are committed (LISTEN herald_outbox); one notification per
-- statement, PostgreSQL folds identical ones within a transaction.
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('herald_outbox', '');
    RETURN NULL;
END $$;
CREATE TRIGGER outbox_notify_after_insert
    AFTER INSERT ON outbox FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

-- Every delivery attempt, partitioned by month on started_at. Partitions are created by
-- `herald migrate` (and at start-up) ahead of time; the default partition catches the rest.
CREATE TABLE notification_attempts (
    id                  uuid        NOT NULL,
    intent_id           uuid        NOT NULL,
    attempt_no          integer     NOT NULL CHECK (attempt_no >= 1),
    outcome             text        NOT NULL CHECK (outcome IN
                            ('started', 'accepted', 'rejected', 'retryable', 'unknown')),
    after_unknown       boolean     NOT NULL DEFAULT false,
    worker              text        NOT NULL,
    started_at          timestamptz NOT NULL DEFAULT now(),
    finished_at         timestamptz,
    provider_message_id text,
    error_category      text,
    error_detail        text,
    trace_context       text,
    CONSTRAINT notification_attempts_pkey PRIMARY KEY (id, started_at)
) PARTITION BY RANGE (started_at);
CREATE INDEX notification_attempts_intent_idx ON notification_attempts (intent_id, attempt_no);
CREATE TABLE notification_attempts_default PARTITION OF notification_attempts DEFAULT;
