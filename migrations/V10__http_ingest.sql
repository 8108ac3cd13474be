-- HTTP ingest (issue 16): POST /v1/order-events with an Idempotency-Key header.
--
-- One row per key. The request's transaction inserts it before it converges anything and
-- stores the response in it just before committing, so that
--   * a concurrent request with the same key waits on the uncommitted row (the unique
--     index), gives up after a short lock_timeout and answers 409: still in progress;
--   * a crash or a failed request rolls the row back with the intents: the key is free
--     again, and the client's retry converges;
--   * a committed row always holds the response replayed to the same key and fingerprint.
-- A key is answered until expires_at (http_ingest.key_retention_hours after the request);
-- then the row is deleted (by the listener's sweep, or by the next request with that key).
CREATE TABLE http_requests (
    idempotency_key     text        NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    request_fingerprint text        NOT NULL,
    response_status     smallint    CHECK (response_status BETWEEN 200 AND 599),
    response            jsonb,
    received_at         timestamptz NOT NULL DEFAULT now(),
    expires_at          timestamptz NOT NULL,
    CONSTRAINT http_requests_pkey PRIMARY KEY (idempotency_key),
    CONSTRAINT http_requests_answered CHECK ((response_status IS NULL) = (response IS NULL)),
    CONSTRAINT http_requests_expire_later CHECK (expires_at > received_at)
);
CREATE INDEX http_requests_expires_at_idx ON http_requests (expires_at);

-- A key reused with another request (422): the offending document is kept as evidence for
-- as long as the key, once per distinct offending fingerprint.
CREATE TABLE http_request_mismatches (
    id                    bigint      GENERATED ALWAYS AS IDENTITY,
    idempotency_key       text        NOT NULL REFERENCES http_requests (idempotency_key) ON DELETE CASCADE,
    stored_fingerprint    text        NOT NULL,
    offending_fingerprint text        NOT NULL,
    offending_request     jsonb       NOT NULL,
    detected_at           timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT http_request_mismatches_pkey PRIMARY KEY (id),
    CONSTRAINT http_request_mismatches_once UNIQUE (idempotency_key, offending_fingerprint)
);
