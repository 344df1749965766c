//! The last test target `cargo test` runs (its name, `zz-total`, sorts after every other), so
//! that the command ends with one total line. The line comes from `.cargo/runner`, which tallies
//! every test binary's results as cargo runs them and, given this target, prints the tally
//! instead of running it. This program runs only when something else ran the tests.

fn main() {
    println!(
        "all tests: no total (the tests did not run through .cargo/runner, which counts them)"
    );
}
