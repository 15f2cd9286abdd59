-- The trace context of a follow-up for an external queue, published beside it in the
-- broker's own headers.
ALTER TABLE wharf_outbox ADD COLUMN IF NOT EXISTS traceparent TEXT;
ALTER TABLE wharf_outbox ADD COLUMN IF NOT EXISTS tracestate TEXT;
