-- When a hold's write claimed the asset (NULL: at `created_at`): a join
-- queues only for a hold that began before its arrival (see the PostgreSQL
-- migration of the same name).
ALTER TABLE reservations ADD COLUMN began_at TEXT;
