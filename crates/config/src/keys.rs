//! Publisher identity keys for the authenticated key exchange (the ldm7 extension of §3.7,
//! `ldm7_fmtp_proto::mac`): an Ed25519 key pair in PEM files — the private key as PKCS#8
//! (`-----BEGIN PRIVATE KEY-----`, readable by its owner only), the public key as
//! SubjectPublicKeyInfo (`-----BEGIN PUBLIC KEY-----`), which subscribers pin.

use std::io::Write;
use std::path::{Path, PathBuf};

use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::{SigningKey, VerifyingKey};

/// Why a key file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a key of the expected kind.
    #[error("{path}: not {expected} ({detail})")]
    Format {
        /// The file.
        path: PathBuf,
        /// What it should hold.
        expected: &'static str,
        /// What the decoder said.
        detail: String,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> KeyFileError + '_ {
    move |source| KeyFileError::Io { path: path.to_owned(), source }
}

fn read_text(path: &Path) -> Result<String, KeyFileError> {
    std::fs::read_to_string(path).map_err(|source| KeyFileError::Io { path: path.to_owned(), source })
}

/// Reads a publisher's identity (PKCS#8 PEM Ed25519 private key).
pub fn read_identity(path: &Path) -> Result<SigningKey, KeyFileError> {
    let text = zeroize::Zeroizing::new(read_text(path)?);
    SigningKey::from_pkcs8_pem(&text).map_err(|error| KeyFileError::Format {
        path: path.to_owned(),
        expected: "an Ed25519 private key in PEM (PKCS#8; make one with `ldm7 fmtp keygen`)",
        detail: error.to_string(),
    })
}

/// Reads a pinned publisher key (PEM SubjectPublicKeyInfo Ed25519 public key).
pub fn read_pin(path: &Path) -> Result<VerifyingKey, KeyFileError> {
    VerifyingKey::from_public_key_pem(&read_text(path)?).map_err(|error| KeyFileError::Format {
        path: path.to_owned(),
        expected: "an Ed25519 public key in PEM (the `.pub` file `ldm7 fmtp keygen` writes)",
        detail: error.to_string(),
    })
}

/// Makes a fresh identity: writes the private key to `path` (created new, mode 0600) and the
/// public key to `path` + `.pub`; returns the public key file's path.
pub fn generate_identity(path: &Path) -> Result<PathBuf, KeyFileError> {
    let key = SigningKey::generate(&mut rand_core::OsRng);
    let private = key.to_pkcs8_pem(LineEnding::LF).map_err(|error| KeyFileError::Format {
        path: path.to_owned(),
        expected: "an encodable key",
        detail: error.to_string(),
    })?;
    let public = key.verifying_key().to_public_key_pem(LineEnding::LF).map_err(|error| KeyFileError::Format {
        path: path.to_owned(),
        expected: "an encodable key",
        detail: error.to_string(),
    })?;
    let public_path = PathBuf::from(format!("{}.pub", path.display()));
    let mut file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(io(path))?
    };
    file.write_all(private.as_bytes()).and_then(|()| file.sync_all()).map_err(io(path))?;
    std::fs::write(&public_path, public).map_err(io(&public_path))?;
    Ok(public_path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_identity_reads_back_and_its_public_key_pins_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("publisher.key");
        let public = generate_identity(&path).expect("generate");
        let identity = read_identity(&path).expect("identity");
        assert_eq!(read_pin(&public).expect("pin"), identity.verifying_key());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777, 0o600);
        assert!(matches!(generate_identity(&path), Err(KeyFileError::Io { .. })), "never overwritten");
        assert!(matches!(read_identity(&public), Err(KeyFileError::Format { .. })));
        assert!(matches!(read_pin(&path), Err(KeyFileError::Format { .. })));
    }
}
