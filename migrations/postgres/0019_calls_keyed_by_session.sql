-- The calls' key is (session_id, agent, call_id), no longer (agent, session_id, call_id), and the
-- index `calls_session (session_id, id)` goes: the key serves a session's calls, with or without
-- its agent.
--
-- Why: when many sessions write at once, every call takes a page of each index that orders calls
-- by session, and each such page is written at the commit (docs/benchmarks.md, "Which pages a
-- commit writes"). The key and `calls_session` were two such indexes; now there is one.
--
-- Building the new key locks `calls` for the time it takes (a few seconds per million calls).
-- During a rolling update a replica of the version before keeps working: its `ON CONFLICT
-- (agent, session_id, call_id)` names the same columns, which is all Postgres matches a unique
-- index by, and it reads a session's calls through the key as this version does.
ALTER TABLE calls ADD CONSTRAINT calls_session_agent_call_id_key UNIQUE (session_id, agent, call_id);
ALTER TABLE calls DROP CONSTRAINT calls_agent_session_id_call_id_key;
DROP INDEX calls_session;
