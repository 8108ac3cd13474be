-- The relay publishes each outbox row with its intent's channel (the delivery worker picks
-- the channel's claim window before it claims). It read the channel by joining every due
-- row to intent_contents, and once that join's plan read the whole intents table for each
-- round (BENCHMARKS.md, issue 19). Every statement that queues an intent now writes the
-- channel on the row, and the relay reads no other table.
--
-- Nullable, with no default: no rewrite (the CHECK reads the outbox once; it holds only
-- what is waiting), and a moment's ACCESS EXCLUSIVE lock on the outbox (see V12 for running
-- it behind a long transaction). Rows queued before this migration, or by an older Herald
-- still running during a rolling upgrade, have no channel: the relay reads the intent's
-- for them (one primary-key lookup each; the outbox's foreign key keeps the intent there).
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS channel text
    CONSTRAINT outbox_channel_known CHECK (channel IN ('email', 'sms'));
