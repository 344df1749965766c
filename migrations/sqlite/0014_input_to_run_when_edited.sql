-- From this migration on, an approval stores its input to run (`calls.run_input`) only when an
-- approver edited it; a NULL reads back as the call's own input. Stored again, a 1 KiB input
-- made an approved call's row over half a page, a page per call (docs/benchmarks.md).
--
-- The migration changes no table: it is a marker. Binaries before `f2daf96` read such a NULL as
-- "nothing to run", and sqlx refuses to start a binary on a database holding a migration it does
-- not know, so no such binary can open this file again once this one has (a SQLite file has one
-- broker at a time). To go back to one: docs/data-lifecycle.md, "Going back to an older version".
SELECT 1;
