-- When a waiter last left a full waiting list (NULL: never): a join is
-- decided on the queue as it stood when the request arrived (see the
-- PostgreSQL migration of the same name).
ALTER TABLE assets ADD COLUMN waitlist_full_at TEXT;
