-- Consumer inbox support: the delivery an operator resubmission stands in for, and how a
-- processed message was settled (e.g. "skipped: duplicate").
ALTER TABLE messages ADD COLUMN source_delivery_id TEXT;
ALTER TABLE messages ADD COLUMN outcome TEXT;
