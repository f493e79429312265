//! Reduction ops: the pre-multiplied-sum ops a communicator creates, and how a
//! collective's `ncclRedOp_t` turns into what the clique computes.

use std::ffi::c_void;

use cuda_mock::MockWorld;

use crate::dtype;
use crate::macros::mock_fns;
use crate::parts::Op;
use crate::state::{Comm, PreMul, fail};
use nccl_sys::{ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t, ncclScalarResidence_t};

/// The op of a reduction on `comm`: built in, average, or one of its pre-multiplied sums
/// (whose scalar is read now, when `call` is made; a device scalar through the driver,
/// which reports it if it is no longer device memory). `Err` holds the reason.
pub(super) fn resolve(
    cuda: &MockWorld,
    call: &str,
    comm: &Comm,
    op: ncclRedOp_t,
    dt: ncclDataType_t,
    esize: usize,
) -> Result<Op, String> {
    match op.0 {
        0..=3 => Ok(Op::Builtin(op)),
        4 => Ok(Op::Avg),
        id => match comm.redops.get(&id) {
            Some(p) => {
                if p.dtype != dt {
                    return Err("op created for another datatype".into());
                }
                let mut b = [0u8; 8];
                let esize = esize.min(b.len());
                if p.device_resident {
                    let v = cuda
                        .read_device(
                            &format!("{call} (scalar of op {id})"),
                            p.scalar as u64,
                            esize,
                        )
                        .map_err(|_| {
                            format!("the device scalar of op {id} is not device memory any more")
                        })?;
                    b[..esize].copy_from_slice(&v);
                } else {
                    let host = std::ptr::with_exposed_provenance::<[u8; 8]>(p.scalar);
                    // SAFETY: a host scalar is the op's own boxed copy (exposed by
                    // `Box::into_raw` in ncclRedOpCreatePreMulSum), freed only when the
                    // `PreMul` drops, and `comm`, borrowed here, holds the `PreMul`.
                    b = unsafe { *host };
                }
                Ok(Op::PreMul(dtype::get(dt, &b, 0)))
            }
            None => Err(format!("invalid reduction op {id}")),
        },
    }
}

mock_fns! {
    fn ncclRedOpCreatePreMulSum = red_op_create(w, s, op: *mut ncclRedOp_t, scalar: *mut c_void, dt: ncclDataType_t, residence: ncclScalarResidence_t, comm: ncclComm_t) {
        if op.is_null() || scalar.is_null() || dtype::size_of(dt).is_none() {
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, "invalid op, scalar or datatype".into());
        }
        let device_resident = residence == ncclScalarResidence_t::ncclScalarDevice;
        let esize = dtype::size_of(dt).unwrap_or(1);
        if device_resident && w.cuda.device_range(scalar.addr() as u64, esize).is_none() {
            return fail(&mut s, ncclResult_t::ncclInvalidArgument, "device scalar is not device memory".into());
        }
        let c = match s.comm_mut(w, CALL, comm) {
            Ok(c) => c,
            Err(rc) => return rc,
        };
        let id = ncclRedOp_t::ncclNumOps.0 + c.next_op;
        c.next_op += 1;
        // A host scalar is read now (NCCL copies it); keep a private copy.
        let stored = if device_resident {
            scalar.addr()
        } else {
            let mut b = Box::new([0u8; 8]);
            // SAFETY: the caller's scalar holds one element of `dt`.
            unsafe { std::ptr::copy_nonoverlapping(scalar as *const u8, b.as_mut_ptr(), esize) };
            Box::into_raw(b).expose_provenance()
        };
        c.redops.insert(id, PreMul { scalar: stored, dtype: dt, device_resident });
        // SAFETY: checked non-null out-pointer.
        unsafe { *op = ncclRedOp_t(id) };
        ncclResult_t::ncclSuccess
    }
    fn ncclRedOpDestroy = red_op_destroy(w, s, op: ncclRedOp_t, comm: ncclComm_t) {
        let c = match s.comm_mut(w, CALL, comm) {
            Ok(c) => c,
            Err(rc) => return rc,
        };
        // Dropping the op frees its host scalar copy.
        match c.redops.remove(&op.0) {
            Some(_) => ncclResult_t::ncclSuccess,
            None => ncclResult_t::ncclInvalidArgument,
        }
    }
}
