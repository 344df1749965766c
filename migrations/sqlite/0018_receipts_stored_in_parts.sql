-- A receipt is stored in parts (issue 19): its payload as text (`payload`), the signing key's
-- id (`keyid`) and the signature (`sig`, base64), the parts of its DSSE envelope, which is
-- built from them when it is served (`receipts::envelope`, the same bytes as sealed). A row
-- stored so has an empty `envelope`; rows written before this keep their envelope, and the
-- parts NULL.
--
-- Why: the envelope holds the payload in base64, a third longer than the payload itself, so a
-- receipt was the largest row a decision writes, and just over half a page even for a small
-- input (2,063 bytes with a 64-byte input): every receipt took a page of its own. In parts, two
-- share a page up to inputs of about 1 KiB, and the file grows 38-40% less per decided call
-- with inputs of 64 to 512 bytes (docs/benchmarks.md). The signer signs and no longer encodes,
-- and the writer's seal rewrites 88 bytes of signature, not the envelope.
--
-- The columns are added, nothing is copied: the migration takes no time on a large file. A
-- binary before it refuses to start on the file (an unknown migration); one started anyway
-- (its record deleted) would serve the receipts stored in parts with an empty envelope, which
-- no verifier accepts, until this version serves them again (docs/data-lifecycle.md).
ALTER TABLE receipts ADD COLUMN payload TEXT;
ALTER TABLE receipts ADD COLUMN keyid TEXT;
ALTER TABLE receipts ADD COLUMN sig TEXT;
