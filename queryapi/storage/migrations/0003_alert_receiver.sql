-- The Alertmanager receiver that delivered each alert (pager, ticket, ...), so a
-- dashboard can show what was routed where. Rows recorded before this migration have ''.
ALTER TABLE alerts ADD COLUMN receiver TEXT NOT NULL DEFAULT '';
