//! The `seckill` command; the command line itself is the library's [`seckill::cli`].

fn main() -> std::process::ExitCode {
    seckill::cli::main()
}
