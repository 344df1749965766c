-- Agent hosts (issue 48): the host whose tool call a call is (`CallSpec.host`: claude-code, codex,
-- gemini-cli, copilot, cursor, acp; NULL: none named), from which the broker reads the call as a
-- common action (`domain::action`); the action kind a rule names (`Rule.kind`), and the kind a
-- grant remembered from a host's call covers (`Grant.kind`), NULL for the tool-named ones. The
-- action itself is never stored: it is read from the host, tool and input each time.
-- Rows stored before keep NULL; nothing is copied, so the migration takes no time.
ALTER TABLE calls ADD COLUMN host TEXT;
ALTER TABLE rules ADD COLUMN kind TEXT;
ALTER TABLE grants ADD COLUMN kind TEXT;
