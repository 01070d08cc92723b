//! What the command line offers: one module per subcommand (`run`, `bcast`, `demo`,
//! `topo`, `hosts`, `clock` with `clocksim` for `clock --sim`, `monitor`, and the
//! internal `node`, `backend` and `guard`); `bench` holds every `treecast bench`
//! benchmark, with what they share in `bench::shared`. `cli` has the flags of all
//! of them, `protocol` the request tags the generic back-end answers.

pub mod backend;
pub mod bcast;
pub mod bench;
pub mod cli;
pub mod clock;
pub mod clocksim;
pub mod demo;
pub mod guard;
pub mod hosts;
pub mod monitor;
pub mod node;
pub mod protocol;
pub mod run;
pub mod settings;
pub mod topo;

#[cfg(test)]
mod readme {
    /// The README's example commands, one per line.
    fn commands() -> Vec<&'static str> {
        include_str!("../../README.md")
            .lines()
            .filter(|l| l.starts_with("target/release/treecast") || l.starts_with("cargo run"))
            .collect()
    }

    #[test]
    fn the_readme_examples_write_their_files_outside_the_work_tree() {
        // Regression: following the README left m.ppm, m.json and m.svg in the work tree.
        let mut written = 0;
        for line in commands() {
            let command = line.split("  #").next().unwrap_or(line);
            for word in command.split_whitespace() {
                if [".json", ".svg", ".ppm"].iter().any(|ext| word.ends_with(ext)) && !word.contains("OTHER")
                {
                    assert!(word.starts_with("$out/"), "{word} in: {line}");
                    written += 1;
                }
            }
        }
        assert!(written >= 3, "the README's examples that write files were not found");
        let ignored = include_str!("../../.gitignore");
        for pattern in ["*.ppm", "/m.json", "/m.svg"] {
            assert!(ignored.lines().any(|l| l == pattern), ".gitignore lacks {pattern}");
        }
    }

    #[test]
    fn the_readme_bcast_example_works_for_a_user_without_scratch() {
        // Regression: `bcast ./tool.tar /scratch/ --local 16` failed for a user who cannot write `/`.
        let bcast: Vec<&str> = commands().into_iter().filter(|l| l.contains(" bcast ")).collect();
        assert!(!bcast.is_empty());
        for line in bcast {
            assert!(!line.contains(" /scratch/"), "{line}");
        }
        assert!(commands().iter().any(|l| l.contains("bcast $out/tool.tar ~/scratch/ --local 16 --mkdir")));
        // The file it pushes is made first, so the line runs as written.
        assert!(include_str!("../../README.md").lines().any(|l| l.starts_with("tar cf $out/tool.tar ")));
    }
}
