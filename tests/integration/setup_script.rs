//! `scripts/setup-incus.sh` deciding how to install Incus, in dry runs against fixture roots
//! (`SETUP_INCUS_DRY_RUN=1`, `SETUP_INCUS_ROOT`): needs no root, no network and no Incus, and
//! reads or writes nothing of the machine's own /etc.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

const BOOKWORM: &str =
    "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nNAME=\"Debian GNU/Linux\"\n\
     VERSION_ID=\"12\"\nVERSION=\"12 (bookworm)\"\nVERSION_CODENAME=bookworm\nID=debian\n";
const TRIXIE: &str = "PRETTY_NAME=\"Debian GNU/Linux 13 (trixie)\"\nNAME=\"Debian GNU/Linux\"\n\
     VERSION_ID=\"13\"\nVERSION=\"13 (trixie)\"\nVERSION_CODENAME=trixie\nID=debian\n";
const BULLSEYE: &str =
    "PRETTY_NAME=\"Debian GNU/Linux 11 (bullseye)\"\nNAME=\"Debian GNU/Linux\"\n\
     VERSION_ID=\"11\"\nVERSION=\"11 (bullseye)\"\nVERSION_CODENAME=bullseye\nID=debian\n";
const NOBLE: &str = "PRETTY_NAME=\"Ubuntu 24.04 LTS\"\nNAME=\"Ubuntu\"\nVERSION_ID=\"24.04\"\n\
     VERSION=\"24.04 LTS (Noble Numbat)\"\nVERSION_CODENAME=noble\nID=ubuntu\nID_LIKE=debian\n";

/// A Debian 12 container image's deb822 sources (with the comments its build leaves).
const DEBIAN_SOURCES_BOOKWORM: &str = "Types: deb\n\
     # http://snapshot.debian.org/archive/debian/20250520T000000Z\n\
     URIs: http://mirror.example.org/debian\n\
     Suites: bookworm bookworm-updates\n\
     Components: main\n\
     Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\
     \n\
     Types: deb\n\
     URIs: http://security.example.org/debian-security\n\
     Suites: bookworm-security\n\
     Components: main\n\
     Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n";

const APT_UPDATE: &str = "would-run apt-get update -qq\n";
const INSTALL_FROM_BACKPORTS: &str =
    "would-run apt-get install -y -qq -t bookworm-backports incus\n";
const BACKPORTS_SOURCES: &str = "/etc/apt/sources.list.d/incus-hpa-backports.sources";
const BACKPORTS_LIST: &str = "/etc/apt/sources.list.d/incus-hpa-backports.list";

/// A fixture root: `files` are (path under the root, content).
fn fixture(files: &[(&str, &str)]) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    for (path, content) in files {
        let path = root.path().join(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
    }
    root
}

/// Runs the script in a dry run against `root`: (exit code, stdout, stderr).
///
/// The commands that change the machine are shadowed by stubs that fail, so that a script whose
/// dry run broke (or ignored `SETUP_INCUS_DRY_RUN`) cannot install or start anything, even when
/// the tests run as root.
fn dry_run(root: &Path) -> (i32, String, String) {
    let stubs = tempfile::tempdir().unwrap();
    for command in ["apt-get", "incus", "systemctl", "nohup", "setsid"] {
        let stub = stubs.path().join(command);
        fs::write(
            &stub,
            format!("#!/bin/sh\necho \"stub {command} called: not a dry run\" >&2\nexit 99\n"),
        )
        .unwrap();
        fs::set_permissions(&stub, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![stubs.path().to_path_buf()];
    dirs.extend(std::env::split_paths(&path));
    let out = Command::new("bash")
        .arg("scripts/setup-incus.sh")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("PATH", std::env::join_paths(dirs).unwrap())
        .env("SETUP_INCUS_DRY_RUN", "1")
        .env("SETUP_INCUS_ROOT", root)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("not a dry run"), "{stderr}");
    (
        out.status
            .code()
            .expect("the script exits, it is not killed"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
    )
}

/// The dry run changed nothing under `root`.
fn assert_nothing_written(root: &Path) {
    for path in [BACKPORTS_SOURCES, BACKPORTS_LIST] {
        let path = root.join(path.trim_start_matches('/'));
        assert!(!path.exists(), "the dry run wrote {}", path.display());
    }
}

/// The script stopped with exit code 1, named what it found and said what to do, and would
/// have done nothing.
fn assert_refused(root: &Path, found: &str) {
    let (code, out, err) = dry_run(root);
    assert_eq!(code, 1, "stdout:\n{out}\nstderr:\n{err}");
    assert_eq!(out, "", "nothing would have been done; stderr:\n{err}");
    assert!(err.contains(found), "{found:?} not in:\n{err}");
    assert!(
        err.contains("install Incus 6.0 LTS yourself") && err.contains("then run me again"),
        "no advice in:\n{err}"
    );
    assert_nothing_written(root);
}

#[test]
fn setup_script_deb822_bookworm_adds_backports_from_the_machines_mirror() {
    let root = fixture(&[
        ("etc/os-release", BOOKWORM),
        (
            "etc/apt/sources.list.d/debian.sources",
            DEBIAN_SOURCES_BOOKWORM,
        ),
    ]);
    let (code, out, err) = dry_run(root.path());
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        format!(
            "would-write {BACKPORTS_SOURCES}\n\
             Types: deb\n\
             URIs: http://mirror.example.org/debian\n\
             Suites: bookworm-backports\n\
             Components: main\n\
             Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\
             {APT_UPDATE}{INSTALL_FROM_BACKPORTS}"
        ),
        "{err}"
    );
    assert!(
        err.contains("stopping here, before incusd is started"),
        "{err}"
    );
    assert_nothing_written(root.path());
}

#[test]
fn setup_script_classic_sources_list_bookworm_reuses_the_first_plain_deb_line() {
    let sources_list = "# See https://wiki.debian.org/SourcesList\n\
         # deb cdrom:[Debian GNU/Linux 12.5.0 _Bookworm_ - Official amd64 NETINST]/ bookworm main\n\
         deb-src http://src.example.org/debian/ bookworm main\n\
         deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] \
         http://security.example.org/debian-security bookworm-security main\n\
         \n\
         deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] \
         http://mirror.example.org/debian/ bookworm main non-free-firmware  # the mirror\n\
         deb http://other.example.org/debian/ bookworm main\n\
         deb http://mirror.example.org/debian/ bookworm-updates main\n";
    let root = fixture(&[
        ("etc/os-release", BOOKWORM),
        ("etc/apt/sources.list", sources_list),
    ]);
    let (code, out, err) = dry_run(root.path());
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        format!(
            "would-write {BACKPORTS_LIST}\n\
             deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] \
             http://mirror.example.org/debian/ bookworm-backports main\n\
             {APT_UPDATE}{INSTALL_FROM_BACKPORTS}"
        ),
        "{err}"
    );
    assert_nothing_written(root.path());
}

#[test]
fn setup_script_classic_sources_list_skips_a_cdrom_line_and_keeps_no_options() {
    let sources_list = "deb cdrom:[Debian GNU/Linux 12.5.0 _Bookworm_ - Official amd64 DVD \
         Binary-1 20240210-11:28]/ bookworm contrib main\n\
         \tdeb   http://mirror.example.org/debian  bookworm main\n";
    // A debian.sources without a bookworm stanza does not get in the way.
    let root = fixture(&[
        ("etc/os-release", BOOKWORM),
        ("etc/apt/sources.list", sources_list),
        (
            "etc/apt/sources.list.d/debian.sources",
            "Types: deb\nURIs: http://security.example.org/debian-security\n\
             Suites: bookworm-security\nComponents: main\n",
        ),
    ]);
    let (code, out, err) = dry_run(root.path());
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        format!(
            "would-write {BACKPORTS_LIST}\n\
             deb http://mirror.example.org/debian bookworm-backports main\n\
             {APT_UPDATE}{INSTALL_FROM_BACKPORTS}"
        ),
        "{err}"
    );
}

#[test]
fn setup_script_bookworm_with_backports_configured_writes_no_source() {
    let already = [
        (
            "etc/apt/sources.list.d/incus-hpa-backports.sources",
            "Types: deb\nURIs: http://mirror.example.org/debian\nSuites: bookworm-backports\n\
             Components: main\n",
        ),
        (
            "etc/apt/sources.list",
            "deb http://mirror.example.org/debian bookworm main\n\
             deb http://mirror.example.org/debian bookworm-backports main\n",
        ),
        (
            "etc/apt/sources.list.d/backports.list",
            "deb http://mirror.example.org/debian bookworm-backports main contrib\n",
        ),
    ];
    for (path, content) in already {
        let root = fixture(&[
            ("etc/os-release", BOOKWORM),
            (
                "etc/apt/sources.list.d/debian.sources",
                DEBIAN_SOURCES_BOOKWORM,
            ),
            (path, content),
        ]);
        let (code, out, err) = dry_run(root.path());
        assert_eq!(code, 0, "{path}: {err}");
        assert_eq!(
            out,
            format!("{APT_UPDATE}{INSTALL_FROM_BACKPORTS}"),
            "{path}: {err}"
        );
    }
}

#[test]
fn setup_script_bookworm_ignores_backports_in_comments_and_unread_files() {
    let root = fixture(&[
        ("etc/os-release", BOOKWORM),
        (
            "etc/apt/sources.list.d/debian.sources",
            DEBIAN_SOURCES_BOOKWORM,
        ),
        (
            "etc/apt/sources.list",
            "# deb http://mirror.example.org/debian bookworm-backports main\n",
        ),
        (
            "etc/apt/sources.list.d/backports.list.disabled",
            "deb http://mirror.example.org/debian bookworm-backports main\n",
        ),
    ]);
    let (code, out, err) = dry_run(root.path());
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with(&format!("would-write {BACKPORTS_SOURCES}\n")),
        "{out}"
    );
    assert!(out.ends_with(INSTALL_FROM_BACKPORTS), "{out}");
}

#[test]
fn setup_script_trixie_installs_from_the_main_archive() {
    let root = fixture(&[
        ("etc/os-release", TRIXIE),
        (
            "etc/apt/sources.list.d/debian.sources",
            "Types: deb\nURIs: http://mirror.example.org/debian\n\
             Suites: trixie trixie-updates\nComponents: main\n",
        ),
    ]);
    let (code, out, err) = dry_run(root.path());
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        format!("{APT_UPDATE}would-run apt-get install -y -qq incus\n"),
        "{err}"
    );
    assert!(!err.contains("backports"), "{err}");
}

#[test]
fn setup_script_refuses_debian_11() {
    let root = fixture(&[
        ("etc/os-release", BULLSEYE),
        (
            "etc/apt/sources.list",
            "deb http://mirror.example.org/debian bullseye main\n",
        ),
    ]);
    assert_refused(root.path(), "ID=debian VERSION_CODENAME=bullseye");
}

#[test]
fn setup_script_refuses_ubuntu() {
    let root = fixture(&[
        ("etc/os-release", NOBLE),
        (
            "etc/apt/sources.list",
            "deb http://archive.example.org/ubuntu noble main\n",
        ),
    ]);
    assert_refused(root.path(), "ID=ubuntu VERSION_CODENAME=noble");
}

#[test]
fn setup_script_refuses_a_machine_without_os_release() {
    let root = fixture(&[(
        "etc/apt/sources.list",
        "deb http://mirror.example.org/debian bookworm main\n",
    )]);
    assert_refused(root.path(), "found no /etc/os-release");
}

#[test]
fn setup_script_refuses_bookworm_without_a_mirror_to_reuse() {
    let root = fixture(&[
        ("etc/os-release", BOOKWORM),
        (
            "etc/apt/sources.list",
            "# deb http://mirror.example.org/debian bookworm main\n\
             deb-src http://mirror.example.org/debian bookworm main\n\
             deb http://security.example.org/debian-security bookworm-security main\n",
        ),
    ]);
    assert_refused(root.path(), "ID=debian VERSION_CODENAME=bookworm");
}
