-- W3C trace context of a message (src/dispatch/trace-context.ts). Nullable and without defaults,
-- so adding them rewrites no table: rows from before have a NULL trace_id, for which the readers
-- derive a stable one (md5 of the message's coordinates and produce time).
ALTER TABLE "messages" ADD COLUMN "trace_id" UUID,
ADD COLUMN "traceparent" TEXT,
ADD COLUMN "tracestate" TEXT;
