//! The program rule on fixture trees: at load ([`check_program`]) and at every run ([`read`]),
//! on what is run: a program replaced after its check is not run, a script's interpreter is
//! held to the program's rules, and a binary that may only be executed (mode 0711) runs.
//!
//! These give files to uid 65534, rely on files being root's, or play uid 65534 in a thread
//! of their own (credentials are a thread's own on Linux), so they need root (as CI and this
//! project's machines run the tests): they fail loudly otherwise.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;

fn need_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "these tests need root (files must be root's, and chown to 65534): run them as root"
    );
}

/// A program `dir/prog` (0755) in a fresh directory (0755) under `/tmp`.
fn program() -> (tempfile::TempDir, PathBuf) {
    need_root();
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let prog = dir.path().join("prog");
    write(&prog, "#!/bin/sh\necho 1\n", 0o755);
    (dir, prog)
}

fn write(path: &Path, text: &str, mode: u32) {
    fs::write(path, text).unwrap();
    chmod(path, mode);
}

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

fn chown(p: &Path, uid: u32) {
    std::os::unix::fs::chown(p, Some(uid), None).unwrap();
}

fn check(p: &Path) -> Result<(), String> {
    check_program(&p.display().to_string())
}

/// The signal that runs `program` with `args`.
fn spec(program: &Path, args: &[&str]) -> ExternalSpec {
    let mut command = vec![program.display().to_string()];
    command.extend(args.iter().map(|a| (*a).to_owned()));
    ExternalSpec {
        command,
        target: 1.0,
        timeout: Duration::from_secs(30),
    }
}

/// [`read`], again while the program is busy: another test's fork may hold a file just
/// written open for writing for a moment (ETXTBSY).
async fn run(spec: &ExternalSpec) -> Result<f64, ExternalError> {
    let mut tries = 0;
    loop {
        match read(spec).await {
            Err(ExternalError::Spawn { source, .. })
                if source.raw_os_error() == Some(rustix::io::Errno::TXTBSY.raw_os_error())
                    && tries < 100 =>
            {
                tries += 1;
                tokio::task::yield_now().await;
            }
            other => return other,
        }
    }
}

/// Runs `f` in a thread of its own as uid and gid 65534, with a tokio runtime of its own.
fn as_nobody<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    need_root();
    std::thread::spawn(move || {
        let gid = rustix::process::Gid::from_raw(65534);
        rustix::thread::set_thread_res_gid(gid, gid, gid).unwrap();
        let uid = rustix::process::Uid::from_raw(65534);
        rustix::thread::set_thread_res_uid(uid, uid, uid).unwrap();
        f()
    })
    .join()
    .unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_root_program_in_root_directories_is_accepted() {
    let (_dir, prog) = program();
    assert_eq!(check(&prog), Ok(()));
    assert_eq!(check_program("/bin/sh"), Ok(()));
}

#[test]
fn a_relative_path_is_refused() {
    for path in ["queue-depth", "bin/queue-depth", "./prog", ""] {
        let e = check_program(path).unwrap_err();
        assert!(e.contains("is not an absolute path: name it from /"), "{e}");
    }
}

#[test]
fn a_program_others_can_write_is_refused() {
    let (dir, prog) = program();
    let p = prog.display();
    chmod(&prog, 0o775);
    assert_eq!(
        check(&prog),
        Err(format!(
            "{p} is writable by its group: refusing it (chmod g-w {p})"
        ))
    );
    chmod(&prog, 0o757);
    assert_eq!(
        check(&prog),
        Err(format!(
            "{p} is writable by others: refusing it (chmod o-w {p})"
        ))
    );
    chmod(&prog, 0o755);

    // Its directory, world-writable: refused unless sticky.
    let d = dir.path().display();
    chmod(dir.path(), 0o777);
    assert_eq!(
        check(&prog),
        Err(format!(
            "{d} is writable by its group and others: refusing it (chmod go-w {d})"
        ))
    );
    chmod(dir.path(), 0o1777);
    assert_eq!(check(&prog), Ok(()));
}

#[test]
fn a_program_or_directory_another_user_owns_is_refused() {
    let (dir, prog) = program();
    let p = prog.display();
    chown(&prog, 65534);
    let e = check(&prog).unwrap_err();
    assert!(e.starts_with(&format!("{p} is owned by uid 65534")), "{e}");
    assert!(e.ends_with(&format!("(chown root {p})")), "{e}");
    chown(&prog, 0);

    chown(dir.path(), 65534);
    let d = dir.path().display();
    let e = check(&prog).unwrap_err();
    assert!(e.starts_with(&format!("{d} is owned by uid 65534")), "{e}");
    assert!(e.ends_with(&format!("(chown root {d})")), "{e}");
}

#[test]
fn not_a_regular_executable_file_is_refused() {
    let (dir, prog) = program();
    let d = dir.path().display();
    assert_eq!(
        check(dir.path()),
        Err(format!("{d} is not a regular file (it is a directory)"))
    );
    chmod(&prog, 0o644);
    let p = prog.display();
    assert_eq!(
        check(&prog),
        Err(format!(
            "{p} is not executable: refusing it (chmod 755 {p})"
        ))
    );
    assert_eq!(
        check(&dir.path().join("missing")),
        Err(format!("{d}/missing: no such file or directory"))
    );
}

#[tokio::test]
async fn a_program_replaced_after_its_check_is_not_run() {
    need_root();
    // A shared directory, like /tmp: anyone may add a file, only its owner remove it.
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    chmod(dir.path(), 0o1777);
    let prog = dir.path().join("queue-depth");
    write(&prog, "#!/bin/sh\necho 1\n", 0o755);
    // What loading the file checks.
    assert_eq!(check(&prog), Ok(()));
    // Root's program goes (a cleaner of old files, say), and another user puts theirs there.
    let ran = dir.path().join("ran");
    fs::remove_file(&prog).unwrap();
    let theirs = format!("#!/bin/sh\ntouch {}\necho 666\n", ran.display());
    write(&prog, &theirs, 0o755);
    chown(&prog, 65534);
    let result = run(&spec(&prog, &[])).await;
    assert!(!ran.exists(), "the program put in its place ran");
    let e = result.unwrap_err();
    let p = prog.display();
    assert_eq!(
        e.to_string(),
        format!(
            "cannot run {p}: {p} is owned by uid 65534, not by root or the daemon's user: \
             refusing it (chown root {p})"
        )
    );
}

#[tokio::test]
async fn a_script_whose_interpreter_others_may_change_is_refused() {
    let (dir, prog) = program();
    let bin = dir.path().join("bin");
    fs::create_dir(&bin).unwrap();
    chmod(&bin, 0o755);
    let interpreter = bin.join("sh");
    fs::copy("/bin/sh", &interpreter).unwrap();
    let (i, b, p) = (interpreter.display(), bin.display(), prog.display());
    write(&prog, &format!("#!{i}\necho 1\n"), 0o755);
    assert_eq!(check(&prog), Ok(()));
    assert_eq!(run(&spec(&prog, &[])).await.unwrap(), 1.0);
    let refused = |why: String| format!("the interpreter of {p} (#!{i}): {why}");

    chmod(&interpreter, 0o757);
    let why = refused(format!(
        "{i} is writable by others: refusing it (chmod o-w {i})"
    ));
    assert_eq!(check(&prog), Err(why.clone()));
    let e = run(&spec(&prog, &[])).await.unwrap_err();
    assert_eq!(e.to_string(), format!("cannot run {p}: {why}"));
    chmod(&interpreter, 0o755);

    chown(&interpreter, 65534);
    let e = check(&prog).unwrap_err();
    assert!(
        e.starts_with(&refused(format!("{i} is owned by uid 65534"))),
        "{e}"
    );
    chown(&interpreter, 0);

    chmod(&bin, 0o777);
    let why = format!("{b} is writable by its group and others: refusing it (chmod go-w {b})");
    assert_eq!(check(&prog), Err(refused(why)));
    chmod(&bin, 0o755);

    // Its interpreter named relative to where it would run: refused too.
    write(&prog, "#!sh\necho 1\n", 0o755);
    let e = check(&prog).unwrap_err();
    assert!(
        e.starts_with(&format!(
            "the interpreter of {p} (#!sh) is not an absolute path"
        )),
        "{e}"
    );
}

#[test]
fn a_binary_that_may_only_be_executed_is_accepted_and_runs() {
    need_root();
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    chmod(dir.path(), 0o755);
    let prog = dir.path().join("echo");
    fs::copy("/bin/echo", &prog).unwrap();
    // Root's, and others may execute it but not read it.
    chmod(&prog, 0o711);
    let (checked, value) = as_nobody(move || {
        let checked = check(&prog);
        let value = runtime().block_on(run(&spec(&prog, &["7"])));
        (checked, value.map_err(|e| e.to_string()))
    });
    assert_eq!(checked, Ok(()));
    assert_eq!(value, Ok(7.0));
}

#[test]
fn a_script_the_daemon_may_not_read_never_starts_its_interpreter() {
    let (dir, prog) = program();
    // An interpreter that says it ran, owned by another user: refused had it been seen.
    let ran = dir.path().join("ran");
    let interpreter = dir.path().join("interpreter");
    write(
        &interpreter,
        &format!("#!/bin/sh\ntouch {}\n", ran.display()),
        0o755,
    );
    chown(&interpreter, 65534);
    write(
        &prog,
        &format!("#!{}\necho 1\n", interpreter.display()),
        0o711,
    );
    let p = prog.display().to_string();
    let result = as_nobody(move || {
        let spec = spec(Path::new(&p), &[]);
        runtime().block_on(run(&spec)).map_err(|e| e.to_string())
    });
    assert!(!ran.exists(), "its interpreter ran");
    let e = result.unwrap_err();
    assert!(e.contains("not readable by the daemon's user"), "{e}");
}

#[tokio::test]
async fn a_program_run_with_input_reads_it_on_stdin() {
    let (dir, prog) = program();
    let out = dir.path().join("out");
    write(
        &prog,
        &format!(
            "#!/bin/sh\ncat > {}\n[ -s {} ] || {{ echo empty >&2; exit 3; }}\n",
            out.display(),
            out.display()
        ),
        0o755,
    );
    let command = vec![prog.display().to_string()];
    let input = b"{\"group\":\"web\"}\n";
    run_with_input(&command, Duration::from_secs(10), input)
        .await
        .unwrap();
    assert_eq!(fs::read(&out).unwrap(), input);
    // Nothing given: an exit status other than 0, with its stderr.
    let e = run_with_input(&command, Duration::from_secs(10), b"")
        .await
        .unwrap_err();
    assert_eq!(e.to_string(), "exited with code 3: empty");
    // A program that does not read its input still succeeds.
    write(&prog, "#!/bin/sh\nexit 0\n", 0o755);
    let big = vec![b'x'; 1 << 20];
    run_with_input(&command, Duration::from_secs(10), &big)
        .await
        .unwrap();
}
