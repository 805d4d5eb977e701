//! Runs the fuzz targets of `vpmu::fuzz` on stable: over the committed seed corpus in
//! `fuzz/corpus/<target>/` (including any traces placed there), over the built-in seeds, and
//! over a few thousand deterministic pseudo-random inputs, some of them mutations of the seeds.

use std::path::{Path, PathBuf};

use vpmu::fuzz::{self, Rng, seeds};

type Target = fn(&[u8]);

const TARGETS: [(&str, Target); 3] = [
    ("msr_traps", fuzz::msr_traps),
    ("pebs_records", fuzz::pebs_records),
    ("page_walk", fuzz::page_walk),
];

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
}

fn seeds_of(target: &str) -> Vec<(&'static str, Vec<u8>)> {
    match target {
        "msr_traps" => seeds::msr_traps_seeds(),
        "pebs_records" => seeds::pebs_records_seeds(),
        _ => seeds::page_walk_seeds(),
    }
}

#[test]
fn committed_corpus() {
    for (name, f) in TARGETS {
        let dir = corpus_dir(name);
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_file() {
                f(&std::fs::read(&path).unwrap());
                n += 1;
            }
        }
        assert!(n > 0, "no corpus files for {name} in {}", dir.display());
    }
}

#[test]
fn builtin_seeds_are_committed_and_pass() {
    for (name, f) in TARGETS {
        for (seed, bytes) in seeds_of(name) {
            f(&bytes);
            let committed = std::fs::read(corpus_dir(name).join(seed)).unwrap_or_default();
            assert_eq!(
                committed, bytes,
                "fuzz/corpus/{name}/{seed} is stale: run `cargo test -p vpmu --test fuzz_corpus -- --ignored`"
            );
        }
    }
}

#[test]
fn random_and_mutated_inputs() {
    let mut rng = Rng(0x5EED_0FF0_2200);
    for (name, f) in TARGETS {
        let seeds = seeds_of(name);
        let rounds = if name == "msr_traps" { 3000 } else { 4000 };
        for i in 0..rounds {
            let input = if i % 2 == 0 {
                let len = usize::try_from(rng.next_u64() % 400).unwrap();
                rng.bytes(len)
            } else {
                // Flip a few bytes of a seed: structured inputs reach deeper states.
                let k = usize::try_from(rng.next_u64()).unwrap() % seeds.len();
                let mut b = seeds[k].1.clone();
                for _ in 0..1 + rng.next_u64() % 4 {
                    if b.is_empty() {
                        break;
                    }
                    let at = usize::try_from(rng.next_u64()).unwrap() % b.len();
                    b[at] = rng.bytes(1)[0];
                }
                b
            };
            f(&input);
        }
    }
}

/// Rewrites `fuzz/corpus/<target>/<seed>` from the built-in seeds.
#[test]
#[ignore = "writes the committed corpus; run by hand after changing a decoder"]
fn regenerate_corpus() {
    for (name, _) in TARGETS {
        let dir = corpus_dir(name);
        std::fs::create_dir_all(&dir).unwrap();
        for (seed, bytes) in seeds_of(name) {
            std::fs::write(dir.join(seed), bytes).unwrap();
        }
    }
}
