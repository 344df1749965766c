//! `cargo test` ends with one line totalling every test binary (README, docs/testing.md): cargo
//! runs each binary through `.cargo/runner`, which passes its output through, tallies its results
//! and, given the last target (`zz_total`), prints the tally. Driven here with stand-ins for test
//! binaries (scripts printing what libtest prints) in a `deps/` directory, as cargo lays them out.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const RUNNER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/.cargo/runner");

/// A stand-in test binary named `name` (cargo's `name-hash`), printing `stdout` and exiting with
/// `status`.
fn binary(dir: &Path, name: &str, stdout: &str, status: i32) -> PathBuf {
    let deps = dir.join("deps");
    std::fs::create_dir_all(&deps).unwrap();
    let path = deps.join(format!("{name}-0123456789abcdef"));
    let script = format!("#!/bin/sh\ncat <<'OUT'\n{stdout}OUT\nexit {status}\n");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn run(binary: &Path, args: &[&str]) -> Output {
    Command::new(RUNNER)
        .arg(binary)
        .args(args)
        .output()
        .unwrap()
}

fn text(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

const UNIT: &str = "\nrunning 3 tests
test a ... ok
test b ... ok
test c::postgres ... ignored, not run: set APPROVALS_TEST_POSTGRES_URL

test result: ok. 2 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s

";

// As libtest prints on a terminal (`--color=always`): the words coloured.
const API: &str = "\nrunning 4 tests
test d ... \x1b[32mok\x1b[0m
test e::postgres ... \x1b[33mignored, not run: set APPROVALS_TEST_POSTGRES_URL\x1b[0m
test f ... \x1b[33mignored, needs a second core\x1b[0m
test g ... \x1b[32mok\x1b[0m

test result: \x1b[32mok\x1b[0m. 2 passed; 0 failed; 2 ignored; 0 measured; 3 filtered out; finished in 0.01s

";

#[test]
fn the_last_target_prints_one_total_line_with_what_did_not_run_and_why() {
    let dir = tempfile::tempdir().unwrap();
    let unit = binary(dir.path(), "approval_broker", UNIT, 0);
    let api = binary(dir.path(), "api", API, 0);
    let total = binary(dir.path(), "zz_total", "never run\n", 0);

    let out = run(&unit, &[]);
    assert!(out.status.success());
    assert_eq!(
        text(&out),
        UNIT,
        "a binary's output passes through unchanged"
    );
    let out = run(&api, &["--exact", "d"]);
    assert!(out.status.success());
    assert_eq!(text(&out), API);

    let out = run(&total, &[]);
    assert!(out.status.success());
    assert_eq!(
        text(&out),
        "all tests: 4 passed, 0 failed, 3 not run \
         (2 not run: set APPROVALS_TEST_POSTGRES_URL; 1 needs a second core), 3 filtered out\n"
    );

    // The tally belongs to one `cargo test`: it is gone once printed.
    let out = run(&total, &[]);
    assert_eq!(
        text(&out),
        "all tests: no test binary reported a result through .cargo/runner\n"
    );
}

#[test]
fn a_failing_binary_keeps_its_status_and_prints_the_tally_so_far() {
    let dir = tempfile::tempdir().unwrap();
    let unit = binary(dir.path(), "approval_broker", UNIT, 0);
    let failing = binary(
        dir.path(),
        "api",
        "\nrunning 2 tests\ntest d ... ok\ntest e ... FAILED\n\n\
         test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out\n\n",
        101,
    );
    let crashing = binary(dir.path(), "crash", "\nrunning 1 test\n", 134);

    assert!(run(&unit, &[]).status.success());
    let out = run(&failing, &[]);
    assert_eq!(
        out.status.code(),
        Some(101),
        "cargo must still see the failure"
    );
    assert!(
        text(&out).ends_with(
            "tests so far (cargo stops at a failing test binary unless --no-fail-fast): \
             3 passed, 1 failed, 1 not run (1 not run: set APPROVALS_TEST_POSTGRES_URL)\n"
        ),
        "{}",
        text(&out)
    );

    // `--no-fail-fast` goes on; a binary that dies without a result line is named.
    let out = run(&crashing, &[]);
    assert_eq!(out.status.code(), Some(134));
    assert!(
        text(&out).ends_with("; stopped without a result: crash (exit status 134)\n"),
        "{}",
        text(&out)
    );
    let total = binary(dir.path(), "zz_total", "", 0);
    assert_eq!(
        text(&run(&total, &[])),
        "all tests: 3 passed, 1 failed, 1 not run (1 not run: set APPROVALS_TEST_POSTGRES_URL); \
         stopped without a result: crash (exit status 134)\n"
    );
}

#[test]
fn programs_and_listings_run_as_themselves() {
    let dir = tempfile::tempdir().unwrap();
    // `cargo run`'s program (not in deps/): its arguments, output and status are its own.
    let program = dir.path().join("approval-broker");
    std::fs::write(&program, "#!/bin/sh\necho \"$@\"\nexit 3\n").unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = run(&program, &["--listen", "127.0.0.1:0"]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(text(&out), "--listen 127.0.0.1:0\n");

    // `cargo test -- --list` runs nothing, so nothing is counted.
    let unit = binary(dir.path(), "approval_broker", "a: test\n", 0);
    assert_eq!(text(&run(&unit, &["--list"])), "a: test\n");
    assert!(!dir.path().join("test-tally").exists());
}

/// Cargo runs test targets in name order: `zz-total` must stay the last, or the total would be
/// printed before some binary ran.
#[test]
fn the_total_target_sorts_after_every_other_test_target() {
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut targets = Vec::new();
    for entry in std::fs::read_dir(&tests).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.extension().is_some_and(|e| e == "rs") && name != "total"
            || path.join("main.rs").is_file()
        {
            targets.push(name);
        }
    }
    assert!(targets.contains(&"api".to_owned()), "{targets:?}");
    for name in targets {
        assert!(
            name.as_str() < "zz-total",
            "tests/{name} would run after the total line"
        );
    }
    let manifest = std::fs::read_to_string(tests.with_file_name("Cargo.toml")).unwrap();
    assert!(manifest.contains("name = \"zz-total\"\npath = \"tests/total.rs\"\nharness = false"));
}
