//! The per-session secret that authenticates every link.

use std::fmt;

use rand::RngCore;

use crate::TransportError;

/// Environment variable through which a parent hands the secret to its children.
pub const SECRET_ENV: &str = "TREECAST_SECRET";

/// A 32-byte random key shared by every process of one network.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret([u8; 32]);

impl Secret {
    /// A fresh random secret from the OS random source.
    pub fn generate() -> Self {
        let mut key = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut key);
        Secret(key)
    }

    /// Wraps raw key bytes (tests use fixed keys).
    pub fn from_bytes(key: [u8; 32]) -> Self {
        Secret(key)
    }

    /// The key bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// An HMAC-SHA256 under this key, `label` already fed (what tells one use of
    /// the key from another).
    pub(crate) fn mac(&self, label: &[u8]) -> hmac::Hmac<sha2::Sha256> {
        use hmac::Mac;
        // new_from_slice only fails for invalid key lengths, and HMAC accepts any length.
        let mut m = match hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.0) {
            Ok(m) => m,
            Err(_) => unreachable!("HMAC accepts keys of any length"),
        };
        m.update(label);
        m
    }

    /// The hex text put into [`SECRET_ENV`].
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses the hex text of [`Secret::to_hex`].
    ///
    /// # Errors
    /// [`TransportError::Secret`] when the text is not 64 hex digits.
    pub fn from_hex(text: &str) -> Result<Self, TransportError> {
        let bytes = hex::decode(text.trim())
            .map_err(|e| TransportError::Secret { var: SECRET_ENV, reason: e.to_string() })?;
        let key: [u8; 32] = bytes.try_into().map_err(|b: Vec<u8>| TransportError::Secret {
            var: SECRET_ENV,
            reason: format!("expected 32 bytes (64 hex digits), got {}", b.len()),
        })?;
        Ok(Secret(key))
    }

    /// Reads the secret from [`SECRET_ENV`].
    ///
    /// # Errors
    /// [`TransportError::Secret`] when the variable is unset or malformed.
    pub fn from_env() -> Result<Self, TransportError> {
        let text = std::env::var(SECRET_ENV)
            .map_err(|_| TransportError::Secret { var: SECRET_ENV, reason: "not set".into() })?;
        Secret::from_hex(&text)
    }
}

impl fmt::Debug for Secret {
    /// Never prints the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_errors() {
        let s = Secret::generate();
        assert_eq!(Secret::from_hex(&s.to_hex()).unwrap(), s);
        assert!(Secret::from_hex("abcd").is_err());
        assert!(Secret::from_hex("zz").is_err());
        assert_eq!(format!("{s:?}"), "Secret(..)");
    }
}
