//! The binary's command line: `validate` exit codes and located messages, examples, help.

use std::path::Path;
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_incus-hpa"))
}

fn validate(text: &str) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("desired-state.toml");
    std::fs::write(&file, text).unwrap();
    let out = bin()
        .args(["validate", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).replace(&*file.to_string_lossy(), "FILE");
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
    )
}

#[test]
fn validate_accepts_a_good_file() {
    let (code, out, err) = validate(
        "[groups.web]\nmax = 2\nmemory_threshold = 70\nimage = \"busybox\"\n\
         [groups.web.config]\n\"limits.memory\" = \"64MiB\"\n",
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("OK, 1 group(s)"));
}

#[test]
fn validate_reports_every_error_with_its_place() {
    let (code, _, err) =
        validate("[groups.web]\nmin = 3\nmax = 2\nmemory_threshold = 0\nimage = \"b\"\n");
    assert_eq!(code, 1);
    assert!(
        err.contains("FILE:2:7: error: groups.web.min: min (3) is greater than max (2)"),
        "{err}"
    );
    assert!(
        err.contains("FILE:4:20: error: groups.web.memory_threshold:"),
        "{err}"
    );
}

#[test]
fn validate_warns_about_a_missing_memory_limit() {
    let (code, _, err) = validate("[groups.web]\nmax = 2\nmemory_threshold = 70\nimage = \"b\"\n");
    assert_eq!(code, 0);
    assert!(
        err.contains("warning: groups.web.config: no \"limits.memory\""),
        "{err}"
    );
}

#[test]
fn validate_names_an_unreadable_file() {
    let out = bin()
        .args(["validate", "--config", "/nonexistent/x.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("/nonexistent/x.toml: error: cannot read the file"));
}

#[test]
fn every_example_validates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let out = bin()
                .args(["validate", "--config"])
                .arg(&path)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            n += 1;
        }
    }
    assert!(n >= 1, "no examples in {}", dir.display());
}

#[test]
fn help_and_version() {
    let out = bin().arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for cmd in ["run", "validate", "plan", "--incus-socket"] {
        assert!(help.contains(cmd), "{help}");
    }
    let out = bin().arg("--version").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("incus-hpa "));
}

#[test]
fn run_refuses_a_file_others_can_write() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("d.toml");
    std::fs::write(&file, "").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = bin()
        .args(["run", "--incus-socket", "/nonexistent.socket", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78), "EX_CONFIG");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "{} is writable by its group and others: refusing it",
            file.display()
        )),
        "{err}"
    );
}
