//! The communicator's configuration from the CTA options, and the header lines that say
//! what runs (so that a saved table says how it was made).

use nccl_channel::{CommConfig, CtaPolicy};

use crate::options::Opts;

/// The communicator config the CTA options ask for (`None`: NCCL's defaults, plain init).
pub(crate) fn comm_config(o: &Opts) -> Option<CommConfig> {
    if o.cta_policy.is_none()
        && o.min_ctas.is_none()
        && o.max_ctas.is_none()
        && o.nvls_ctas.is_none()
    {
        return None;
    }
    let mut c = CommConfig::new();
    if let Some(p) = &o.cta_policy {
        c = c.cta_policy(match p.as_str() {
            "efficiency" => CtaPolicy::EFFICIENCY,
            "zero" => CtaPolicy::ZERO,
            _ => CtaPolicy::DEFAULT,
        });
    }
    if let Some(n) = o.min_ctas {
        c = c.min_ctas(n);
    }
    if let Some(n) = o.max_ctas {
        c = c.max_ctas(n);
    }
    if let Some(n) = o.nvls_ctas {
        c = c.nvls_ctas(n);
    }
    Some(c)
}

/// The header lines that say which memory modes and communicator config run.
pub(crate) fn print_setup(o: &Opts) {
    let modes: Vec<String> = o
        .mems
        .iter()
        .map(|m| format!("{} ({})", m.name(), m.describe()))
        .collect();
    println!("# memory modes (-R): {}", modes.join(", "));
    let opt = |v: Option<u32>| v.map_or("-".to_string(), |v| v.to_string());
    println!(
        "# config: cta_policy {}, min_ctas {}, max_ctas {}, nvls_ctas {} (-: NCCL's default)",
        o.cta_policy.as_deref().unwrap_or("-"),
        opt(o.min_ctas),
        opt(o.max_ctas),
        opt(o.nvls_ctas)
    );
}

/// The command line as it was given.
pub(crate) fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}
