//! Environments given explicitly, for the `from_lookup` forms of `World` and `Rendezvous`:
//! tests of the launcher rules never read or change the process's own environment.
#![allow(dead_code, unreachable_pub, clippy::expect_used)]

#[cfg(feature = "rendezvous")]
use nccl_channel::{Error, Rendezvous, World};

/// Variables as owned pairs.
pub type Env = Vec<(String, String)>;

/// `pairs` as an [`Env`].
pub fn env(pairs: &[(&str, &str)]) -> Env {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A lookup function over `env`, as `from_lookup` takes.
pub fn lookup(env: &Env) -> impl Fn(&str) -> Option<String> + '_ {
    |name| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
}

/// The rendezvous the launcher variables `vars` derive (they must name a world).
#[cfg(feature = "rendezvous")]
pub fn derive(vars: &[(&str, &str)]) -> Result<Option<Rendezvous>, Error> {
    let e = env(vars);
    let world = World::from_lookup(lookup(&e))?.expect("a world");
    Rendezvous::from_lookup(&world, lookup(&e))
}
