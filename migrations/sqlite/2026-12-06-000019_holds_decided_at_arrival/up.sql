-- When the asset last became free to hold (NULL: since it was created): a
-- hold is decided on the asset as it stood when the request arrived (see
-- the PostgreSQL migration of the same name).
ALTER TABLE assets ADD COLUMN available_since TEXT;
