//! Where the ranks of `--nprocs` run, decided once before they start, so that the
//! launcher's first line can say it (and refuse too few GPUs before any rank waits).

use cuda_hal::{Cuda, cuda_sys};
use cuda_mock::MockDriver;
use cuda_sys::dylib::Step;

use crate::report;

/// Where the ranks run.
pub enum Machine {
    /// A CUDA driver with at least the ranks' number of GPUs.
    Gpus,
    /// No CUDA driver: why, for the first line of output.
    Simulated(String),
}

/// Picks real GPUs when a driver loads (and refuses too few of them), else simulated ones.
pub fn machine(n: usize) -> Result<Machine, String> {
    match Cuda::load() {
        Ok(cuda) => {
            let gpus = cuda.device_count().map_err(|e| report(&e))?;
            if gpus < n {
                return Err(format!(
                    "--nprocs {n} needs {n} GPUs; this machine has {gpus}"
                ));
            }
            Ok(Machine::Gpus)
        }
        Err(e) => Ok(Machine::Simulated(no_driver_reason(&e))),
    }
}

/// The memory, in bytes, of each of the `n` devices the ranks of `--nprocs n` get: the
/// GPUs 0..n, or without a CUDA driver the simulated devices a rank's machine has. A
/// program checks its sizes against it before any rank starts, so that a size that cannot
/// fit is one error of the launcher rather than one per rank (which a rank may not live to
/// print once the launcher stops the others).
pub fn device_memory(n: usize) -> Result<Vec<usize>, String> {
    let sizes = |cuda: &Cuda| -> Result<Vec<usize>, String> {
        (0..n)
            .map(|d| cuda.device(d).and_then(|dev| dev.total_memory()))
            .collect::<Result<_, _>>()
            .map_err(|e| report(&e))
    };
    match Cuda::load() {
        Ok(cuda) => sizes(&cuda),
        Err(_) => {
            let (cuda, _gpus) = MockDriver::with_devices(n)
                .build_with(Cuda::from_driver)
                .map_err(|e| report(&e))?;
            sizes(&cuda)
        }
    }
}

/// Why the CUDA driver did not load, in one line: the loader's error lists every place
/// it tried, too long for a header.
pub(crate) fn no_driver_reason(e: &cuda_hal::Error) -> String {
    match e {
        cuda_hal::Error::Load(cuda_sys::LoadError::NotFound { attempts, .. }) => {
            // The first place searched: the names asked first are those of a driver
            // already loaded, which say nothing of where a driver was looked for.
            let searched = attempts.0.iter().filter(|a| a.step != Step::AlreadyLoaded);
            match searched.clone().next() {
                Some(first) => format!("{} places tried, first {first}", searched.count()),
                None => "no place to look for libcuda".to_string(),
            }
        }
        other => other.to_string(),
    }
}

/// The first 100 characters of `text`, with `…` if cut.
pub(crate) fn short(text: &str) -> String {
    match text.char_indices().nth(100) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}
