//! The command line of the examples: `--name value` pairs, each read at most once; a value
//! that does not parse, and a flag nobody read, stop the program with a message.

use std::collections::HashMap;
use std::str::FromStr;

pub struct Flags(HashMap<String, String>);

impl Flags {
    pub fn parse() -> Flags {
        let mut map = HashMap::new();
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            let Some(name) = flag.strip_prefix("--") else {
                fail(&format!("unexpected argument {flag}"));
            };
            let Some(value) = args.next() else {
                fail(&format!("--{name} needs a value"));
            };
            map.insert(name.to_owned(), value);
        }
        Flags(map)
    }

    /// The flag's value, if it was given.
    pub fn get<T: FromStr>(&mut self, name: &str) -> Option<T> {
        let value = self.0.remove(name)?;
        Some(value.parse().unwrap_or_else(|_| {
            fail(&format!("--{name}: cannot read {value:?}"));
        }))
    }

    pub fn number<T: FromStr>(&mut self, name: &str, default: T) -> T {
        self.get(name).unwrap_or(default)
    }

    pub fn text(&mut self, name: &str, default: &str) -> String {
        self.get(name).unwrap_or_else(|| default.to_owned())
    }

    /// Stops the program if a flag was given that nothing read.
    pub fn finish(self) {
        if let Some(unknown) = self.0.keys().next() {
            fail(&format!("unknown flag --{unknown}"));
        }
    }
}

/// Prints `<program>: <message>` and exits with status 2.
pub fn fail(message: &str) -> ! {
    let program = std::env::args()
        .next()
        .and_then(|path| {
            std::path::Path::new(&path)
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    eprintln!("{program}: {message}");
    std::process::exit(2);
}
