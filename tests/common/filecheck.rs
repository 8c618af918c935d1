//! Checks that lines appear in a text in a given order, as LLVM's
//! FileCheck does with `CHECK:` lines: each expected fragment must be found
//! in a line after the line that matched the fragment before it.
#![allow(
    clippy::arithmetic_side_effects,
    reason = "positions within a slice of lines, which cannot overflow"
)]

/// `Ok` when every fragment of `expected` is found, in order, each in a
/// later line than the previous one; else says which one was not found
/// after which line, with the text.
pub fn check_order(text: &str, expected: &[&str]) -> Result<(), String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut from = 0;
    for (k, want) in expected.iter().enumerate() {
        match lines[from..].iter().position(|l| l.contains(want)) {
            Some(i) => from += i + 1,
            None => {
                let after = if k == 0 {
                    "the start".to_string()
                } else {
                    format!("{:?}", expected[k - 1])
                };
                return Err(format!("{want:?} not found after {after} in:\n{text}"));
            }
        }
    }
    Ok(())
}
