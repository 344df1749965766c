//! The little CBOR (RFC 8949) a passkey needs read: an attestation object (a map of `fmt`,
//! `attStmt`, `authData`) and a COSE public key (a map with integer keys). Definite lengths only
//! (WebAuthn's CTAP2 canonical form has no other), a bounded depth and sizes checked against the
//! bytes actually there, so a hostile credential cannot make the broker allocate or recurse
//! without end. Reading, never writing: the broker stores the bytes it was given.

use std::fmt;

/// One CBOR data item.
#[derive(Debug, Clone, PartialEq)]
pub enum Cbor {
    /// Major type 0: an unsigned integer.
    Unsigned(u64),
    /// Major type 1: the integer `-1 - n`, kept as that value.
    Negative(i128),
    Bytes(Vec<u8>),
    Text(String),
    Array(Vec<Cbor>),
    /// In the order written (keys may repeat in bad input: [`Cbor::get`] refuses those).
    Map(Vec<(Cbor, Cbor)>),
    Bool(bool),
    Null,
    Undefined,
    Float(f64),
}

/// Why bytes are not the CBOR expected, for messages a person can read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CborError(pub String);

impl fmt::Display for CborError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Nested arrays and maps deeper than this are refused (a COSE key is 1 deep, an attestation
/// object 3 with a certificate chain).
const MAX_DEPTH: usize = 16;

/// Reads one item from the start of `bytes`: the item and how many bytes it took (a COSE key
/// is followed by extensions in authenticator data, so trailing bytes are the caller's).
pub fn read(bytes: &[u8]) -> Result<(Cbor, usize), CborError> {
    let mut reader = Reader { bytes, at: 0 };
    let item = reader.item(0)?;
    Ok((item, reader.at))
}

/// Reads exactly one item that fills `bytes`.
pub fn read_all(bytes: &[u8]) -> Result<Cbor, CborError> {
    let (item, used) = read(bytes)?;
    if used != bytes.len() {
        return Err(CborError(format!(
            "{} byte(s) follow the CBOR item",
            bytes.len() - used
        )));
    }
    Ok(item)
}

impl Cbor {
    /// The value of a map's `key`; `Ok(None)` if absent, an error if this is no map or the key
    /// is there twice (ambiguous, as duplicate JSON keys are).
    pub fn get(&self, key: &Cbor) -> Result<Option<&Cbor>, CborError> {
        let Cbor::Map(entries) = self else {
            return Err(CborError("expected a CBOR map".into()));
        };
        let mut found = entries.iter().filter(|(k, _)| k == key).map(|(_, v)| v);
        let first = found.next();
        if found.next().is_some() {
            return Err(CborError(format!("the CBOR map names {key:?} twice")));
        }
        Ok(first)
    }

    /// [`Cbor::get`] with an integer key (COSE's labels).
    pub fn get_int(&self, key: i64) -> Result<Option<&Cbor>, CborError> {
        let key = if key >= 0 {
            Cbor::Unsigned(key as u64)
        } else {
            Cbor::Negative(i128::from(key))
        };
        self.get(&key)
    }

    /// [`Cbor::get`] with a text key.
    pub fn get_text(&self, key: &str) -> Result<Option<&Cbor>, CborError> {
        self.get(&Cbor::Text(key.to_owned()))
    }

    /// The integer this is, if it is one that fits an `i64`.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Cbor::Unsigned(n) => i64::try_from(*n).ok(),
            Cbor::Negative(n) => i64::try_from(*n).ok(),
            _ => None,
        }
    }

    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Cbor::Bytes(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_text(&self) -> Option<&str> {
        match self {
            Cbor::Text(t) => Some(t),
            _ => None,
        }
    }
}

struct Reader<'b> {
    bytes: &'b [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], CborError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| CborError("the CBOR ends in the middle of an item".into()))?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    /// The argument of an initial byte's additional information (`info`).
    fn argument(&mut self, info: u8) -> Result<u64, CborError> {
        let width = match info {
            0..=23 => return Ok(u64::from(info)),
            24 => 1,
            25 => 2,
            26 => 4,
            27 => 8,
            31 => {
                return Err(CborError(
                    "indefinite-length CBOR items are not accepted".into(),
                ));
            }
            _ => return Err(CborError(format!("reserved CBOR additional info {info}"))),
        };
        Ok(self
            .take(width)?
            .iter()
            .fold(0u64, |n, &b| (n << 8) | u64::from(b)))
    }

    /// A length, no longer than the bytes left (each element takes at least one byte).
    fn length(&mut self, info: u8) -> Result<usize, CborError> {
        let n = self.argument(info)?;
        let left = (self.bytes.len() - self.at) as u64;
        if n > left {
            return Err(CborError(format!(
                "a CBOR length of {n} with only {left} byte(s) left"
            )));
        }
        Ok(n as usize)
    }

    fn item(&mut self, depth: usize) -> Result<Cbor, CborError> {
        if depth > MAX_DEPTH {
            return Err(CborError(format!(
                "CBOR nested deeper than {MAX_DEPTH} levels"
            )));
        }
        let initial = self.take(1)?[0];
        let (major, info) = (initial >> 5, initial & 0x1f);
        Ok(match major {
            0 => Cbor::Unsigned(self.argument(info)?),
            1 => Cbor::Negative(-1 - i128::from(self.argument(info)?)),
            2 => {
                let n = self.length(info)?;
                Cbor::Bytes(self.take(n)?.to_vec())
            }
            3 => {
                let n = self.length(info)?;
                let text = std::str::from_utf8(self.take(n)?)
                    .map_err(|_| CborError("a CBOR text string is not UTF-8".into()))?;
                Cbor::Text(text.to_owned())
            }
            4 => {
                let n = self.length(info)?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.item(depth + 1)?);
                }
                Cbor::Array(items)
            }
            5 => {
                let n = self.length(info)?;
                let mut entries = Vec::with_capacity(n);
                for _ in 0..n {
                    let key = self.item(depth + 1)?;
                    let value = self.item(depth + 1)?;
                    entries.push((key, value));
                }
                Cbor::Map(entries)
            }
            // A tag: what it tags is read as is (no tag means anything WebAuthn reads).
            6 => {
                self.argument(info)?;
                self.item(depth + 1)?
            }
            _ => match info {
                20 => Cbor::Bool(false),
                21 => Cbor::Bool(true),
                22 => Cbor::Null,
                23 => Cbor::Undefined,
                25 => Cbor::Float(half(self.argument(info)? as u16)),
                26 => Cbor::Float(f64::from(f32::from_bits(self.argument(info)? as u32))),
                27 => Cbor::Float(f64::from_bits(self.argument(info)?)),
                _ => {
                    return Err(CborError(format!(
                        "CBOR simple value {info} is not accepted"
                    )));
                }
            },
        })
    }
}

/// An IEEE 754 half-precision float.
fn half(bits: u16) -> f64 {
    let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exponent = i32::from((bits >> 10) & 0x1f);
    let mantissa = f64::from(bits & 0x3ff);
    sign * match exponent {
        0 => mantissa * 2f64.powi(-24),
        31 if mantissa == 0.0 => f64::INFINITY,
        31 => f64::NAN,
        e => (1.0 + mantissa / 1024.0) * 2f64.powi(e - 15),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn the_examples_of_rfc_8949_read_as_the_values_they_encode() {
        assert_eq!(read_all(&hex("00")).unwrap(), Cbor::Unsigned(0));
        assert_eq!(read_all(&hex("1864")).unwrap(), Cbor::Unsigned(100));
        assert_eq!(
            read_all(&hex("1bffffffffffffffff")).unwrap(),
            Cbor::Unsigned(u64::MAX)
        );
        assert_eq!(read_all(&hex("20")).unwrap(), Cbor::Negative(-1));
        assert_eq!(read_all(&hex("3903e7")).unwrap(), Cbor::Negative(-1000));
        assert_eq!(
            read_all(&hex("3bffffffffffffffff")).unwrap(),
            Cbor::Negative(-18446744073709551616)
        );
        assert_eq!(
            read_all(&hex("4401020304")).unwrap(),
            Cbor::Bytes(vec![1, 2, 3, 4])
        );
        assert_eq!(
            read_all(&hex("62c3bc")).unwrap(),
            Cbor::Text("\u{fc}".into())
        );
        assert_eq!(
            read_all(&hex("8301820203820405")).unwrap(),
            Cbor::Array(vec![
                Cbor::Unsigned(1),
                Cbor::Array(vec![Cbor::Unsigned(2), Cbor::Unsigned(3)]),
                Cbor::Array(vec![Cbor::Unsigned(4), Cbor::Unsigned(5)]),
            ])
        );
        let map = read_all(&hex("a26161016162820203")).unwrap();
        assert_eq!(map.get_text("a").unwrap(), Some(&Cbor::Unsigned(1)));
        assert_eq!(map.get_text("c").unwrap(), None);
        assert_eq!(read_all(&hex("f5")).unwrap(), Cbor::Bool(true));
        assert_eq!(read_all(&hex("f6")).unwrap(), Cbor::Null);
        assert_eq!(read_all(&hex("f93c00")).unwrap(), Cbor::Float(1.0));
        assert_eq!(read_all(&hex("f9c400")).unwrap(), Cbor::Float(-4.0));
        assert_eq!(read_all(&hex("fa47c35000")).unwrap(), Cbor::Float(100000.0));
        assert_eq!(
            read_all(&hex("c11a514b67b0")).unwrap(),
            Cbor::Unsigned(1363896240)
        );
    }

    #[test]
    fn a_cose_key_reads_with_integer_labels_and_leaves_what_follows_it() {
        // {1: 2, 3: -7, -1: 1} then one more byte.
        let (key, used) = read(&hex("a3010203262001ff")).unwrap();
        assert_eq!(used, 7);
        assert_eq!(key.get_int(1).unwrap().and_then(Cbor::as_int), Some(2));
        assert_eq!(key.get_int(3).unwrap().and_then(Cbor::as_int), Some(-7));
        assert_eq!(key.get_int(-1).unwrap().and_then(Cbor::as_int), Some(1));
        assert!(read_all(&hex("a3010203262001ff")).is_err());
    }

    #[test]
    fn truncated_hostile_or_ambiguous_cbor_is_refused_with_a_reason() {
        let err = |h: &str| read_all(&hex(h)).unwrap_err().0;
        assert!(err("44010203").contains("a CBOR length of 4 with only 3 byte(s) left"));
        assert!(err("1901").contains("ends in the middle"));
        // A byte string claiming 2^32 bytes: refused before any allocation.
        assert!(err("5affffffff00").contains("only 1 byte(s) left"));
        assert!(err("9f01ff").contains("indefinite-length"));
        assert!(err("62c328").contains("not UTF-8"));
        assert!(err("1c").contains("reserved"));
        let deep = "81".repeat(40) + "00";
        assert!(err(&deep).contains("deeper"));
        let twice = read_all(&hex("a2616101616102")).unwrap();
        assert!(twice.get_text("a").unwrap_err().0.contains("twice"));
    }
}
