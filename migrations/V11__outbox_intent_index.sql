-- Every intent view (`herald intent show`, GET /v1/intents/{id}, the by-key inspection)
-- counts the intent's outbox rows, and retention deletes an intent's rows with it: both
-- looked the intent up in the outbox by a sequential scan. The outbox is drained as it
-- fills, so it is small and this index cheap to build; on a backlog of millions, build it
-- CONCURRENTLY by hand first (this statement then finds it and does nothing).
CREATE INDEX IF NOT EXISTS outbox_intent_id_idx ON outbox (intent_id);
