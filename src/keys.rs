//! API keys and their roles: what `HOLDFAST_API_KEYS` configures, what
//! `holdfast keys new` creates, and what the HTTP layer checks tokens against.
//!
//! Keys are configured as `name:role:sha256-hex-of-token`, so no plaintext
//! token is stored.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Everything.
    Admin,
    /// Reads assets and events; holds; reads and releases its own reservations.
    Storefront,
    /// Reads; commits; releases; refunds.
    Payments,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Admin, Role::Storefront, Role::Payments];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Storefront => "storefront",
            Role::Payments => "payments",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// The name every caller shares in open mode (no keys configured). No key
/// may carry it, so that no client can act in that scope.
pub const OPEN_MODE_NAME: &str = "-";

/// One configured API key.
#[derive(Clone)]
pub struct ApiKey {
    pub name: String,
    pub role: Role,
    digest: [u8; 32],
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKey({}:{})", self.name, self.role.as_str())
    }
}

/// The configured keys; empty means open mode.
#[derive(Debug, Clone, Default)]
pub struct KeyRing {
    keys: Vec<ApiKey>,
}

/// Whether `name` may name a key (and so a caller's scope): letters, digits,
/// '.', '_' and '-', at least one.
pub fn is_key_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

pub fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Lower-case hexadecimal, two digits a byte.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    text
}

impl KeyRing {
    /// Entries `name:role:sha256hex`, separated by commas or new lines;
    /// blank lines and `#` comments are ignored. Two entries may share a name
    /// and role (that is how a key is rotated), never a name with two roles.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut keys: Vec<ApiKey> = Vec::new();
        for entry in text.split([',', '\n']).map(str::trim) {
            if entry.is_empty() || entry.starts_with('#') {
                continue;
            }
            let mut parts = entry.split(':');
            let (Some(name), Some(role), Some(hash), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return Err("an entry is not name:role:sha256-hex".into());
            };
            if !is_key_name(name) {
                return Err(format!(
                    "key name {name:?} must be letters, digits, '.', '_' or '-'"
                ));
            }
            if name == OPEN_MODE_NAME {
                return Err(format!(
                    "key name {name:?} is the shared caller of open mode; choose another name"
                ));
            }
            let role = Role::parse(role).ok_or_else(|| {
                format!("key {name}: role {role:?} is not admin, storefront or payments")
            })?;
            if let Some(other) = keys.iter().find(|k| k.name == name && k.role != role) {
                return Err(format!(
                    "key {name} is given two roles, {} and {}: a name has one role \
                     (entries sharing a name rotate one key)",
                    other.role.as_str(),
                    role.as_str()
                ));
            }
            let digest = decode_hex(hash)
                .ok_or_else(|| format!("key {name}: the hash is not 64 hex digits"))?;
            keys.push(ApiKey {
                name: name.to_owned(),
                role,
                digest,
            });
        }
        Ok(Self { keys })
    }

    pub fn is_open(&self) -> bool {
        self.keys.is_empty()
    }

    /// Whether `name` names a storefront client: a storefront key's name,
    /// or in open mode the one open client.
    pub fn is_storefront(&self, name: &str) -> bool {
        match self.is_open() {
            true => name == OPEN_MODE_NAME,
            false => self
                .keys
                .iter()
                .any(|k| k.name == name && k.role == Role::Storefront),
        }
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The key whose hash matches `token`. Every key is compared in constant
    /// time, so the answer's timing says nothing about the keys.
    pub fn authenticate(&self, token: &str) -> Option<&ApiKey> {
        let presented = digest(token);
        let mut found = None;
        for key in &self.keys {
            if bool::from(key.digest.ct_eq(&presented)) {
                found = Some(key);
            }
        }
        found
    }
}

fn decode_hex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// A new random token and the entry that configures it.
pub fn new_key(name: &str, role: Role) -> Result<(String, String), String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness available: {e}"))?;
    use base64::Engine;
    let token = format!(
        "hf_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    );
    let entry = format!("{name}:{}:{}", role.as_str(), hex(&digest(&token)));
    KeyRing::parse(&entry)?;
    Ok((token, entry))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stored fingerprints and key entries are in this spelling: it never
    /// changes.
    #[test]
    fn hex_is_two_lower_case_digits_a_byte() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        assert_eq!(hex(&digest("x")), format!("{:x}", Sha256::digest(b"x")));
    }

    #[test]
    fn keys_parse_and_authenticate_by_hash() {
        let (token, entry) = new_key("shop-1", Role::Storefront).unwrap();
        assert!(token.starts_with("hf_"));
        let (other, other_entry) = new_key("pay", Role::Payments).unwrap();
        let ring = KeyRing::parse(&format!("# keys\n{entry}\n{other_entry}, ")).unwrap();
        assert_eq!(ring.len(), 2);
        let key = ring.authenticate(&token).unwrap();
        assert_eq!((key.name.as_str(), key.role), ("shop-1", Role::Storefront));
        assert_eq!(ring.authenticate(&other).unwrap().role, Role::Payments);
        assert!(ring.authenticate("hf_wrong").is_none());
        assert!(!entry.contains(&token), "the entry never holds the token");
    }

    #[test]
    fn bad_entries_are_named() {
        let zeros = "0".repeat(64);
        assert!(KeyRing::parse("a:admin").is_err());
        assert!(KeyRing::parse(&format!("a:root:{zeros}")).is_err());
        assert!(KeyRing::parse("a:admin:abc").is_err());
        assert!(KeyRing::parse(&format!("a b:admin:{zeros}")).is_err());
        assert!(KeyRing::parse("").unwrap().is_open());
        let open = KeyRing::parse(&format!("-:admin:{zeros}")).unwrap_err();
        assert!(open.contains("open mode"), "{open}");
        assert!(new_key("-", Role::Admin).is_err());
        let two = KeyRing::parse(&format!("a:admin:{zeros},a:storefront:{}", "1".repeat(64)))
            .unwrap_err();
        assert!(two.contains("key a") && two.contains("two roles"), "{two}");
    }

    #[test]
    fn one_name_and_role_may_rotate() {
        let ring = KeyRing::parse(&format!(
            "a:payments:{},a:payments:{}",
            "0".repeat(64),
            "1".repeat(64)
        ))
        .unwrap();
        assert_eq!(ring.len(), 2);
    }
}
