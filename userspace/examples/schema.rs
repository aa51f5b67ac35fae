//! Prints docs/schema.json, generated from the record types
//! (userspace/src/records/): `cargo run -p stalltrace --example schema >
//! docs/schema.json`. A unit test fails while the committed file differs.

fn main() {
    print!("{}", stalltrace::records::schema::document());
}
