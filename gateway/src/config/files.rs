//! The files a config names: PEM certificates, private keys, and files
//! only their owner may read. An error names the file and the fault, never
//! a key.

use std::path::Path;

/// Every certificate in a PEM file; an error names the file and the fault.
pub fn read_pem_certs(
    path: &Path,
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let certs: Result<Vec<_>, _> = rustls_pemfile::certs(&mut pem.as_slice()).collect();
    let certs = certs.map_err(|e| format!("{} is not PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no certificate", path.display()));
    }
    let mut store = rustls::RootCertStore::empty();
    for c in &certs {
        store
            .add(c.clone())
            .map_err(|e| format!("{} holds an unusable trust anchor: {e}", path.display()))?;
    }
    Ok(certs)
}

/// The private key in a PEM file that only its owner may access; an error
/// names the file and the fault, never the key.
pub fn read_private_key(path: &Path) -> Result<rustls::pki_types::PrivateKeyDer<'static>, String> {
    use rustls::pki_types::pem::PemObject;
    let mode = private_mode(path)?.ok_or_else(|| format!("{} does not exist", path.display()))?;
    if mode & 0o077 != 0 {
        return Err(format!(
            "{} has mode {mode:04o}: group and others must have no access (chmod 600)",
            path.display()
        ));
    }
    rustls::pki_types::PrivateKeyDer::from_pem_file(path)
        .map_err(|e| format!("{} holds no usable private key: {e}", path.display()))
}

/// A file that may be absent (it is then created, private) but, if present,
/// must be a regular file only its owner may access.
pub(super) fn check_private_file(path: &Path) -> Result<(), String> {
    match private_mode(path)? {
        Some(mode) if mode & 0o077 != 0 => Err(format!(
            "{} has mode {mode:04o}: group and others must have no access (chmod 600)",
            path.display()
        )),
        _ => Ok(()),
    }
}

/// The permission bits of a regular file, or `None` if it does not exist.
fn private_mode(path: &Path) -> Result<Option<u32>, String> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => Err(format!("{} is not a regular file", path.display())),
        Ok(m) => Ok(Some(m.permissions().mode() & 0o777)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}
