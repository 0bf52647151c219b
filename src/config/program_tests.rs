//! The `#!` line read as Linux reads it (the rules on files are tested through the runner, in
//! `external/program_tests.rs`).

use super::*;

fn read(head: &[u8]) -> Result<Option<(String, Option<String>)>, String> {
    let text = |s: OsString| s.into_string().unwrap();
    shebang(head).map(|o| o.map(|(i, a)| (text(i), a.map(text))))
}

fn script(
    interpreter: &str,
    arg: Option<&str>,
) -> Result<Option<(String, Option<String>)>, String> {
    Ok(Some((interpreter.to_owned(), arg.map(str::to_owned))))
}

#[test]
fn a_shebang_line_gives_the_interpreter_and_one_argument() {
    assert_eq!(read(b"#!/bin/sh\necho 1\n"), script("/bin/sh", None));
    assert_eq!(read(b"#! \t/bin/sh \t\n"), script("/bin/sh", None));
    assert_eq!(
        read(b"#!/usr/bin/env python3\n"),
        script("/usr/bin/env", Some("python3"))
    );
    // Everything after the interpreter is one argument, inner spaces kept.
    assert_eq!(
        read(b"#!/usr/bin/awk -f  -v x=1 \n"),
        script("/usr/bin/awk", Some("-f  -v x=1"))
    );
    // A carriage return is part of the name (and then names no file).
    assert_eq!(read(b"#!/bin/sh\r\n"), script("/bin/sh\r", None));
    // No newline: the file's end (NUL padding) ends the name.
    assert_eq!(read(b"#!/bin/sh"), script("/bin/sh", None));
    // A NUL ends the name, and the argument.
    assert_eq!(read(b"#!/bin/sh\0 -x\n"), script("/bin/sh", None));
    assert_eq!(read(b"#!/bin/sh -e\0x\n"), script("/bin/sh", Some("-e")));
}

#[test]
fn not_a_script_or_a_line_that_names_nothing() {
    assert_eq!(read(b"\x7fELF\x02\x01"), Ok(None));
    assert_eq!(read(b""), Ok(None));
    assert_eq!(read(b" #!/bin/sh\n"), Ok(None));
    for head in [&b"#!\n"[..], b"#!  \t\n", b"#!"] {
        assert_eq!(
            read(head),
            Err("its #! line names no interpreter".into()),
            "{head:?}"
        );
    }
}

#[test]
fn a_long_line_is_read_as_far_as_the_kernel_reads_it() {
    // The name ends within the first 255 bytes: the argument is cut there.
    let mut long = b"#!/bin/sh ".to_vec();
    long.extend([b'x'; 400]);
    let Ok(Some((name, Some(arg)))) = read(&long) else {
        panic!("{:?}", read(&long))
    };
    assert_eq!(name, "/bin/sh");
    assert_eq!(arg.len(), HEAD - 1 - "#!/bin/sh ".len());
    // A name that does not end there would be cut: refused.
    let mut long = b"#!/".to_vec();
    long.extend([b'x'; 400]);
    assert_eq!(
        read(&long),
        Err("its #! line is longer than the 255 bytes the kernel reads".into())
    );
}
