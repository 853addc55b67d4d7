//! `cargo xtask mutants [--list | --rotate | NAME...]`: the suite's test binaries run once per
//! defect injected on purpose (latprof's hidden `--debug-defect`, which every latprof a test
//! runs takes from `LATPROF_TEST_DEFECT`, the VM guests' included), each run judged against
//! the must-fail table, `latprof/tests/must_fail`: every test it lists for the defect must
//! fail, and no other test may.
//!
//! `--list` prints the defects, one a line; `--rotate` runs the one defect the commit picks
//! (CI's schedule: the suite's time leaves room for one); no argument runs them all; `--only
//! TARGET,...` first runs only those test binaries.
use std::{
    collections::{BTreeMap, BTreeSet},
    env,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use latprof_common::{DEFECTS, Defect, defect_named};

use super::{
    revision, root_dir,
    suite::{self, Prepared, Ran},
};

/// The must-fail table, from the workspace root.
const TABLE: &str = "latprof/tests/must_fail";

/// How one defect's run went.
struct Judged {
    defect: &'static str,
    took: Duration,
    /// Listed, and failed: as it must.
    caught: BTreeSet<String>,
    /// Listed, and passed (or never ran).
    missed: BTreeSet<String>,
    /// Failed, and not listed.
    unexpected: BTreeSet<String>,
}

pub(crate) fn mutants(args: &[String]) -> Result<()> {
    if args == ["--list"] {
        for d in DEFECTS {
            println!("{}", d.name);
        }
        return Ok(());
    }
    let mut table = read_table(&std::fs::read_to_string(root_dir().join(TABLE)).context(TABLE)?)?;
    // `--only A,B`: those test binaries alone (by target name), judged by the table's lines
    // for them (a test changed: its verdicts again, without the whole suite's time).
    let (only, args): (Option<BTreeSet<String>>, &[String]) = match args {
        [flag, targets, rest @ ..] if flag == "--only" => {
            (Some(targets.split(',').map(str::to_owned).collect()), rest)
        }
        _ => (None, args),
    };
    let defects: Vec<Defect> = match args {
        [] => DEFECTS.to_vec(),
        [flag] if flag == "--rotate" => vec![rotated(&revision(), &table)?],
        names => names
            .iter()
            .map(|n| defect_named(n).with_context(|| format!("no defect {n:?} (--list)")))
            .collect::<Result<_>>()?,
    };
    let Prepared {
        mut binaries,
        skip_vm,
        retries,
        ..
    } = suite::prepare()?;
    if let Some(only) = &only {
        binaries.retain(|b| only.contains(target_of(&b.name)));
        for tests in table.values_mut() {
            tests.retain(|t| {
                t.split_once("::")
                    .is_some_and(|(target, _)| only.contains(target))
            });
        }
    }
    if skip_vm {
        bail!("the mutants run the VM guests too: LATPROF_SKIP_VM must not be set");
    }
    let mut judged = Vec::new();
    for defect in defects {
        eprintln!(
            "xtask: ################ defect {}: {} (one in {})",
            defect.name, defect.what, defect.one_in
        );
        let t0 = Instant::now();
        let ran = suite::run_binaries(&binaries, |test| {
            let mut cmd = suite::test_command(test, &retries, false, &[]);
            cmd.env("LATPROF_TEST_DEFECT", defect.name);
            cmd
        });
        let failed = failures(&ran);
        let j = judge(defect.name, t0.elapsed(), &failed, &table);
        // Each defect's verdict as it comes: a long run stopped early keeps what it found.
        report(&j);
        judged.push(j);
    }
    summary(&judged)
}

/// The defect `--rotate` runs for commit `revision` (hex), by the commit's number: commits take
/// the defects the table judges in turn, as chance has it. A defect the table names no test
/// for has not been judged yet (`cargo xtask mutants NAME` judges it; its failures are listed
/// at the end) and is not rotated.
fn rotated(revision: &str, table: &BTreeMap<String, BTreeSet<String>>) -> Result<Defect> {
    let judged: Vec<Defect> = DEFECTS
        .into_iter()
        .filter(|d| table.contains_key(d.name))
        .collect();
    if judged.is_empty() {
        bail!("{TABLE} judges no defect yet");
    }
    let n = usize::from_str_radix(revision.get(..8).unwrap_or(revision), 16).unwrap_or(0);
    Ok(judged[n % judged.len()])
}

/// The table's lines: `DEFECT TARGET::TEST` (the test binary's target name, then the test's
/// name as libtest prints it); `#` begins a comment. Every defect named must exist.
fn read_table(text: &str) -> Result<BTreeMap<String, BTreeSet<String>>> {
    let mut table: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let (Some(defect), Some(test), None) = (words.next(), words.next(), words.next()) else {
            bail!("{TABLE}:{}: not `DEFECT TARGET::TEST`: {line}", n + 1);
        };
        if defect_named(defect).is_none() {
            bail!("{TABLE}:{}: no defect {defect:?}", n + 1);
        }
        if !table
            .entry(defect.to_owned())
            .or_default()
            .insert(test.to_owned())
        {
            bail!("{TABLE}:{}: {defect} {test} listed twice", n + 1);
        }
    }
    Ok(table)
}

/// The target of a test binary named `PACKAGE KIND TARGET`.
fn target_of(binary: &str) -> &str {
    binary.rsplit(' ').next().unwrap_or(binary)
}

/// The tests that failed, as `TARGET::TEST`; a binary that failed with no test failing (it
/// did not start, or aborted) as `TARGET::*`.
fn failures(ran: &[Ran]) -> BTreeSet<String> {
    let mut failed = BTreeSet::new();
    for r in ran {
        let target = target_of(&r.name);
        let before = failed.len();
        for line in r.stdout.lines() {
            if let Some(test) = line
                .strip_prefix("test ")
                .and_then(|l| l.strip_suffix(" ... FAILED"))
            {
                failed.insert(format!("{target}::{test}"));
            }
        }
        if !r.ok && failed.len() == before {
            failed.insert(format!("{target}::*"));
        }
    }
    failed
}

fn judge(
    defect: &'static str,
    took: Duration,
    failed: &BTreeSet<String>,
    table: &BTreeMap<String, BTreeSet<String>>,
) -> Judged {
    let listed = table.get(defect).cloned().unwrap_or_default();
    Judged {
        defect,
        took,
        caught: failed.intersection(&listed).cloned().collect(),
        missed: listed.difference(failed).cloned().collect(),
        unexpected: failed.difference(&listed).cloned().collect(),
    }
}

/// One defect's time, the tests that caught it, and every disagreement with the table; the
/// number of disagreements.
fn report(j: &Judged) -> usize {
    eprintln!(
        "xtask:   {:<14} {:>5} s  {} failed, all listed{}",
        j.defect,
        j.took.as_secs(),
        j.caught.len(),
        if j.missed.is_empty() && j.unexpected.is_empty() {
            ""
        } else {
            "  WRONG"
        }
    );
    for t in &j.caught {
        eprintln!("xtask:       {} {t}", j.defect);
    }
    for t in &j.missed {
        eprintln!("xtask:     LISTED BUT PASSED: {} {t}", j.defect);
    }
    for t in &j.unexpected {
        eprintln!("xtask:     FAILED, NOT LISTED: {} {t}", j.defect);
    }
    j.missed.len() + j.unexpected.len()
}

/// Every defect's report again, together; an error if any test disagrees with the table.
fn summary(judged: &[Judged]) -> Result<()> {
    eprintln!("xtask: ################################################################");
    eprintln!("xtask: mutants: per defect, the listed tests that failed (as they must):");
    let wrong: usize = judged.iter().map(report).sum();
    eprintln!("xtask: ################################################################");
    if wrong > 0 {
        bail!("{wrong} tests disagree with {TABLE}");
    }
    if env::var_os("LATPROF_TEST_DEFECT").is_some() {
        bail!("LATPROF_TEST_DEFECT is set: mutants sets it per defect");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{BTreeSet, Duration, Ran, failures, judge, read_table, rotated};

    #[test]
    fn a_table_line_names_a_defect_and_a_test() {
        let table = read_table("# c\ndrop-sleep counts::a # why\n\nduration x::b\n").unwrap();
        assert_eq!(
            table["drop-sleep"],
            BTreeSet::from(["counts::a".to_owned()])
        );
        assert!(read_table("no-such-defect counts::a").is_err());
        assert!(read_table("drop-sleep").is_err());
        assert!(read_table("drop-sleep a::b\ndrop-sleep a::b").is_err());
    }

    #[test]
    fn a_listed_test_that_passed_and_an_unlisted_failure_are_both_wrong() {
        let ran = [
            Ran::for_tests(
                "latprof test counts",
                false,
                "test a ... ok\ntest b ... FAILED\ntest c ... FAILED\n",
            ),
            Ran::for_tests("latprof test tui", false, "error: no such file\n"),
            Ran::for_tests("latprof lib latprof", true, "test x::y ... ok\n"),
        ];
        let failed = failures(&ran);
        assert_eq!(
            failed,
            BTreeSet::from(["counts::b", "counts::c", "tui::*"].map(str::to_owned))
        );
        let table = read_table("duration counts::a\nduration counts::b\n").unwrap();
        let j = judge("duration", Duration::ZERO, &failed, &table);
        assert_eq!(j.caught, BTreeSet::from(["counts::b".to_owned()]));
        assert_eq!(j.missed, BTreeSet::from(["counts::a".to_owned()]));
        assert_eq!(
            j.unexpected,
            BTreeSet::from(["counts::c", "tui::*"].map(str::to_owned))
        );
    }

    #[test]
    fn the_rotation_takes_every_judged_defect_in_turn() {
        let table = read_table("duration a::b\nwrong-waker a::c\nmerge-twice a::d\n").unwrap();
        let seen: BTreeSet<&str> = (0..9u64)
            .map(|n| rotated(&format!("{n:08x}1234"), &table).unwrap().name)
            .collect();
        assert_eq!(
            seen,
            BTreeSet::from(["duration", "wrong-waker", "merge-twice"])
        );
        assert!(rotated("0", &read_table("").unwrap()).is_err());
    }
}
