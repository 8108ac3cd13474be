-- A payload's destination goes with its body when retention purges it (V6), but a bounce
-- or complaint may come after that, and evidence suppresses only the destination of the
-- attempt it matched (issue 43). The purge now keeps the destination's digest
-- (herald_destination_digest, the suppression list's own) in its place: no address, and
-- still the means to tell whether an event names the intent's destination.
--
-- Nullable, no default: no rewrite. Payloads purged before this migration have neither:
-- a late bounce about one of them suppresses no one (and says so in the log).
ALTER TABLE notification_payloads ADD COLUMN IF NOT EXISTS destination_digest text;
