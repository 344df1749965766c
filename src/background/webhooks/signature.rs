//! Standard Webhooks signatures: `webhook-signature: v1,<base64(HMAC-SHA256(key, id.ts.body))>`.
//! The signed text is exactly the bytes sent; nothing may be re-serialised after signing.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, KeyInit as _, Mac as _};
use sha2_hmac::Sha256;

use crate::domain::webhook::WebhookSecret;

/// The `webhook-signature` value for a message `id` sent at `timestamp` (Unix seconds).
pub fn sign(secret: &WebhookSecret, id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac =
        <Hmac<Sha256>>::new_from_slice(secret.key()).expect("HMAC takes a key of any length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification's reference libraries.
    #[test]
    fn the_reference_example_signs_as_the_specification_says() {
        let secret =
            WebhookSecret::parse("secret", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(
            sign(
                &secret,
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1614265330,
                br#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }
}
