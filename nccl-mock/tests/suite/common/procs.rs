//! Ranks as "processes" for the multi-process mode's tests: each with its own simulated
//! driver and NCCL ([`MockNccl::multi_process`]), talking only through the unique id's
//! bytes and the hub, as separate OS processes would. The same [`script`] also runs in
//! the in-process mode, so both modes are held to the same exact results.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::ffi::{CStr, c_void};
use std::time::Duration;

use cuda_sys::{CUdeviceptr, CUstream};
use nccl_sys::{
    ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t, ncclScalarResidence_t, ncclUniqueId,
};

use crate::common::{NCCL_OK, OK, Rig};

/// A rig whose ranks run on several threads of the test.
pub struct SharedRig(pub Rig);

// SAFETY: the rig's contexts are handle values of the simulated driver, whose state is
// behind its own locks, and every call made with them is a thread-safe table call.
unsafe impl Send for SharedRig {}
// SAFETY: as for `Send`: shared use only makes table calls.
unsafe impl Sync for SharedRig {}

impl std::ops::Deref for SharedRig {
    type Target = Rig;
    fn deref(&self) -> &Rig {
        &self.0
    }
}

/// One simulated process of the multi-process mode: one GPU, its own NCCL.
pub fn process(timeout: Duration) -> Rig {
    Rig::with_nccl(1, |n| n.multi_process(true).timeout(timeout))
}

/// An id as the plain bytes that travel between processes.
pub fn id_bytes(id: &ncclUniqueId) -> [u8; 128] {
    id.internal.map(|c| c as u8)
}

pub fn id_from(bytes: [u8; 128]) -> ncclUniqueId {
    ncclUniqueId {
        internal: bytes.map(|b| b as std::ffi::c_char),
    }
}

/// The hub address a multi-process id names (after its 8-byte prefix).
pub fn id_address(bytes: &[u8; 128]) -> String {
    let rest = &bytes[8..];
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    String::from_utf8_lossy(&rest[..end]).into_owned()
}

/// A free loopback port for a fixed hub address (`NCCL_COMM_ID`), as `127.0.0.1:port`.
///
/// Picked below Linux's ephemeral range (32768-60999), in 20000-32000: a port the kernel
/// hands out for `:0` (a hub of `ncclGetUniqueId`, any outgoing connection) and that this
/// test then frees can be taken again by another socket of a parallel test before rank 0
/// binds it ("Address already in use"); ports in this range are only taken by whoever
/// names them. Each test process walks the range from a random start, so parallel copies
/// of a test binary stay apart, and skips ports that are bound now.
pub fn free_port() -> String {
    use std::hash::{BuildHasher, RandomState};
    use std::sync::Mutex;
    const LOW: u16 = 20000;
    const SPAN: u16 = 12000;
    static NEXT: Mutex<Option<u16>> = Mutex::new(None);
    let mut next = NEXT.lock().unwrap_or_else(|e| e.into_inner());
    let mut p = next.unwrap_or_else(|| {
        let random = RandomState::new().hash_one(std::process::id());
        LOW + (random % u64::from(SPAN)) as u16
    });
    loop {
        let port = p;
        p = LOW + (p - LOW + 1) % SPAN;
        let free = std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
            && std::net::TcpListener::bind(("0.0.0.0", port)).is_ok();
        if free {
            *next = Some(p);
            return format!("127.0.0.1:{port}");
        }
    }
}

/// A multi-process id naming a fixed hub address, as `NCCL_COMM_ID` gives (rank 0's
/// init starts the hub there).
pub fn comm_id(addr: &str) -> [u8; 128] {
    let mut id = [0u8; 128];
    id[..8].copy_from_slice(b"MOCKADDR");
    id[8..8 + addr.len()].copy_from_slice(addr.as_bytes());
    id
}

/// A multi-process id naming a hub at `addr` that some process already runs.
pub fn hub_at(addr: &str) -> [u8; 128] {
    let mut id = [0u8; 128];
    id[..8].copy_from_slice(b"MOCKNET1");
    id[8..8 + addr.len()].copy_from_slice(addr.as_bytes());
    id
}

/// A device element type and its NCCL name.
pub trait El: Copy + Default + PartialEq + std::fmt::Debug + Send + 'static {
    const T: ncclDataType_t;
}
macro_rules! el {
    ($($t:ty => $d:ident),*) => {$(impl El for $t { const T: ncclDataType_t = ncclDataType_t::$d; })*};
}
el!(f32 => ncclFloat32, f64 => ncclFloat64, i8 => ncclInt8, u8 => ncclUint8, i32 => ncclInt32, u64 => ncclUint64);

/// A collective call of the table, by kind.
#[derive(Clone, Copy, Debug)]
pub enum Coll {
    AllReduce(ncclRedOp_t),
    AllGather,
    ReduceScatter(ncclRedOp_t),
    Broadcast(i32),
    Reduce(ncclRedOp_t, i32),
    AllToAll,
    Gather(i32),
    Scatter(i32),
}

/// This file's helpers on the shared rig (a trait: inherent methods are crate-wide).
#[allow(clippy::too_many_arguments)]
pub trait ProcsRig {
    fn unique_id(&self) -> [u8; 128];
    fn init_rank(&self, d: usize, id: [u8; 128], n: i32, r: i32) -> (ncclResult_t, ncclComm_t);
    fn last_error(&self) -> String;
    fn stream(&self, d: usize) -> CUstream;
    fn upload<T: El>(&self, d: usize, data: &[T]) -> CUdeviceptr;
    fn download<T: El>(&self, d: usize, p: CUdeviceptr, len: usize) -> Vec<T>;
    fn free(&self, p: CUdeviceptr);
    fn coll<T: El>(
        &self,
        c: Coll,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        count: usize,
        comm: ncclComm_t,
        s: CUstream,
    ) -> ncclResult_t;
    #[allow(clippy::too_many_arguments)] // one collective's whole description
    fn run<T: El>(
        &self,
        d: usize,
        c: Coll,
        input: &[T],
        count: usize,
        out_len: usize,
        fill: T,
        comm: ncclComm_t,
    ) -> (ncclResult_t, Vec<T>);
    fn group_start(&self);
    fn group_end(&self) -> ncclResult_t;
    fn async_error(&self, comm: ncclComm_t) -> ncclResult_t;
    fn abort(&self, comm: ncclComm_t);
}

impl ProcsRig for Rig {
    /// `ncclGetUniqueId`'s bytes.
    fn unique_id(&self) -> [u8; 128] {
        let mut id = ncclUniqueId { internal: [0; 128] };
        // SAFETY: a valid out-pointer.
        let rc = unsafe { (self.nccl.fns().ncclGetUniqueId)(&mut id) };
        assert_eq!(rc, NCCL_OK, "{}", self.last_error());
        id_bytes(&id)
    }

    /// `ncclCommInitRank` on device `d`; its result and communicator.
    fn init_rank(&self, d: usize, id: [u8; 128], n: i32, r: i32) -> (ncclResult_t, ncclComm_t) {
        self.on(d);
        let mut comm = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        let rc = unsafe { (self.nccl.fns().ncclCommInitRank)(&mut comm, n, id_from(id), r) };
        (rc, comm)
    }

    /// The last error's text.
    fn last_error(&self) -> String {
        // SAFETY: returns a string owned by the library, valid until its next call.
        let p = unsafe { (self.nccl.fns().ncclGetLastError)(std::ptr::null_mut()) };
        // SAFETY: non-NULL and NUL-terminated (the mock always returns a string).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    fn stream(&self, d: usize) -> CUstream {
        self.on(d);
        let mut s = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { (self.driver.fns().cuStreamCreate)(&mut s, 0) }, OK);
        s
    }

    /// A device buffer on device `d` holding `data` (at least one byte).
    fn upload<T: El>(&self, d: usize, data: &[T]) -> CUdeviceptr {
        self.on(d);
        let f = self.driver.fns();
        let bytes = std::mem::size_of_val(data);
        let mut p = 0;
        // SAFETY: valid out-pointer; `data` holds `bytes` bytes.
        unsafe {
            assert_eq!((f.cuMemAlloc)(&mut p, bytes.max(1)), OK);
            assert_eq!((f.cuMemcpyHtoD)(p, data.as_ptr().cast(), bytes), OK);
        }
        p
    }

    /// `len` elements at `p` on device `d`.
    fn download<T: El>(&self, d: usize, p: CUdeviceptr, len: usize) -> Vec<T> {
        self.on(d);
        let mut v = vec![T::default(); len];
        // SAFETY: `v` holds `len` elements.
        let rc = unsafe {
            (self.driver.fns().cuMemcpyDtoH)(
                v.as_mut_ptr().cast(),
                p,
                std::mem::size_of_val(&v[..]),
            )
        };
        assert_eq!(rc, OK);
        v
    }

    fn free(&self, p: CUdeviceptr) {
        // SAFETY: a live allocation.
        assert_eq!(unsafe { (self.driver.fns().cuMemFree)(p) }, OK);
    }

    /// Runs collective `c` of `count` elements of `T` from `send` to `recv`.
    #[allow(clippy::too_many_arguments)]
    fn coll<T: El>(
        &self,
        c: Coll,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        count: usize,
        comm: ncclComm_t,
        s: CUstream,
    ) -> ncclResult_t {
        let f = self.nccl.fns();
        let (sp, rp) = (send as *const c_void, recv as *mut c_void);
        // SAFETY: buffers of the sizes the collective needs on the communicator's device
        // (the mock checks them).
        unsafe {
            match c {
                Coll::AllReduce(op) => (f.ncclAllReduce)(sp, rp, count, T::T, op, comm, s),
                Coll::AllGather => (f.ncclAllGather)(sp, rp, count, T::T, comm, s),
                Coll::ReduceScatter(op) => (f.ncclReduceScatter)(sp, rp, count, T::T, op, comm, s),
                Coll::Broadcast(root) => (f.ncclBroadcast)(sp, rp, count, T::T, root, comm, s),
                Coll::Reduce(op, root) => (f.ncclReduce)(sp, rp, count, T::T, op, root, comm, s),
                Coll::AllToAll => (f.ncclAlltoAll.unwrap())(sp, rp, count, T::T, comm, s),
                Coll::Gather(root) => (f.ncclGather.unwrap())(sp, rp, count, T::T, root, comm, s),
                Coll::Scatter(root) => (f.ncclScatter.unwrap())(sp, rp, count, T::T, root, comm, s),
            }
        }
    }

    /// Uploads `input`, runs `c` into a receive buffer of `out_len` elements pre-filled
    /// with `fill`, and returns the result and what the receive buffer holds after.
    #[allow(clippy::too_many_arguments)]
    fn run<T: El>(
        &self,
        d: usize,
        c: Coll,
        input: &[T],
        count: usize,
        out_len: usize,
        fill: T,
        comm: ncclComm_t,
    ) -> (ncclResult_t, Vec<T>) {
        let s = self.stream(d);
        let send = self.upload(d, input);
        let recv = self.upload(d, &vec![fill; out_len]);
        let rc = self.coll::<T>(c, send, recv, count, comm, s);
        let out = self.download(d, recv, out_len);
        self.free(send);
        self.free(recv);
        (rc, out)
    }

    fn group_start(&self) {
        // SAFETY: no arguments.
        assert_eq!(unsafe { (self.nccl.fns().ncclGroupStart)() }, NCCL_OK);
    }

    fn group_end(&self) -> ncclResult_t {
        // SAFETY: no arguments.
        unsafe { (self.nccl.fns().ncclGroupEnd)() }
    }

    fn async_error(&self, comm: ncclComm_t) -> ncclResult_t {
        let mut e = ncclResult_t::ncclInternalError;
        // SAFETY: valid out-pointer and a live communicator.
        let rc = unsafe { (self.nccl.fns().ncclCommGetAsyncError)(comm, &mut e) };
        assert_eq!(rc, NCCL_OK);
        e
    }

    fn abort(&self, comm: ncclComm_t) {
        // SAFETY: a live communicator.
        assert_eq!(unsafe { (self.nccl.fns().ncclCommAbort)(comm) }, NCCL_OK);
    }
}

fn sum_of(n: usize, f: impl Fn(usize) -> f64) -> f64 {
    (0..n).map(f).sum()
}

/// Every collective kind, several types and ops, send/recv and grouped calls, as rank
/// `r` of `n` on device `d` of `rig`, checked against values computed here: the same for
/// the in-process and the multi-process mode.
pub fn script(rig: &Rig, d: usize, comm: ncclComm_t, r: usize, n: usize) {
    use ncclRedOp_t as O;
    let (ri, ni) = (r as i64, n as i64);

    // AllReduce, sum of f32 halves (exact in f32).
    let x: Vec<f32> = (0..5)
        .map(|i| (r + 1) as f32 * (i + 1) as f32 + 0.5)
        .collect();
    let (rc, out) = rig.run(d, Coll::AllReduce(O::ncclSum), &x, 5, 5, 0f32, comm);
    assert_eq!(rc, NCCL_OK, "{}", rig.last_error());
    let want: Vec<f32> = (0..5)
        .map(|i| sum_of(n, |q| (q + 1) as f64 * (i + 1) as f64 + 0.5) as f32)
        .collect();
    assert_eq!(out, want, "all-reduce f32 sum, rank {r}");

    // AllReduce, max of i8 (negative values too).
    let x: Vec<i8> = (0..4).map(|i| (ri * 7 - 10 + i) as i8).collect();
    let (rc, out) = rig.run(d, Coll::AllReduce(O::ncclMax), &x, 4, 4, 0i8, comm);
    assert_eq!(rc, NCCL_OK);
    let want: Vec<i8> = (0..4).map(|i| ((ni - 1) * 7 - 10 + i) as i8).collect();
    assert_eq!(out, want, "all-reduce i8 max, rank {r}");

    // AllReduce, sum of u64 beyond 32 bits.
    let x: Vec<u64> = (0..3).map(|i| (1u64 << 40) * (r as u64 + 1) + i).collect();
    let (rc, out) = rig.run(d, Coll::AllReduce(O::ncclSum), &x, 3, 3, 0u64, comm);
    assert_eq!(rc, NCCL_OK);
    let tri = (n * (n + 1) / 2) as u64;
    let want: Vec<u64> = (0..3).map(|i| (1u64 << 40) * tri + n as u64 * i).collect();
    assert_eq!(out, want, "all-reduce u64 sum, rank {r}");

    // AllReduce, average of f32 (sum divisible by n) and of i32 (truncated).
    let x: Vec<f32> = (0..3).map(|i| (r * 2 * n + i) as f32).collect();
    let (rc, out) = rig.run(d, Coll::AllReduce(O::ncclAvg), &x, 3, 3, 0f32, comm);
    assert_eq!(rc, NCCL_OK);
    let want: Vec<f32> = (0..3).map(|i| ((n - 1) * n + i) as f32).collect();
    assert_eq!(out, want, "all-reduce f32 avg, rank {r}");
    let x: Vec<i32> = (0..2)
        .map(|i| (10 * ri + i + i64::from(r == 0)) as i32)
        .collect();
    let (rc, out) = rig.run(d, Coll::AllReduce(O::ncclAvg), &x, 2, 2, 0i32, comm);
    assert_eq!(rc, NCCL_OK);
    let want: Vec<i32> = (0..2)
        .map(|i| ((10 * ni * (ni - 1) / 2 + ni * i + 1) / ni) as i32)
        .collect();
    assert_eq!(out, want, "all-reduce i32 avg, rank {r}");

    // AllReduce with a pre-multiplied sum: each rank's host scalar is r + 1.
    let f = rig.nccl.fns();
    let mut op = O(0);
    let mut scalar = (r + 1) as f32;
    // SAFETY: valid out-pointer, a host scalar of the op's type, a live communicator.
    let rc = unsafe {
        (f.ncclRedOpCreatePreMulSum)(
            &mut op,
            (&raw mut scalar).cast(),
            ncclDataType_t::ncclFloat32,
            ncclScalarResidence_t::ncclScalarHostImmediate,
            comm,
        )
    };
    assert_eq!(rc, NCCL_OK);
    let x: Vec<f32> = (0..3).map(|i| (i + 1) as f32).collect();
    let (rc, out) = rig.run(d, Coll::AllReduce(op), &x, 3, 3, 0f32, comm);
    assert_eq!(rc, NCCL_OK);
    let want: Vec<f32> = (0..3)
        .map(|i| sum_of(n, |q| (q + 1) as f64 * (i + 1) as f64) as f32)
        .collect();
    assert_eq!(out, want, "pre-multiplied sum, rank {r}");
    // SAFETY: an op of this live communicator.
    assert_eq!(unsafe { (f.ncclRedOpDestroy)(op, comm) }, NCCL_OK);

    // AllGather of i32.
    let x = [100 * r as i32 + 1, 100 * r as i32 + 2];
    let (rc, out) = rig.run(d, Coll::AllGather, &x, 2, 2 * n, 0i32, comm);
    assert_eq!(rc, NCCL_OK);
    let want: Vec<i32> = (0..n as i32)
        .flat_map(|q| [100 * q + 1, 100 * q + 2])
        .collect();
    assert_eq!(out, want, "all-gather, rank {r}");

    // ReduceScatter, sum of u64.
    let x: Vec<u64> = (0..2 * n as u64)
        .map(|j| (r as u64 + 1) * 1000 + j)
        .collect();
    let (rc, out) = rig.run(d, Coll::ReduceScatter(O::ncclSum), &x, 2, 2, 0u64, comm);
    assert_eq!(rc, NCCL_OK);
    let want: Vec<u64> = (2 * r as u64..2 * r as u64 + 2)
        .map(|j| tri * 1000 + n as u64 * j)
        .collect();
    assert_eq!(out, want, "reduce-scatter, rank {r}");

    // Broadcast from the last rank, i8.
    let root = n - 1;
    let x: Vec<i8> = (1..=3).map(|i| -(i as i8) - root as i8).collect();
    let (rc, out) = rig.run(d, Coll::Broadcast(root as i32), &x, 3, 3, 9i8, comm);
    assert_eq!(rc, NCCL_OK);
    let want: Vec<i8> = (1..=3).map(|i| -(i as i8) - root as i8).collect();
    assert_eq!(out, want, "broadcast, rank {r}");

    // Reduce, product of i32 to rank 0: the others' receive buffers stay untouched.
    let x: Vec<i32> = (0..2).map(|i| r as i32 + 2 + i).collect();
    let (rc, out) = rig.run(d, Coll::Reduce(O::ncclProd, 0), &x, 2, 2, 7i32, comm);
    assert_eq!(rc, NCCL_OK);
    let want: Vec<i32> = if r == 0 {
        (0..2)
            .map(|i| (0..n as i32).map(|q| q + 2 + i).product())
            .collect()
    } else {
        vec![7, 7]
    };
    assert_eq!(out, want, "reduce, rank {r}");

    // AllToAll of i32.
    let x: Vec<i32> = (0..n as i32)
        .flat_map(|q| [1000 * r as i32 + 10 * q, 1000 * r as i32 + 10 * q + 1])
        .collect();
    let (rc, out) = rig.run(d, Coll::AllToAll, &x, 2, 2 * n, 0i32, comm);
    assert_eq!(rc, NCCL_OK);
    let want: Vec<i32> = (0..n as i32)
        .flat_map(|q| [1000 * q + 10 * r as i32, 1000 * q + 10 * r as i32 + 1])
        .collect();
    assert_eq!(out, want, "all-to-all, rank {r}");

    // Gather of f64 to rank 1.
    let x = [r as f64 + 0.25, -(r as f64)];
    let (rc, out) = rig.run(d, Coll::Gather(1), &x, 2, 2 * n, 3.5f64, comm);
    assert_eq!(rc, NCCL_OK);
    let want: Vec<f64> = if r == 1 {
        (0..n)
            .flat_map(|q| [q as f64 + 0.25, -(q as f64)])
            .collect()
    } else {
        vec![3.5; 2 * n]
    };
    assert_eq!(out, want, "gather, rank {r}");

    // Scatter of u8 from rank 0.
    let x: Vec<u8> = (0..2 * n as u8).map(|j| j * 3).collect();
    let (rc, out) = rig.run(d, Coll::Scatter(0), &x, 2, 2, 0u8, comm);
    assert_eq!(rc, NCCL_OK);
    assert_eq!(out, vec![6 * r as u8, 6 * r as u8 + 3], "scatter, rank {r}");

    // Parts that disagree (each rank another count): every rank fails alike.
    let x = vec![1f32; 1 + r];
    let (rc, _) = rig.run(d, Coll::AllReduce(O::ncclSum), &x, 1 + r, 1 + r, 0f32, comm);
    assert_eq!(
        rc,
        ncclResult_t::ncclInvalidUsage,
        "mismatched counts, rank {r}"
    );

    // A send/receive ring and two collectives, grouped.
    let s = rig.stream(d);
    let mine: Vec<f32> = (0..3).map(|k| (10 * r + k) as f32).collect();
    let (send, recv) = (rig.upload(d, &mine), rig.upload(d, &[0f32; 3]));
    let (ar_in, ar_out) = (rig.upload(d, &[r as i32 + 1; 2]), rig.upload(d, &[0i32; 2]));
    let (ag_in, ag_out) = (rig.upload(d, &[r as u8]), rig.upload(d, &vec![0u8; n]));
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    rig.group_start();
    // SAFETY: buffers of 3 f32 on the communicator's device.
    unsafe {
        assert_eq!(
            (f.ncclSend)(
                send as *const c_void,
                3,
                ncclDataType_t::ncclFloat32,
                next as i32,
                comm,
                s
            ),
            NCCL_OK
        );
        assert_eq!(
            (f.ncclRecv)(
                recv as *mut c_void,
                3,
                ncclDataType_t::ncclFloat32,
                prev as i32,
                comm,
                s
            ),
            NCCL_OK
        );
    }
    assert_eq!(
        rig.coll::<i32>(Coll::AllReduce(O::ncclSum), ar_in, ar_out, 2, comm, s),
        NCCL_OK
    );
    assert_eq!(
        rig.coll::<u8>(Coll::AllGather, ag_in, ag_out, 1, comm, s),
        NCCL_OK
    );
    assert_eq!(rig.group_end(), NCCL_OK, "{}", rig.last_error());
    let want: Vec<f32> = (0..3).map(|k| (10 * prev + k) as f32).collect();
    assert_eq!(rig.download::<f32>(d, recv, 3), want, "ring, rank {r}");
    let total = (n * (n + 1) / 2) as i32;
    assert_eq!(
        rig.download::<i32>(d, ar_out, 2),
        vec![total; 2],
        "grouped all-reduce"
    );
    let all: Vec<u8> = (0..n as u8).collect();
    assert_eq!(rig.download::<u8>(d, ag_out, n), all, "grouped all-gather");
    for p in [send, recv, ar_in, ar_out, ag_in, ag_out] {
        rig.free(p);
    }
}
