-- Delivery: the lease sweeper's index, and the operator's resolutions of `unknown` intents.

-- Intents whose worker may have died: state 'sending' with an expired lease.
CREATE INDEX notification_intents_sending_lease_idx
    ON notification_intents (lease_until) WHERE state = 'sending';

-- `herald intent resolve ... --as accepted|retry --reason ...`: who decided what, and why.
CREATE TABLE intent_resolutions (
    id            bigint      GENERATED ALWAYS AS IDENTITY,
    intent_id     uuid        NOT NULL REFERENCES notification_intents (id),
    resolved_as   text        NOT NULL CHECK (resolved_as IN ('accepted', 'retry')),
    reason        text        NOT NULL CHECK (reason <> ''),
    operator      text        NOT NULL,
    resolved_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT intent_resolutions_pkey PRIMARY KEY (id)
);
CREATE INDEX intent_resolutions_intent_idx ON intent_resolutions (intent_id);
