-- The pending calls of one batch (batch completion after every decision, skip-rest after a
-- denial). Without this index SQLite's planner walks `calls_status` over every pending call of
-- the store and filters by batch: with 100,000 pending calls a Decide took 46 ms instead of
-- 1 ms (approval-bench --scale).
CREATE INDEX calls_pending_batch ON calls (batch_id, position) WHERE status = 1;
