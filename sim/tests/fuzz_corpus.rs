//! Replays every committed fuzz corpus file (`fuzz/corpus/<target>/*` at the
//! repository root, where `cargo fuzz` keeps them) through the function in
//! `leaderelection_sim::checks` behind the target, so plain `cargo test`
//! checks the corpus with no fuzzer installed (DESIGN.md section 7, layer 3).

use std::path::{Path, PathBuf};

use leaderelection_sim::checks::TARGETS;

/// The fuzz crate, beside this one at the repository root.
fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("sim/ has a parent").join("fuzz")
}

#[test]
fn every_corpus_file_passes_its_target() {
    let root = fuzz_dir().join("corpus");
    let mut failures = Vec::new();
    let mut total = 0;
    for (name, check) in TARGETS {
        let dir = root.join(name);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("directory entry").path())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "no corpus for {name}");
        for file in &files {
            let data = std::fs::read(file).expect("corpus file");
            if let Err(e) = check(&data) {
                failures.push(format!("{}: {e}", file.display()));
            }
        }
        println!("fuzz corpus: {name}: {} files", files.len());
        total += files.len();
    }
    assert!(failures.is_empty(), "{} of {total} corpus files fail:\n{}", failures.len(), failures.join("\n"));
    // Every fuzz target in fuzz/ has its logic here, and the other way round.
    let targets = fuzz_dir().join("fuzz_targets");
    let mut on_disk: Vec<String> = std::fs::read_dir(&targets)
        .expect("fuzz/fuzz_targets")
        .map(|e| e.expect("entry").path().file_stem().expect("name").to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = TARGETS.iter().map(|(n, _)| n.to_string()).collect();
    listed.sort();
    assert_eq!(on_disk, listed);
}

#[test]
fn the_simulation_oracle_can_fail() {
    // The simulation target's verdict comes from the oracle; under a broken
    // driver the same oracle must object, or the target could never fail.
    use leaderelection_sim::{run, Schedule, Variant};
    let found = (0..200).any(|seed| run(&Schedule::from_seed(seed, Variant::NoWatchdog), false).violation.is_some());
    assert!(found, "the oracle never objects");
}
