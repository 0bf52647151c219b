//! The safe open on real fixture trees: what is accepted, what is refused and how it is named.
//!
//! Trees live under `/tmp` (root-owned and sticky, so it passes); the tree's own directory
//! belongs to whoever runs the tests, which is the `allowed_uid` passed. Cases that need
//! another owner (uid 12345) call `chown`, which only root can do: they are `#[ignore]`d and
//! fail loudly when run with `--include-ignored` by anyone else.

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::super::safe_open::{open_relative_to, MAX_SYMLINKS};
use super::{check_permissions, open_checked};
use crate::config::{load_checked, Severity};

const TEXT: &str = "# desired state\n";
const OTHER: u32 = 12345;

/// A fixture tree in a fresh directory under `/tmp`.
struct Tree {
    dir: tempfile::TempDir,
    /// Who runs the tests (owner of the tree): the daemon's user in these tests.
    uid: u32,
}

impl Tree {
    fn new() -> Self {
        // Under /tmp whatever TMPDIR says: every directory above the tree must pass too.
        let dir = tempfile::tempdir_in("/tmp").expect("a temporary directory in /tmp");
        let uid = fs::metadata(dir.path()).expect("stat the tree").uid();
        Tree { dir, uid }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root().join(rel)
    }

    /// A directory, mode 0755 whatever the umask.
    fn mkdir(&self, rel: &str) -> PathBuf {
        let p = self.path(rel);
        fs::create_dir(&p).expect("mkdir");
        self.chmod(rel, 0o755);
        p
    }

    /// A file holding [`TEXT`], mode 0644 whatever the umask.
    fn file(&self, rel: &str) -> PathBuf {
        let p = self.path(rel);
        fs::write(&p, TEXT).expect("write");
        self.chmod(rel, 0o644);
        p
    }

    fn link(&self, rel: &str, target: impl AsRef<Path>) -> PathBuf {
        let p = self.path(rel);
        symlink(target, &p).expect("symlink");
        p
    }

    fn chmod(&self, rel: &str, mode: u32) {
        fs::set_permissions(self.path(rel), fs::Permissions::from_mode(mode)).expect("chmod");
    }

    /// `a/b/desired.toml` under two good directories.
    fn good(&self) -> PathBuf {
        self.mkdir("a");
        self.mkdir("a/b");
        self.file("a/b/desired.toml")
    }

    fn read(&self, path: &Path) -> String {
        read_as(path, self.uid)
    }

    fn refused(&self, path: &Path) -> String {
        refused_as(path, self.uid)
    }
}

fn read_as(path: &Path, uid: u32) -> String {
    check_permissions(path, uid).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    open_checked(path, uid).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The message refusing `path`; `check_permissions` must refuse it the same way.
fn refused_as(path: &Path, uid: u32) -> String {
    let e = open_checked(path, uid).expect_err(&format!("{} should be refused", path.display()));
    assert_eq!(check_permissions(path, uid), Err(e.clone()));
    e
}

fn shown(p: &Path) -> String {
    p.display().to_string()
}

#[test]
fn reads_a_file_through_good_directories() {
    let t = Tree::new();
    let file = t.good();
    assert_eq!(t.read(&file), TEXT);
    // A trailing "." in the middle and doubled slashes change nothing.
    let odd = format!("{}/./a//b/desired.toml", shown(t.root()));
    assert_eq!(t.read(Path::new(&odd)), TEXT);
    // A sticky world-writable directory on the way is accepted, like /tmp.
    t.mkdir("sticky");
    t.chmod("sticky", 0o1777);
    assert_eq!(t.read(&t.file("sticky/desired.toml")), TEXT);
}

#[test]
fn reads_through_a_relative_path() {
    let t = Tree::new();
    let file = t.good();
    for rel in ["a/b/desired.toml", "./a//b/./desired.toml"] {
        let opened = open_relative_to(t.root(), Path::new(rel), t.uid).expect(rel);
        assert_eq!(opened.shown, file);
    }
    // Above where the walk starts: each parent is opened through ".." and checked.
    let opened =
        open_relative_to(&t.path("a/b"), Path::new("../../a/b/desired.toml"), t.uid).unwrap();
    assert_eq!(opened.shown, file);
    t.chmod("a", 0o775);
    assert_eq!(
        open_relative_to(&t.path("a/b"), Path::new("../b/desired.toml"), t.uid).err(),
        Some(format!(
            "{0}/a is writable by its group: refusing it (chmod g-w {0}/a)",
            shown(t.root())
        ))
    );
}

#[test]
fn follows_dot_dot() {
    let t = Tree::new();
    t.good();
    t.mkdir("a/x");
    let root = shown(t.root());
    for p in [
        format!("{root}/a/x/../b/desired.toml"),
        format!("{root}/a/b/../../a/b/desired.toml"),
        format!("/..{root}/a/b/desired.toml"),
    ] {
        assert_eq!(t.read(Path::new(&p)), TEXT, "{p}");
    }
    // ".." after a symlink goes up from where the symlink led (as the kernel does), not
    // lexically: e/.. is a, so e/../b is a/b.
    t.link("e", "a/b");
    assert_eq!(t.read(&t.path("e/../b/desired.toml")), TEXT);
    // A missing directory is named even when ".." would step back out of it.
    assert_eq!(
        t.refused(&t.path("a/nope/../b/desired.toml")),
        format!("{root}/a/nope: no such file or directory")
    );
}

#[test]
fn follows_symlinks_in_good_directories() {
    let t = Tree::new();
    let file = t.good();
    let absolute = t.link("absolute.toml", &file);
    let relative = t.link("a/relative.toml", "b/desired.toml");
    let upward = t.link("a/b/upward.toml", "../../a/b/desired.toml");
    let chained = t.link("chained.toml", "a/relative.toml");
    t.link("dir", "a/b");
    let through_dir = t.path("dir/desired.toml");
    for p in [&absolute, &relative, &upward, &chained, &through_dir] {
        assert_eq!(t.read(p), TEXT, "{}", p.display());
        // Found where the links lead.
        assert_eq!(open_relative_to(t.root(), p, t.uid).unwrap().shown, file);
    }
}

#[test]
fn follows_at_most_40_symlinks() {
    let t = Tree::new();
    t.good();
    t.link("l0", "a/b/desired.toml");
    for i in 1..=MAX_SYMLINKS {
        t.link(&format!("l{i}"), format!("l{}", i - 1));
    }
    // l39 → … → l0 → the file: 40 links.
    assert_eq!(t.read(&t.path(&format!("l{}", MAX_SYMLINKS - 1))), TEXT);
    // l40 → … → l0: one too many; the 41st is l0.
    assert_eq!(
        t.refused(&t.path(&format!("l{MAX_SYMLINKS}"))),
        format!(
            "{}: too many levels of symbolic links (more than 40): refusing it (look for a \
             symlink loop)",
            shown(&t.path("l0"))
        )
    );
}

#[test]
fn refuses_symlink_loops() {
    let t = Tree::new();
    let me = t.link("me", "me");
    assert_eq!(
        t.refused(&me),
        format!(
            "{}: too many levels of symbolic links (more than 40): refusing it (look for a \
             symlink loop)",
            shown(&me)
        )
    );
    t.link("ping", "pong");
    t.link("pong", "./ping");
    t.link("loop", "loop/x");
    for p in [
        t.path("ping"),
        t.path("loop/desired.toml"),
        t.path("pong/x"),
    ] {
        let e = t.refused(&p);
        assert!(e.contains("too many levels of symbolic links"), "{e}");
    }
}

#[test]
fn refuses_a_writable_directory_on_the_way_and_names_it() {
    let t = Tree::new();
    let file = t.good();
    let a = shown(&t.path("a"));
    for (mode, who, chmod) in [
        (0o775, "its group", "g-w"),
        (0o757, "others", "o-w"),
        (0o777, "its group and others", "go-w"),
    ] {
        t.chmod("a", mode);
        assert_eq!(
            t.refused(&file),
            format!("{a} is writable by {who}: refusing it (chmod {chmod} {a})")
        );
    }
    // Also when the path only reaches it through a symlink.
    t.link("to_b", "a/b");
    assert_eq!(
        t.refused(&t.path("to_b/desired.toml")),
        format!("{a} is writable by its group and others: refusing it (chmod go-w {a})")
    );
    // And the file's own directory.
    t.chmod("a", 0o755);
    t.chmod("a/b", 0o775);
    let b = shown(&t.path("a/b"));
    assert_eq!(
        t.refused(&file),
        format!("{b} is writable by its group: refusing it (chmod g-w {b})")
    );
}

#[test]
fn refuses_a_writable_file() {
    let t = Tree::new();
    let file = t.good();
    let f = shown(&file);
    t.chmod("a/b/desired.toml", 0o646);
    assert_eq!(
        t.refused(&file),
        format!("{f} is writable by others: refusing it (chmod o-w {f})")
    );
    t.chmod("a/b/desired.toml", 0o664);
    assert_eq!(
        t.refused(&file),
        format!("{f} is writable by its group: refusing it (chmod g-w {f})")
    );
}

#[test]
fn refuses_what_is_not_a_regular_file() {
    let t = Tree::new();
    let file = t.good();
    let b = t.path("a/b");
    assert_eq!(
        t.refused(&b),
        format!("{} is not a regular file (it is a directory)", shown(&b))
    );
    assert_eq!(
        t.refused(Path::new("/")),
        "/ is not a regular file (it is a directory)"
    );
    // A symlink to a directory, and a path ending in "..".
    t.link("dir", "a/b");
    assert_eq!(
        t.refused(&t.path("dir")),
        format!("{} is not a regular file (it is a directory)", shown(&b))
    );
    assert_eq!(
        t.refused(&t.path("a/b/..")),
        format!(
            "{} is not a regular file (it is a directory)",
            shown(&t.path("a"))
        )
    );
    // Opening a fifo for reading would block: it must be refused without hanging.
    let fifo = t.path("a/b/fifo.toml");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .expect("mkfifo");
    assert_eq!(
        t.refused(&fifo),
        format!("{} is not a regular file (it is a fifo)", shown(&fifo))
    );
    let socket = t.path("a/b/socket.toml");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
    assert_eq!(
        t.refused(&socket),
        format!("{} is not a regular file (it is a socket)", shown(&socket))
    );
    // A file used as a directory.
    let f = shown(&file);
    for p in [format!("{f}/"), format!("{f}/."), format!("{f}/x")] {
        assert_eq!(
            t.refused(Path::new(&p)),
            format!("{f} is not a directory (it is a regular file)")
        );
    }
}

#[test]
fn names_what_is_missing() {
    let t = Tree::new();
    t.good();
    let root = shown(t.root());
    assert_eq!(
        t.refused(&t.path("a/b/nope.toml")),
        format!("{root}/a/b/nope.toml: no such file or directory")
    );
    assert_eq!(
        t.refused(&t.path("nope/b/desired.toml")),
        format!("{root}/nope: no such file or directory")
    );
    t.link("dangling.toml", "a/gone.toml");
    assert_eq!(
        t.refused(&t.path("dangling.toml")),
        format!("{root}/a/gone.toml: no such file or directory")
    );
    assert_eq!(t.refused(Path::new("")), "an empty path names no file");
}

#[test]
fn load_checked_reports_a_refusal_as_one_unplaced_error() {
    let t = Tree::new();
    let file = t.good();
    let loaded = load_checked(&file, t.uid).expect("a good file loads");
    assert!(loaded.state.groups.is_empty());
    t.chmod("a/b/desired.toml", 0o666);
    let e = load_checked(&file, t.uid).expect_err("a writable file is refused");
    assert_eq!(e.file, file);
    assert_eq!(e.diagnostics.len(), 1);
    let d = &e.diagnostics[0];
    assert_eq!(
        (d.severity, d.line, d.column, d.key.as_str(), &d.file),
        (Severity::Error, 0, 0, "", &file)
    );
    let f = shown(&file);
    assert_eq!(
        d.message,
        format!("{f} is writable by its group and others: refusing it (chmod go-w {f})")
    );
}

/// A tree for a test that changes owners; panics unless run as root.
fn root_tree() -> Tree {
    let t = Tree::new();
    assert_eq!(
        t.uid, 0,
        "this test gives files to uid {OTHER} (chown), which only root can do: run it as root \
         with `cargo test -- --include-ignored`"
    );
    t
}

fn chown(p: &Path, uid: u32) {
    std::os::unix::fs::chown(p, Some(uid), None).expect("chown");
}

fn lchown(p: &Path, uid: u32) {
    std::os::unix::fs::lchown(p, Some(uid), None).expect("lchown");
}

#[test]
#[ignore = "needs root (CI runs it with --include-ignored)"]
fn refuses_what_another_user_owns() {
    let t = root_tree();
    let file = t.good();
    let a = t.path("a");

    // A directory on the way.
    chown(&a, OTHER);
    let s = shown(&a);
    assert_eq!(
        t.refused(&file),
        format!(
            "{s} is owned by uid {OTHER}, not by root or the daemon's user: refusing it \
             (chown root {s})"
        )
    );
    assert_eq!(
        read_as(&file, OTHER),
        TEXT,
        "the daemon's own user is trusted"
    );
    // Sticky does not excuse the owner: it can still replace anything in there.
    t.chmod("a", 0o1777);
    assert!(t
        .refused(&file)
        .starts_with(&format!("{s} is owned by uid {OTHER}")));
    chown(&a, 0);
    t.chmod("a", 0o755);

    // The file.
    chown(&file, OTHER);
    let f = shown(&file);
    assert_eq!(
        t.refused(&file),
        format!(
            "{f} is owned by uid {OTHER}, not by root or the daemon's user: refusing it \
             (chown root {f})"
        )
    );
    assert_eq!(read_as(&file, OTHER), TEXT);
    chown(&file, 0);

    // A symlink in a good directory.
    let link = t.link("a/link.toml", "b/desired.toml");
    lchown(&link, OTHER);
    let l = shown(&link);
    assert_eq!(
        t.refused(&link),
        format!(
            "{l} is a symlink owned by uid {OTHER}, not by root or the daemon's user: refusing \
             to follow it (chown -h root {l}, or name its target instead)"
        )
    );
    assert_eq!(read_as(&link, OTHER), TEXT);
    // Also when it is a directory on the way.
    let dir_link = t.link("dir", "a/b");
    lchown(&dir_link, OTHER);
    assert!(t.refused(&t.path("dir/desired.toml")).starts_with(&format!(
        "{} is a symlink owned by uid {OTHER}",
        shown(&dir_link)
    )));
}

/// The attack StrictModes-by-path let through: in a sticky, world-writable directory another
/// user plants a symlink (theirs, so they can repoint it at will) to a good file.
#[test]
#[ignore = "needs root (CI runs it with --include-ignored)"]
fn refuses_another_users_symlink_in_a_sticky_directory() {
    let t = root_tree();
    let file = t.good();
    t.mkdir("shared");
    t.chmod("shared", 0o1777);

    let planted = t.link("shared/desired.toml", &file);
    lchown(&planted, OTHER);
    let p = shown(&planted);
    assert_eq!(
        t.refused(&planted),
        format!(
            "{p} is a symlink owned by uid {OTHER}, not by root or the daemon's user: refusing \
             to follow it (chown -h root {p}, or name its target instead)"
        )
    );
    // The same symlink owned by root is fine: nobody else can replace it there.
    lchown(&planted, 0);
    assert_eq!(t.read(&planted), TEXT);

    // Their directory or file in the sticky directory is refused as well.
    let theirs = t.mkdir("shared/theirs");
    fs::copy(&file, theirs.join("desired.toml")).expect("copy");
    chown(&theirs, OTHER);
    assert!(t
        .refused(&theirs.join("desired.toml"))
        .starts_with(&format!("{} is owned by uid {OTHER}", shown(&theirs))));
    let dropped = t.file("shared/dropped.toml");
    chown(&dropped, OTHER);
    assert!(t
        .refused(&dropped)
        .starts_with(&format!("{} is owned by uid {OTHER}", shown(&dropped))));
}
