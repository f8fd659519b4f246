//! The gateway's key file: made once with mode 0600, loaded again as the
//! same key, and refused when others could read or replace it.

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::sync::Barrier;
use std::thread;

use talos_certs::{verify, GatewayKey, KeyError, Kind, MAX_KEY_FILE_LEN};

fn mode(path: &std::path::Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

#[test]
fn created_0600_and_loaded_as_the_same_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.key");
    let made = GatewayKey::load_or_create(&path).unwrap();
    assert_eq!(mode(&path), 0o600);
    // Only the key file is left behind, no temporary file.
    let names: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["gateway.key"]);

    let loaded = GatewayKey::load_or_create(&path).unwrap();
    assert_eq!(loaded.public_key(), made.public_key());
    assert_eq!(loaded.key_id(), made.key_id());
    // What one signs, the other's public key verifies.
    let signed = loaded.sign(Kind::Batch, b"{}".to_vec());
    verify(&made.public_key(), &signed).unwrap();

    // Owner-only read access is enough.
    fs::set_permissions(&path, fs::Permissions::from_mode(0o400)).unwrap();
    assert_eq!(
        GatewayKey::load_or_create(&path).unwrap().public_key(),
        made.public_key()
    );
}

#[test]
fn a_file_others_can_access_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.key");
    GatewayKey::load_or_create(&path).unwrap();
    for bad in [0o644, 0o640, 0o604, 0o620, 0o602, 0o610] {
        fs::set_permissions(&path, fs::Permissions::from_mode(bad)).unwrap();
        let err = GatewayKey::load_or_create(&path).unwrap_err();
        match &err {
            KeyError::Permissions { path: p, mode } => {
                assert_eq!(p, &path);
                assert_eq!(*mode, bad);
            }
            other => panic!("{bad:o}: {other:?}"),
        }
        let text = err.to_string();
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(text.contains(&format!("{bad:04o}")), "{text}");
    }
}

#[test]
fn what_is_not_a_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let path = dir.path().join(name);
        fs::write(&path, bytes).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        path
    };

    let garbage = write("garbage.key", b"not a key");
    assert!(matches!(
        GatewayKey::load_or_create(&garbage),
        Err(KeyError::Rejected { path, .. }) if path == garbage
    ));
    let empty = write("empty.key", b"");
    assert!(matches!(
        GatewayKey::load_or_create(&empty),
        Err(KeyError::Rejected { .. })
    ));
    let large = write("large.key", &vec![0x30; MAX_KEY_FILE_LEN + 1]);
    assert!(matches!(
        GatewayKey::load_or_create(&large),
        Err(KeyError::TooLarge { path, .. }) if path == large
    ));
    // A P-256 key is not an Ed25519 key.
    let p256 = aws_lc_rs::signature::EcdsaKeyPair::generate_pkcs8(
        &aws_lc_rs::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
        &aws_lc_rs::rand::SystemRandom::new(),
    )
    .unwrap();
    let p256 = write("p256.key", p256.as_ref());
    assert!(matches!(
        GatewayKey::load_or_create(&p256),
        Err(KeyError::Rejected { .. })
    ));
    assert!(matches!(
        GatewayKey::load_or_create(dir.path()),
        Err(KeyError::NotAFile { .. })
    ));
    // A missing directory is named in the error.
    let nowhere = dir.path().join("missing").join("gateway.key");
    let err = GatewayKey::load_or_create(&nowhere).unwrap_err();
    assert!(matches!(err, KeyError::Io { .. }), "{err:?}");
}

#[test]
fn a_pkcs8_v1_key_is_loaded() {
    // The form `openssl genpkey -algorithm ed25519 -outform DER` writes.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.key");
    let pair = aws_lc_rs::signature::Ed25519KeyPair::generate().unwrap();
    fs::write(&path, pair.to_pkcs8v1().unwrap().as_ref()).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    let key = GatewayKey::load_or_create(&path).unwrap();
    use aws_lc_rs::signature::KeyPair as _;
    assert_eq!(&key.public_key()[..], pair.public_key().as_ref());
}

#[test]
fn concurrent_starts_share_one_key() {
    const THREADS: usize = 8;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.key");
    let start = Barrier::new(THREADS);
    let keys: Vec<[u8; 32]> = thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                scope.spawn(|| {
                    start.wait();
                    GatewayKey::load_or_create(&path).unwrap().public_key()
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    assert!(keys.iter().all(|k| k == &keys[0]));
    assert_eq!(
        GatewayKey::load_or_create(&path).unwrap().public_key(),
        keys[0]
    );
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn debug_shows_only_the_key_id() {
    let key = GatewayKey::generate().unwrap();
    assert_eq!(
        format!("{key:?}"),
        format!("GatewayKey(Ed25519, key_id {})", key.key_id())
    );
}
