//! Web Push payload encryption (RFC 8291) in the `aes128gcm` content coding (RFC 8188): a fresh
//! P-256 key per message agrees a secret with the subscription's `p256dh` key, HKDF-SHA256 mixes
//! in its `auth` secret, and one AES-128-GCM record carries the payload. Only the browser that
//! made the subscription can read it; the push service in between sees ciphertext.

use ring::aead::{AES_128_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::agreement::{ECDH_P256, EphemeralPrivateKey, UnparsedPublicKey, agree_ephemeral};
use ring::hkdf::{HKDF_SHA256, KeyType, Salt};
use ring::rand::{SecureRandom, SystemRandom};

/// The record size written in the header: one record holds the whole payload.
const RECORD_SIZE: u32 = 4096;
/// An uncompressed P-256 point: `0x04 || x || y`.
pub const P256DH_LEN: usize = 65;
/// The subscription's authentication secret.
pub const AUTH_LEN: usize = 16;
/// The most plaintext a push carries (RFC 8291 §4): a body of 4096 bytes less the 86-byte
/// header, the 16-byte tag and the delimiter.
pub const MAX_PLAINTEXT: usize = 3993;

/// An HKDF output length, as ring wants it.
struct Len(usize);

impl KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

fn expand(prk: &ring::hkdf::Prk, info: &[&[u8]], out: &mut [u8]) -> Result<(), String> {
    prk.expand(info, Len(out.len()))
        .and_then(|okm| okm.fill(out))
        .map_err(|_| "HKDF expansion failed".to_owned())
}

/// Whether `p256dh` is a P-256 public key a browser could hold (an agreement with it works).
pub fn on_curve(p256dh: &[u8]) -> bool {
    let Ok(private) = EphemeralPrivateKey::generate(&ECDH_P256, &SystemRandom::new()) else {
        return false;
    };
    agree_ephemeral(private, &UnparsedPublicKey::new(&ECDH_P256, p256dh), |_| ()).is_ok()
}

/// Encrypts `plaintext` for the subscription whose keys are `p256dh` and `auth`: the whole
/// request body to POST with `Content-Encoding: aes128gcm`.
pub fn encrypt(plaintext: &[u8], p256dh: &[u8], auth: &[u8]) -> Result<Vec<u8>, String> {
    let rng = SystemRandom::new();
    let mut salt = [0u8; 16];
    rng.fill(&mut salt)
        .map_err(|_| "no randomness for the push salt".to_owned())?;
    encrypt_with(plaintext, p256dh, auth, &salt, &rng)
}

/// [`encrypt`] with the salt given and the sender's key drawn from `rng` (RFC 8291's example
/// fixes both).
pub fn encrypt_with(
    plaintext: &[u8],
    p256dh: &[u8],
    auth: &[u8],
    salt: &[u8; 16],
    rng: &dyn SecureRandom,
) -> Result<Vec<u8>, String> {
    if p256dh.len() != P256DH_LEN || p256dh[0] != 0x04 {
        return Err(format!(
            "the subscription's p256dh key must be an uncompressed P-256 point of {P256DH_LEN} bytes"
        ));
    }
    if auth.len() != AUTH_LEN {
        return Err(format!(
            "the subscription's auth secret must be {AUTH_LEN} bytes"
        ));
    }
    if plaintext.len() > MAX_PLAINTEXT {
        return Err(format!(
            "a push payload holds at most {MAX_PLAINTEXT} bytes, this one has {}",
            plaintext.len()
        ));
    }
    let private = EphemeralPrivateKey::generate(&ECDH_P256, rng)
        .map_err(|_| "cannot generate the sender's P-256 key".to_owned())?;
    let sender_public = private
        .compute_public_key()
        .map_err(|_| "cannot compute the sender's P-256 public key".to_owned())?;
    let sender_public = sender_public.as_ref().to_vec();
    let peer = UnparsedPublicKey::new(&ECDH_P256, p256dh);

    // RFC 8291 §3.4: IKM = HKDF(auth, ecdh_secret, "WebPush: info" || 0 || ua_public || as_public).
    let mut ikm = [0u8; 32];
    agree_ephemeral(private, &peer, |shared| {
        let prk = Salt::new(HKDF_SHA256, auth).extract(shared);
        expand(
            &prk,
            &[b"WebPush: info\0", p256dh, &sender_public],
            &mut ikm,
        )
    })
    .map_err(|_| "the subscription's p256dh key is not a point on P-256".to_owned())??;

    // RFC 8188 §2.2, 2.3: the content key and nonce from the salt and IKM.
    let prk = Salt::new(HKDF_SHA256, salt).extract(&ikm);
    let mut cek = [0u8; 16];
    let mut nonce = [0u8; 12];
    expand(&prk, &[b"Content-Encoding: aes128gcm\0"], &mut cek)?;
    expand(&prk, &[b"Content-Encoding: nonce\0"], &mut nonce)?;

    // One record, the last: the payload, then the delimiter 0x02 (no padding).
    let mut record = Vec::with_capacity(plaintext.len() + 1 + AES_128_GCM.tag_len());
    record.extend_from_slice(plaintext);
    record.push(0x02);
    let key = LessSafeKey::new(
        UnboundKey::new(&AES_128_GCM, &cek).map_err(|_| "bad content key".to_owned())?,
    );
    key.seal_in_place_append_tag(
        Nonce::assume_unique_for_key(nonce),
        Aad::empty(),
        &mut record,
    )
    .map_err(|_| "AES-GCM sealing failed".to_owned())?;

    // The header: salt, record size, key id length and the sender's public key as key id.
    let mut body = Vec::with_capacity(16 + 4 + 1 + sender_public.len() + record.len());
    body.extend_from_slice(salt);
    body.extend_from_slice(&RECORD_SIZE.to_be_bytes());
    body.push(u8::try_from(sender_public.len()).expect("65 fits a byte"));
    body.extend_from_slice(&sender_public);
    body.extend_from_slice(&record);
    Ok(body)
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;

    use super::*;

    fn d(s: &str) -> Vec<u8> {
        B64.decode(s).unwrap()
    }

    /// RFC 8291 §5 (the example, with the values of Appendix A): the sender's key pair and the
    /// salt are fixed, so the message must be the RFC's, byte for byte.
    #[test]
    #[allow(deprecated)] // ring's fixed-output random source, made for known-answer tests.
    fn the_rfc_8291_example_encrypts_to_the_rfcs_message() {
        let plaintext = d("V2hlbiBJIGdyb3cgdXAsIEkgd2FudCB0byBiZSBhIHdhdGVybWVsb24");
        assert_eq!(plaintext, b"When I grow up, I want to be a watermelon");
        let as_private = d("yfWPiYE-n46HLnH0KqZOF1fJJU3MYrct3AELtAQ-oRw");
        let ua_public = d(
            "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4",
        );
        let auth = d("BTBZMqHH6r4Tts7J_aSIgg");
        let salt: [u8; 16] = d("DGv6ra1nlYgDCS1FRnbzlw").try_into().unwrap();
        let fixed = ring::test::rand::FixedSliceRandom { bytes: &as_private };
        let body = encrypt_with(&plaintext, &ua_public, &auth, &salt, &fixed).unwrap();
        assert_eq!(
            B64.encode(&body),
            "DGv6ra1nlYgDCS1FRnbzlwAAEABBBP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIgDll6e3vCYLoc\
             InmYWAmS6TlzAC8wEqKK6PBru3jl7A_yl95bQpu6cVPTpK4Mqgkf1CXztLVBSt2Ks3oZwbuwXPXLWyouBWLV\
             WGNWQexSgSxsj_Qulcy4a-fN"
        );
    }

    #[test]
    fn two_messages_differ_in_salt_and_key_and_bad_keys_are_refused() {
        let ua_public = d(
            "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4",
        );
        let auth = d("BTBZMqHH6r4Tts7J_aSIgg");
        let a = encrypt(b"{}", &ua_public, &auth).unwrap();
        let b = encrypt(b"{}", &ua_public, &auth).unwrap();
        assert_ne!(a[..86], b[..86]);
        assert!(encrypt(b"{}", &ua_public[..64], &auth).is_err());
        assert!(encrypt(b"{}", &ua_public, &auth[..15]).is_err());
        let mut off_curve = ua_public.clone();
        off_curve[64] ^= 1;
        let err = encrypt(b"{}", &off_curve, &auth).unwrap_err();
        assert!(err.contains("not a point"), "{err}");
        assert!(encrypt(&[0; MAX_PLAINTEXT + 1], &ua_public, &auth).is_err());
    }
}
