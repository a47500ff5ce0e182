//! Mount options described once, beside the code that parses them.
//!
//! Every layer that takes `-o KEY[=VALUE]` options — a format, each of its modes, the FUSE
//! adapter, the `cairn` command itself — lists them as [`OptionSpec`]s next to its parser.
//! `cairn help mount` is generated from those lists, and the command's tests hold each
//! parser to its list (every listed key with its default is accepted), so the help cannot
//! name an option that does not exist or leave out one that does.

use serde::Serialize;

/// One mount option as a user sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct OptionSpec {
    pub key: &'static str,
    /// The values it takes, with their unit, as help shows them (`file|dev:PATH`, `SECS`,
    /// `SIZE`); empty for a flag (`force`).
    pub values: &'static str,
    /// The value when the option is not given, as it would be written (`256M`, `5`); empty
    /// when there is none (a flag that is off, a path that is not set) or it depends on
    /// other options (the help text says on what).
    pub default: &'static str,
    pub help: &'static str,
}

impl OptionSpec {
    /// How the option is written: `key=values`, or `key` for a flag.
    pub fn usage(&self) -> String {
        if self.values.is_empty() {
            self.key.to_string()
        } else {
            format!("{}={}", self.key, self.values)
        }
    }
}

/// The option of `list` named `key`.
pub fn find<'a>(list: &'a [OptionSpec], key: &str) -> Option<&'a OptionSpec> {
    list.iter().find(|o| o.key == key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_shows_values_unless_a_flag() {
        let o = OptionSpec {
            key: "cache",
            values: "SIZE",
            default: "256M",
            help: "",
        };
        assert_eq!(o.usage(), "cache=SIZE");
        let f = OptionSpec {
            values: "",
            key: "force",
            ..o
        };
        assert_eq!(f.usage(), "force");
        assert_eq!(find(&[o, f], "force"), Some(&f));
        assert_eq!(find(&[o, f], "forc"), None);
    }
}
