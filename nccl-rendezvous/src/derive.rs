//! The rendezvous address from the launcher's environment: the rule of
//! [`Rendezvous::from_lookup`](crate::Rendezvous::from_lookup).

use std::time::Duration;

use crate::decimal::{parse_decimal, parse_port, parse_seconds};
use crate::host_port::parse_host_port;
use crate::hostlist;
use crate::point::{DEFAULT_TIMEOUT, Rendezvous, RendezvousKind};
use crate::secret::{RendezvousSecret, SECRET_FILE_ENV};
use crate::{Error, Result};

/// The world as the rule reads it: the launcher family that gave it, and its size.
struct World<'a> {
    source: &'a str,
    size: usize,
}

/// The lowest port derived from a job's id ([`Rendezvous::from_env`](crate::Rendezvous::from_env)).
pub const PORT_BASE: u16 = 20000;

/// How many ports derivation spreads jobs over, from [`PORT_BASE`]: 20000–31999, below
/// Linux's ephemeral range (32768 on).
pub const PORT_SPAN: u16 = 12000;

/// The Slurm node-list variables, most specific first.
const NODELISTS: [&str; 3] = [
    "SLURM_STEP_NODELIST",
    "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",
];

type Lookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// One derived address before it becomes a [`Rendezvous`].
struct Found {
    kind: RendezvousKind,
    host: String,
    port: u16,
    from: Vec<&'static str>,
    key: String,
}

pub(crate) fn derive(
    launcher: &str,
    size: usize,
    lookup: Lookup<'_>,
) -> Result<Option<Rendezvous>> {
    let world = &World {
        source: launcher,
        size,
    };
    let get = |name: &str| {
        lookup(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    let timeout = timeout(&get)?;
    let found = match find(world, &get)? {
        Some(f) => f,
        None => return Ok(None),
    };
    let mut rdv = Rendezvous::new(
        found.kind,
        found.host,
        found.port,
        found.from.join(", "),
        found.key,
        timeout,
    );
    if let Some(path) = get(SECRET_FILE_ENV) {
        rdv = rdv.secret(RendezvousSecret::from_file(&path)?);
    }
    if let Some(v) = get(ENCRYPT_NCCL_ENV) {
        let on = match v.as_str() {
            "1" => true,
            "0" => false,
            _ => {
                return Err(Error::Env {
                    variable: ENCRYPT_NCCL_ENV.into(),
                    value: v,
                    problem: "expected 1 (encrypt NCCL's sockets with a key derived from the \
                              rendezvous's secret) or 0"
                        .into(),
                });
            }
        };
        if on && !rdv.has_secret() {
            return Err(Error::Env {
                variable: ENCRYPT_NCCL_ENV.into(),
                value: v,
                problem: format!(
                    "NCCL's key is derived from the rendezvous's secret: set {SECRET_FILE_ENV} \
                     too"
                ),
            });
        }
        rdv = rdv.encrypt_nccl(on);
    }
    Ok(Some(rdv))
}

/// The variable that turns on [`Rendezvous::encrypt_nccl`] (`1`; `0` leaves it off).
pub const ENCRYPT_NCCL_ENV: &str = "NCCL_CHANNEL_RENDEZVOUS_ENCRYPT_NCCL";

fn find(world: &World<'_>, get: &dyn Fn(&str) -> Option<String>) -> Result<Option<Found>> {
    if let Some(v) = get("NCCL_CHANNEL_RENDEZVOUS") {
        let (host, port) = host_port("NCCL_CHANNEL_RENDEZVOUS", &v)?;
        return Ok(Some(Found {
            kind: RendezvousKind::RankZero,
            host,
            port,
            from: vec!["NCCL_CHANNEL_RENDEZVOUS"],
            key: get("NCCL_CHANNEL_RENDEZVOUS_KEY").unwrap_or_else(|| job_key(world, get)),
        }));
    }
    if !matches!(world.source, "torchrun" | "Slurm" | "Open MPI" | "PMI") {
        return Ok(None);
    }
    let master = master(get)?;
    if world.source == "torchrun" && get("TORCHELASTIC_USE_AGENT_STORE").as_deref() == Some("True")
    {
        let Some((host, port)) = master else {
            return Err(Error::Env {
                variable: "TORCHELASTIC_USE_AGENT_STORE".into(),
                value: "True".into(),
                problem: "torchrun's agent store is at MASTER_ADDR:MASTER_PORT, and they are \
                          not both set"
                    .into(),
            });
        };
        return Ok(Some(Found {
            kind: RendezvousKind::TorchStore,
            host,
            port,
            from: vec!["MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"],
            key: job_key(world, get),
        }));
    }
    if let Some((host, port)) = master {
        return Ok(Some(Found {
            kind: RendezvousKind::RankZero,
            host,
            port,
            from: vec!["MASTER_ADDR", "MASTER_PORT"],
            key: job_key(world, get),
        }));
    }
    if world.source == "torchrun" {
        // torchrun sets both; one alone is a hand-made environment missing the other.
        let (set, missing) = match (get("MASTER_ADDR"), get("MASTER_PORT")) {
            (Some(v), None) => (("MASTER_ADDR", v), "MASTER_PORT"),
            (None, Some(v)) => (("MASTER_PORT", v), "MASTER_ADDR"),
            _ => return Ok(None),
        };
        return Err(Error::Env {
            variable: set.0.into(),
            value: set.1,
            problem: format!(
                "it is set but {missing} is not: rank 0 serves the id at MASTER_ADDR:MASTER_PORT"
            ),
        });
    }
    match world.source {
        "Slurm" => slurm(world, get),
        "Open MPI" => open_mpi(world, get),
        "PMI" => pmi(world, get),
        _ => Ok(None),
    }
}

/// Slurm: the first host of the step's (or job's) node list, the Slurm port.
fn slurm(world: &World<'_>, get: &dyn Fn(&str) -> Option<String>) -> Result<Option<Found>> {
    let Some((host, list_var)) = slurm_first_host(get)? else {
        return Err(ask_for_master_addr(
            "SLURM_NTASKS",
            get,
            "Slurm set no node list (SLURM_STEP_NODELIST, SLURM_JOB_NODELIST, SLURM_NODELIST), \
             so rank 0's host is unknown; set MASTER_ADDR and MASTER_PORT",
        ));
    };
    let port = match master_port(get)? {
        Some(p) => Some((p, vec!["MASTER_PORT"])),
        None => slurm_port(get),
    };
    let Some((port, mut from)) = port else {
        return Err(ask_for_master_addr(
            "SLURM_NTASKS",
            get,
            "SLURM_JOB_ID is not set, so no port can be derived; set MASTER_PORT (or \
             MASTER_ADDR and MASTER_PORT)",
        ));
    };
    from.insert(0, list_var);
    Ok(Some(Found {
        kind: RendezvousKind::RankZero,
        host,
        port,
        from,
        key: job_key(world, get),
    }))
}

/// Open MPI: loopback on one node, else MASTER_ADDR or Slurm's first host; the job's port.
fn open_mpi(world: &World<'_>, get: &dyn Fn(&str) -> Option<String>) -> Result<Option<Found>> {
    let (port, port_var) = if let Some(p) = master_port(get)? {
        (p, "MASTER_PORT")
    } else if let Some(id) = get("OMPI_MCA_ess_base_jobid") {
        (port_of(number(&id)), "OMPI_MCA_ess_base_jobid")
    } else if let Some(ns) = get("PMIX_NAMESPACE") {
        (port_of(fnv1a(ns.as_bytes())), "PMIX_NAMESPACE")
    } else {
        return Err(ask_for_master_addr(
            "OMPI_COMM_WORLD_SIZE",
            get,
            "neither OMPI_MCA_ess_base_jobid nor PMIX_NAMESPACE is set, so no port can be \
             derived; set MASTER_PORT as well",
        ));
    };
    let one_node = get("OMPI_COMM_WORLD_LOCAL_SIZE").is_some_and(|l| l == world.size.to_string());
    let (host, host_vars) = if one_node {
        (
            "127.0.0.1".to_string(),
            vec!["OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE"],
        )
    } else if let Some(addr) = get("MASTER_ADDR") {
        (addr, vec!["MASTER_ADDR"])
    } else if let Some((host, var)) = slurm_first_host(get)? {
        (host, vec![var])
    } else if get("OMPI_COMM_WORLD_LOCAL_SIZE").is_none() {
        return Err(Error::Env {
            variable: "OMPI_COMM_WORLD_LOCAL_SIZE".into(),
            value: String::new(),
            problem: "it is not set, so whether the job runs on one node is unknown, and no \
                      Slurm node list names rank 0's host; export MASTER_ADDR=<rank 0's host> \
                      to every rank (mpirun -x MASTER_ADDR=...), or set \
                      NCCL_CHANNEL_RENDEZVOUS=host:port"
                .into(),
        });
    } else {
        return Err(ask_for_master_addr(
            "OMPI_COMM_WORLD_LOCAL_SIZE",
            get,
            "Open MPI runs this job on several nodes and not inside Slurm, so rank 0's host \
             is unknown; export MASTER_ADDR=<rank 0's host> to every rank (mpirun -x \
             MASTER_ADDR=...)",
        ));
    };
    let mut from = host_vars;
    from.push(port_var);
    Ok(Some(Found {
        kind: RendezvousKind::RankZero,
        host,
        port,
        from,
        key: job_key(world, get),
    }))
}

/// MPICH Hydra's PMI: loopback and the shared proxy's pid on one node; else Slurm's rule.
fn pmi(world: &World<'_>, get: &dyn Fn(&str) -> Option<String>) -> Result<Option<Found>> {
    let one_node = get("MPI_LOCALNRANKS").is_some_and(|l| l == world.size.to_string());
    if one_node && let Some(port) = master_port(get)? {
        return Ok(Some(Found {
            kind: RendezvousKind::RankZero,
            host: "127.0.0.1".into(),
            port,
            from: vec!["MPI_LOCALNRANKS", "PMI_SIZE", "MASTER_PORT"],
            key: job_key(world, get),
        }));
    }
    if one_node {
        let parent = std::os::unix::process::parent_id();
        return Ok(Some(Found {
            kind: RendezvousKind::RankZero,
            host: "127.0.0.1".into(),
            port: port_of(u64::from(parent)),
            from: vec!["MPI_LOCALNRANKS", "PMI_SIZE", "the parent process id"],
            key: format!("pmi-{parent}"),
        }));
    }
    let port = match master_port(get)? {
        Some(p) => Some((p, vec!["MASTER_PORT"])),
        None => slurm_port(get),
    };
    if let (Some(addr), Some((port, mut from))) = (get("MASTER_ADDR"), port.clone()) {
        from.insert(0, "MASTER_ADDR");
        return Ok(Some(Found {
            kind: RendezvousKind::RankZero,
            host: addr,
            port,
            from,
            key: job_key(world, get),
        }));
    }
    if let (Some((host, var)), Some((port, mut from))) = (slurm_first_host(get)?, port) {
        from.insert(0, var);
        return Ok(Some(Found {
            kind: RendezvousKind::RankZero,
            host,
            port,
            from,
            key: job_key(world, get),
        }));
    }
    if get("MASTER_ADDR").is_some() {
        return Err(ask_for_master_addr(
            "MASTER_ADDR",
            get,
            "it names rank 0's host, but no port is known (no MASTER_PORT, and not inside \
             Slurm); set MASTER_PORT too",
        ));
    }
    Err(ask_for_master_addr(
        "PMI_SIZE",
        get,
        "the ranks run on several nodes (MPI_LOCALNRANKS is not PMI_SIZE) and not \
         inside Slurm, so rank 0's host is unknown; export MASTER_ADDR and MASTER_PORT to \
         every rank (mpiexec -genv MASTER_ADDR <rank 0's host> -genv MASTER_PORT <port>)",
    ))
}

/// The first host of the most specific Slurm node list set, and that list's variable.
fn slurm_first_host(
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<(String, &'static str)>> {
    for var in NODELISTS {
        if let Some(list) = get(var) {
            return match hostlist::first_host(&list) {
                Some(host) => Ok(Some((host, var))),
                None => Err(Error::Env {
                    variable: var.into(),
                    value: list,
                    problem: "not a Slurm host list (like gpu[01-04,07],login1)".into(),
                }),
            };
        }
    }
    Ok(None)
}

/// The Slurm port and its variables, `None` without `SLURM_JOB_ID`.
fn slurm_port(get: &dyn Fn(&str) -> Option<String>) -> Option<(u16, Vec<&'static str>)> {
    let job = number(&get("SLURM_JOB_ID")?);
    let (step, from) = match get("SLURM_STEP_ID") {
        Some(s) => (number(&s), vec!["SLURM_JOB_ID", "SLURM_STEP_ID"]),
        None => (0, vec!["SLURM_JOB_ID"]),
    };
    Some((port_of(job.wrapping_mul(16).wrapping_add(step % 16)), from))
}

/// `PORT_BASE + n mod PORT_SPAN`.
fn port_of(n: u64) -> u16 {
    // The remainder is below PORT_SPAN, so the sum fits.
    PORT_BASE + (n % u64::from(PORT_SPAN)) as u16
}

/// A decimal value as itself, anything else as its FNV-1a hash.
fn number(text: &str) -> u64 {
    parse_decimal::<u64>(text).unwrap_or_else(|| fnv1a(text.as_bytes()))
}

/// 64-bit FNV-1a: stable across runs and platforms (unlike std's hasher).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// `MASTER_PORT` alone: the port a derived host is served on instead of the derived port
/// (the way out when that one is taken).
fn master_port(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<u16>> {
    let Some(port) = get("MASTER_PORT") else {
        return Ok(None);
    };
    match parse_port(&port) {
        Some(p) => Ok(Some(p)),
        None => Err(Error::Env {
            variable: "MASTER_PORT".into(),
            value: port,
            problem: "expected a port from 1 to 65535".into(),
        }),
    }
}

/// `MASTER_ADDR:MASTER_PORT` when both are set.
fn master(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<(String, u16)>> {
    let (Some(addr), Some(port)) = (get("MASTER_ADDR"), get("MASTER_PORT")) else {
        return Ok(None);
    };
    let port = parse_port(&port).ok_or_else(|| Error::Env {
        variable: "MASTER_PORT".into(),
        value: port.clone(),
        problem: "expected a port from 1 to 65535".into(),
    })?;
    let host = addr
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    Ok(Some((host, port)))
}

fn host_port(variable: &str, value: &str) -> Result<(String, u16)> {
    parse_host_port(value).map_err(|detail| Error::Env {
        variable: variable.into(),
        value: value.into(),
        problem: format!(
            "expected host:port with a port from 1 to 65535 (IPv6 in brackets: [::1]:29500): \
             {detail}"
        ),
    })
}

fn timeout(get: &dyn Fn(&str) -> Option<String>) -> Result<Duration> {
    let Some(text) = get("NCCL_CHANNEL_RENDEZVOUS_TIMEOUT") else {
        return Ok(DEFAULT_TIMEOUT);
    };
    parse_seconds(&text)
        .filter(|s| s.is_finite() && *s > 0.0 && *s < 1e9)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| Error::Env {
            variable: "NCCL_CHANNEL_RENDEZVOUS_TIMEOUT".into(),
            value: text,
            problem: "expected a positive number of seconds".into(),
        })
}

/// The identity every rank of the job shares, for the key.
fn job_key(world: &World<'_>, get: &dyn Fn(&str) -> Option<String>) -> String {
    if let Some(run) = get("TORCHELASTIC_RUN_ID") {
        let attempt = get("TORCHELASTIC_RESTART_COUNT").unwrap_or_else(|| "0".into());
        return format!("torchrun-{run}-attempt_{attempt}");
    }
    if world.source == "Open MPI" {
        if let Some(id) = get("OMPI_MCA_ess_base_jobid") {
            return format!("ompi-{id}");
        }
        if let Some(ns) = get("PMIX_NAMESPACE") {
            return format!("pmix-{ns}");
        }
    }
    if let Some(job) = get("SLURM_JOB_ID") {
        let step = get("SLURM_STEP_ID").unwrap_or_else(|| "none".into());
        return format!("slurm-{job}.{step}");
    }
    "nccl-channel".into()
}

fn ask_for_master_addr(variable: &str, get: &dyn Fn(&str) -> Option<String>, why: &str) -> Error {
    Error::Env {
        variable: variable.into(),
        value: get(variable).unwrap_or_default(),
        problem: format!(
            "{why} (or set NCCL_CHANNEL_RENDEZVOUS=host:port, rank 0's host and a free \
             port, for every rank)"
        ),
    }
}
