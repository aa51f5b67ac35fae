//! Every record shown in the README and docs/ is one the binary could write:
//! each ```json block holds whole records that docs/schema.json accepts (a
//! unit test in records/schema.rs holds that file to the record types). An
//! example of an older schema, or one with `...` in it, fails here.

use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Markdown files whose examples a reader copies.
fn documents() -> Vec<PathBuf> {
    let mut docs = vec![workspace().join("README.md")];
    let mut more: Vec<PathBuf> = std::fs::read_dir(workspace().join("docs"))
        .expect("docs/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    more.sort();
    docs.extend(more);
    docs
}

/// (first line, text) of each ```json block.
fn json_blocks(markdown: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, String)> = None;
    for (i, line) in markdown.lines().enumerate() {
        match open.as_mut() {
            None if line.trim_start().starts_with("```json") => {
                open = Some((i + 2, String::new()));
            }
            None => {}
            Some(_) if line.trim_start().starts_with("```") => {
                blocks.extend(open.take());
            }
            Some((_, text)) => {
                text.push_str(line);
                text.push('\n');
            }
        }
    }
    blocks
}

#[test]
fn every_record_in_the_docs_follows_the_schema() {
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(workspace().join("docs/schema.json")).unwrap(),
    )
    .unwrap();
    let validator = jsonschema::draft202012::options()
        .should_validate_formats(true)
        .build(&schema)
        .expect("docs/schema.json compiles");
    let mut checked = 0;
    let mut problems = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let name = doc.file_name().unwrap().to_string_lossy().into_owned();
        for (line, block) in json_blocks(&text) {
            for value in serde_json::Deserializer::from_str(&block).into_iter() {
                let record: serde_json::Value = match value {
                    Ok(v) => v,
                    Err(e) => {
                        problems.push(format!("{name}:{line}: not JSON: {e}"));
                        break;
                    }
                };
                checked += 1;
                for e in validator.iter_errors(&record) {
                    problems.push(format!("{name}:{line}: {}: {e}", e.instance_path()));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The README's block example at least: a test that found nothing to
    // check would pass on any docs.
    assert!(
        checked >= 1,
        "no ```json record found in README.md or docs/"
    );
}

#[test]
fn a_schema_1_histogram_is_refused() {
    // What the README showed before: buckets as [low, high, count].
    let old = r#"```json
{"ts": "2026-11-22T00:03:06.219784Z", "host": "vm", "type": "block"}
```"#;
    let blocks = json_blocks(old);
    assert_eq!(blocks.len(), 1);
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(workspace().join("docs/schema.json")).unwrap(),
    )
    .unwrap();
    let record: serde_json::Value = serde_json::from_str(&blocks[0].1).unwrap();
    assert!(!jsonschema::is_valid(&schema, &record));
}
