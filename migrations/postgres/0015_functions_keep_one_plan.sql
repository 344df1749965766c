-- The broker's functions keep one plan per statement (issue 19). A plpgsql function's
-- statements are planned as a prepared statement's are: for their first five runs on a
-- connection with the arguments' values, then once for any values if that plan looks no
-- dearer. Some of these statements never pass that test, though no other plan is ever better
-- (an `unnest` of the policy keys looks dearer for an array of unknown length than for the one
-- or two keys a submit passes; a `LIMIT` of an unknown count than of a known one), so Postgres
-- planned them again on every call: about a twentieth of its CPU at 64 agents, measured with
-- `perf` (the planner under `SPI_execute_plan_with_paramlist`). Every statement of these
-- functions reads or locks by key, where the one plan is the plan for every value.
--
-- It changes no table and no function's behaviour: going back past it is an
-- `ALTER FUNCTION ... RESET plan_cache_mode` of each, and deleting its migration record
-- (docs/data-lifecycle.md).
ALTER FUNCTION number_events(BIGINT, TEXT, TEXT) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION lock_submit(TEXT, TEXT, INT4[], BIGINT) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION lock_submit(TEXT, TEXT, INT4[], BIGINT, TEXT[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION approve_call(TEXT, TEXT, TEXT, TEXT, BIGINT, TEXT, TEXT, TEXT, BOOLEAN)
    SET plan_cache_mode = force_generic_plan;
