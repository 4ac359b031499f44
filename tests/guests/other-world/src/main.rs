//! A WASI command component (world `wasi:cli/command`): a valid component that does not
//! export the tenant world's handler, for the upload tests.

fn main() {
    println!("this component targets wasi:cli/command, not sluice:tenant/component");
}
