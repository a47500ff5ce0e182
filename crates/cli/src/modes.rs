//! `cairn modes`: the registry's modes (and, with `--json`, its variants), one a line. The
//! benchmark and the real-mount suites read `--json` instead of linking cairn's crates.

/// The lines `cairn modes` prints.
pub fn lines(json: bool) -> Vec<String> {
    let modes = cairn_fstypes::modes();
    if !json {
        return modes
            .iter()
            .map(|m| format!("{}\t{}", m.spec.name, m.spec.description))
            .collect();
    }
    // The variants (a journal's log on a second device, ...) are no `-o mode=` values:
    // listed for the tools, keyed `variant`.
    modes
        .iter()
        .map(|m| m.to_json().to_string())
        .chain(
            cairn_fstypes::variants()
                .iter()
                .map(|v| v.to_json().to_string()),
        )
        .collect()
}

/// The README's table of modes, made from the registry (a test keeps the README's copy
/// equal to it, so the first screen a newcomer reads cannot drift from the code).
pub fn readme_table() -> String {
    let mut t = String::from(
        "| mode | format | what it is | when a call is durable | after a crash |\n\
         |---|---|---|---|---|\n",
    );
    for m in cairn_fstypes::modes() {
        t += &format!(
            "| `{}` | {} | {} | {} | {} |\n",
            m.name(),
            m.fs.name,
            m.spec.description,
            m.spec.durable_when(),
            m.spec.after_crash_needs()
        );
    }
    t
}

#[cfg(test)]
mod tests {
    use cairn_bench::registry::{Family, Listing, LogPlacement, Recovery};

    /// The README's table of modes is the registry's (regenerate: the failure prints it).
    #[test]
    fn the_readme_lists_the_registry_modes() {
        let readme = include_str!("../../../README.md");
        let table = super::readme_table();
        assert!(
            readme.contains(&table),
            "README.md's table of modes differs from the registry (`cairn modes --markdown`); it should read:\n{table}"
        );
    }

    /// The benchmark lists exactly the registry's modes and variants, with their facts, in
    /// the registry's order: what it reads of `cairn modes --json` is the registry.
    #[test]
    fn the_benchmark_reads_exactly_the_registry() {
        let l = Listing::parse(&super::lines(true).join("\n"));
        let names: Vec<_> = cairn_fstypes::modes().iter().map(|m| m.name()).collect();
        let listed: Vec<_> = l.modes.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(listed, names);
        let names: Vec<_> = cairn_fstypes::variants().iter().map(|v| v.name).collect();
        let listed: Vec<_> = l.variants.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(listed, names);
        for m in cairn_fstypes::modes() {
            let b = l.mode(m.name()).unwrap();
            let f = m.facts();
            assert_eq!(b.format, m.fs.name);
            // The same facts, through the JSON.
            assert_eq!(b.facts, f);
            assert_eq!(b.after_crash, m.spec.guarantees.after_crash);
        }
        for v in &l.variants {
            assert_eq!(v.target, format!("cairn-{}", v.name));
            assert!(l.mode(&v.base).is_some(), "{}", v.name);
        }
        // Every family, recovery and placement the benchmark distinguishes is declared by
        // some mode or variant of this build.
        let has = |p: &dyn Fn(&cairn_bench::registry::Facts) -> bool| {
            l.modes
                .iter()
                .map(|m| &m.facts)
                .chain(l.variants.iter().map(|v| &v.facts))
                .any(p)
        };
        assert!(has(
            &|f| f.family == Family::Journal && f.log == LogPlacement::Device
        ));
        assert!(has(&|f| f.recovery == Recovery::RollForward));
        assert!(has(&|f| f.family == Family::Ffs));
        // The text listing names the modes only.
        assert_eq!(super::lines(false).len(), cairn_fstypes::modes().len());
    }
}
