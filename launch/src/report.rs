//! Errors as the programs print them.

/// An error and its sources, as one line (`outer: cause: root cause`): a library error
/// names what failed and keeps why (e.g. the operating system's error) as its source,
/// and a program that printed only the outer message would drop the why.
pub fn report(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        text.push_str(&format!(": {cause}"));
        next = cause.source();
    }
    text
}
