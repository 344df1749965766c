/**
 * RFC 8785 (JSON Canonicalization Scheme) for values `JSON.parse` produced: the form the broker
 * writes inputs and receipt statements in. JCS is defined on ECMAScript's own serialization of
 * numbers and strings, so `JSON.stringify` does those; what is left is sorting object keys by
 * their UTF-16 code units (JavaScript's default string order) and refusing what has no
 * canonical form.
 * @module
 */

/** The canonical JSON text of `value`; throws `TypeError` for a value JSON cannot hold. */
export function canonicalize(value: unknown): string {
  if (value === null || typeof value === "boolean") return JSON.stringify(value);
  if (typeof value === "string") return JSON.stringify(value);
  if (typeof value === "number") {
    if (!Number.isFinite(value)) throw new TypeError(`${value} has no JSON form`);
    return JSON.stringify(value);
  }
  if (Array.isArray(value)) return `[${value.map(canonicalize).join(",")}]`;
  if (typeof value === "object") {
    const entries = Object.keys(value)
      .sort()
      .map((key) => `${JSON.stringify(key)}:${canonicalize((value as Record<string, unknown>)[key])}`);
    return `{${entries.join(",")}}`;
  }
  throw new TypeError(`a ${typeof value} has no JSON form`);
}
