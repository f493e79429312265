//! Mixture-of-experts dispatch and combine with the variable-size all-to-all
//! (`Communicator::all_to_all_v`). Each rank holds `--tokens` tokens of `--hidden`
//! elements; a deterministic router sends each to one of the experts, which are spread
//! over the ranks (`--experts-per-rank` each), unevenly: some ranks send a peer nothing.
//! The ranks
//!
//! 1. tell each other how many tokens they send (an `all_to_all` of one count per rank),
//! 2. dispatch the tokens, and their experts' ids, to the experts' ranks (two
//!    `all_to_all_v` in one group),
//! 3. run the experts: expert `e` multiplies its tokens by `e + 1` (on the host, through
//!    copies: no kernel, so that simulated devices run it too),
//! 4. combine: the reverse `all_to_all_v` brings each result back to its token's rank,
//!
//! and check the tokens each received and the results against a host reference, each
//! printing one line that starts with `OK`.
//!
//! ```text
//! # Launcher: one rank per GPU (on a machine without a CUDA driver, on simulated devices)
//! moe_dispatch --nprocs 4
//! # Under a launcher, or one rank configured by the environment, as the allgather demo
//! torchrun --no-python --nproc-per-node 2 moe_dispatch
//! NCCL_CHANNEL_NPROCS=2 NCCL_CHANNEL_PROCID=0 NCCL_COMM_ID=127.0.0.1:8000 moe_dispatch &
//! NCCL_CHANNEL_NPROCS=2 NCCL_CHANNEL_PROCID=1 NCCL_COMM_ID=127.0.0.1:8000 moe_dispatch
//! ```

use nccl_launch as launch;

use std::process::ExitCode;
use std::time::Duration;

use cuda_hal::{DeviceBuffer, Stream};
use nccl_channel::{Communicator, Error, World, group};

/// The most elements (`--tokens` × `--hidden`) a rank holds.
const MAX_ELEMENTS: usize = 1 << 24;

/// Mixture-of-experts dispatch and combine over the variable-size all-to-all: one rank
/// per process, configured by the environment, or `--nprocs N` to start N ranks here.
#[derive(Clone, Debug, clap::Parser)]
#[command(name = "moe_dispatch", version)]
struct Opts {
    /// Start N ranks, one process each: on its own GPU, or on a simulated device without a
    /// CUDA driver (for a world from the environment or a launcher, leave it out).
    #[arg(long, value_name = "N", value_parser = launch::positive)]
    nprocs: Option<usize>,
    /// The GPU of this rank, for a world from the environment: cuda://<index>,
    /// cuda://GPU-<uuid>, or cuda:// (default: the rank's local index). With --nprocs each
    /// rank takes its own GPU.
    #[arg(
        long,
        value_name = "cuda://<index>|cuda://GPU-<uuid>",
        conflicts_with = "nprocs"
    )]
    device: Option<String>,
    /// Tokens on each rank.
    #[arg(long, value_name = "N", default_value_t = 6, value_parser = launch::positive)]
    tokens: usize,
    /// Elements of each token.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = launch::positive)]
    hidden: usize,
    /// Experts on each rank.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = launch::positive)]
    experts_per_rank: usize,
    /// How long a rank waits for the others (for the unique id from a launcher's
    /// rendezvous, and on simulated devices in NCCL), and how long the ranks of --nprocs
    /// may take.
    #[arg(long, value_name = "SECONDS", default_value = "120", value_parser = launch::seconds)]
    timeout: Duration,
}

fn main() -> ExitCode {
    // `--help` and `--version` exit 0; a bad argument exits 2 with clap's message.
    let opts = <Opts as clap::Parser>::parse();
    let world = match World::from_env() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("moe_dispatch: {e}");
            return ExitCode::from(2);
        }
    };
    let result = sizes(&opts).and_then(|()| match (world, opts.nprocs) {
        (Some(world), Some(_)) => Err(launch::nprocs_in_a_world(&world)),
        (Some(world), None) => run_rank_from_env(world, &opts),
        (None, Some(n)) => launch(n, &opts),
        (None, None) => Err(
            "no world configured: pass --nprocs N, start the ranks with a launcher (torchrun \
             --no-python, srun, mpirun), or set NCCL_CHANNEL_NPROCS/NCCL_CHANNEL_PROCID and \
             NCCL_COMM_ID=host:port; NCCL was not opened"
                .to_string(),
        ),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("moe_dispatch: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--tokens` × `--hidden` within [`MAX_ELEMENTS`].
fn sizes(o: &Opts) -> Result<(), String> {
    match o.tokens.checked_mul(o.hidden) {
        Some(n) if n <= MAX_ELEMENTS => Ok(()),
        _ => Err(format!(
            "--tokens {} × --hidden {} is more than the {MAX_ELEMENTS} elements a rank may hold",
            o.tokens, o.hidden
        )),
    }
}

/// One rank, everything from the environment and `--device`: its first line says where
/// it runs (a GPU, or a simulated device when there is no CUDA driver).
fn run_rank_from_env(world: World, o: &Opts) -> Result<(), String> {
    let setup = launch::RankSetup {
        device: o.device.clone(),
        timeout: Some(o.timeout),
        ..Default::default()
    };
    let rank = launch::rank_channel(world, &setup)?;
    println!("{}", rank.line);
    let ch = &rank.channel;
    let line = moe(ch.comm(), ch.stream(), o).map_err(|e| launch::report(&e))?;
    println!("{line}");
    rank.close()
}

/// Element `j` of token `k` of rank `r`.
fn token(r: usize, k: usize, j: usize) -> f32 {
    (r * 1000 + k * 10 + j) as f32
}

/// The router: the expert of token `k` of rank `r`, of `experts` (uneven on purpose).
fn route(r: usize, k: usize, experts: usize) -> usize {
    k * (k + r) * (2 * r + 1) % experts
}

/// What an expert does: expert `e` multiplies by `e + 1`.
fn expert(e: usize, x: f32) -> f32 {
    x * (e + 1) as f32
}

/// The counts and displacements of an all-to-all-v's side, in elements: `rows[p]` rows of
/// `width` elements for rank `p`, packed in rank order.
fn layout(rows: &[usize], width: usize) -> (Vec<usize>, Vec<usize>) {
    let counts: Vec<usize> = rows.iter().map(|&r| r * width).collect();
    let displs = counts
        .iter()
        .scan(0, |at, &c| {
            let d = *at;
            *at += c;
            Some(d)
        })
        .collect();
    (counts, displs)
}

/// An error of the example's own checks.
fn wrong(problem: String) -> Error {
    Error::InvalidArgument {
        what: "moe_dispatch",
        problem,
    }
}

/// One rank's dispatch, experts and combine; the line it prints.
fn moe(comm: &Communicator, s: &Stream, o: &Opts) -> nccl_channel::Result<String> {
    let (n, r, ctx) = (comm.size(), comm.rank(), comm.context());
    let (t, h, per_rank) = (o.tokens, o.hidden, o.experts_per_rank);
    let experts = n * per_rank;
    let expert_of: Vec<usize> = (0..t).map(|k| route(r, k, experts)).collect();
    let rank_of = |e: usize| e / per_rank;
    // The dispatch order: by the expert's rank, each rank's tokens in token order.
    let mut order: Vec<usize> = (0..t).collect();
    order.sort_by_key(|&k| rank_of(expert_of[k]));
    let mut to_rank = vec![0usize; n];
    for &e in &expert_of {
        to_rank[rank_of(e)] += 1;
    }

    // 1. How many tokens each rank gets from each: one count per rank, all-to-all.
    let counts: Vec<u64> = to_rank.iter().map(|&c| c as u64).collect();
    let counts_out = DeviceBuffer::from_slice(ctx, &counts)?;
    let mut counts_in = DeviceBuffer::<u64>::zeroed(ctx, n)?;
    comm.all_to_all(&counts_out, &mut counts_in, s)?;
    s.synchronize()?;
    let from_rank: Vec<usize> = counts_in.to_vec()?.iter().map(|&c| c as usize).collect();
    let got = from_rank.iter().sum::<usize>();

    // 2. Dispatch: the tokens (rows of `h`) and their experts, to the experts' ranks.
    let rows: Vec<f32> = order
        .iter()
        .flat_map(|&k| (0..h).map(move |j| token(r, k, j)))
        .collect();
    let ids: Vec<u32> = order.iter().map(|&k| expert_of[k] as u32).collect();
    let (row_counts, row_displs) = layout(&to_rank, h);
    let (id_counts, id_displs) = layout(&to_rank, 1);
    let (in_row_counts, in_row_displs) = layout(&from_rank, h);
    let (in_id_counts, in_id_displs) = layout(&from_rank, 1);
    let rows_out = DeviceBuffer::from_slice(ctx, &rows)?;
    let ids_out = DeviceBuffer::from_slice(ctx, &ids)?;
    let mut rows_in = DeviceBuffer::<f32>::zeroed(ctx, got * h)?;
    let mut ids_in = DeviceBuffer::<u32>::zeroed(ctx, got)?;
    group(comm.nccl(), || {
        comm.all_to_all_v(
            &rows_out,
            &row_counts,
            &row_displs,
            &mut rows_in,
            &in_row_counts,
            &in_row_displs,
            s,
        )?;
        comm.all_to_all_v(
            &ids_out,
            &id_counts,
            &id_displs,
            &mut ids_in,
            &in_id_counts,
            &in_id_displs,
            s,
        )
    })?;
    s.synchronize()?;
    let (rows_here, ids_here) = (rows_in.to_vec()?, ids_in.to_vec()?);
    // The host's reference: every rank's tokens routed here, by rank, in token order.
    let (mut want_rows, mut want_ids) = (Vec::new(), Vec::new());
    for p in 0..n {
        for k in 0..t {
            let e = route(p, k, experts);
            if rank_of(e) == r {
                want_rows.extend((0..h).map(|j| token(p, k, j)));
                want_ids.push(e as u32);
            }
        }
    }
    if rows_here != want_rows || ids_here != want_ids {
        return Err(wrong(format!(
            "rank {r} received tokens {rows_here:?} of experts {ids_here:?}, not \
             {want_rows:?} of {want_ids:?}"
        )));
    }

    // 3. The experts of this rank, on the host.
    let results: Vec<f32> = rows_here
        .chunks(h)
        .zip(&ids_here)
        .flat_map(|(row, &e)| row.iter().map(move |&x| expert(e as usize, x)))
        .collect();
    let results_out = DeviceBuffer::from_slice(ctx, &results)?;

    // 4. Combine: the reverse exchange, each result back to its token's dispatch slot.
    let mut back = DeviceBuffer::<f32>::zeroed(ctx, t * h)?;
    comm.all_to_all_v(
        &results_out,
        &in_row_counts,
        &in_row_displs,
        &mut back,
        &row_counts,
        &row_displs,
        s,
    )?;
    s.synchronize()?;
    let back = back.to_vec()?;
    let mut combined = vec![0f32; t * h];
    for (slot, &k) in order.iter().enumerate() {
        combined[k * h..][..h].copy_from_slice(&back[slot * h..][..h]);
    }
    let want: Vec<f32> = (0..t * h)
        .map(|i| expert(expert_of[i / h], token(r, i / h, i % h)))
        .collect();
    if combined != want {
        return Err(wrong(format!(
            "rank {r} combined {combined:?}, not {want:?}"
        )));
    }
    Ok(format!(
        "OK: {t} tokens to experts {expert_of:?}; sent {to_rank:?} and received \
         {from_rank:?} tokens per rank; experts' results combined back match the host's"
    ))
}

/// The launcher: one process per rank, each on its own GPU, or on a simulated device when
/// there is no CUDA driver (the simulated NCCL then moves data between the processes).
fn launch(n: usize, o: &Opts) -> Result<(), String> {
    let machine = launch::machine(n)?;
    if let launch::Machine::Simulated(why) = machine {
        println!(
            "no CUDA driver ({why}): running {n} rank{} on simulated devices, one process each \
             (mock driver and NCCL, data moved between the processes over loopback)",
            if n == 1 { "" } else { "s" }
        );
    }
    let args: Vec<String> = [
        "--tokens",
        &o.tokens.to_string(),
        "--hidden",
        &o.hidden.to_string(),
        "--experts-per-rank",
        &o.experts_per_rank.to_string(),
        "--timeout",
        &o.timeout.as_secs_f64().to_string(),
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    launch::processes(n, &args, o.timeout, launch::Output::Prefixed)
}
