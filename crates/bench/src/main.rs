//! `cairn-bench`: the same commands as `cairn bench`, for running without the `cairn` binary.

use clap::Parser;

fn main() {
    let cli = cairn_bench::Cli::parse();
    std::process::exit(cairn_bench::main_with(cli.cmd));
}
