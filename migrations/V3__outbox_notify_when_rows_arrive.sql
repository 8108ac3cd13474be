-- The outbox trigger fired for every INSERT statement, also for those that insert no row:
-- every delivery record (one INSERT ... SELECT of retry rows, usually none) sent a
-- NOTIFY. A transaction that notifies takes a database-wide lock while it commits, so
-- those records committed one at a time. Now only statements that inserted rows notify.
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM inserted) THEN
        PERFORM pg_notify('herald_outbox', '');
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER outbox_notify_after_insert ON outbox;
CREATE TRIGGER outbox_notify_after_insert
    AFTER INSERT ON outbox REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();
