//! `ncclParam*` and `ncclSetEncryption` with the real libnccl of the pinned wheels (no
//! GPU needed: they only read NCCL's registry and environment). The simulated NCCL must
//! answer as NCCL 2.32.3 does, in a child whose environment sets the parameters; NCCL
//! 2.18.3 has none of it (`Error::Unsupported`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::OsStr;

use nccl_channel::{Encryption, Error, Param, set_encryption};
use nccl_sys::Nccl;
use test_support::this_test;

use crate::common::wheel::{self, load_trusted};

const LIBNCCL: &str = "NCCL_SYS_TEST_LIBNCCL";

/// Runs test `name` (its full name: `this_test!()`) in a child with exactly `vars` (and the
/// library), returning there the real library of `version` and a simulated NCCL.
fn in_child(name: &str, version: &str, vars: &[(&str, &str)]) -> Option<(Nccl, Nccl)> {
    let lib = wheel::libnccl(version, LIBNCCL);
    let mut env = vec![(LIBNCCL, lib.as_os_str())];
    env.extend(vars.iter().map(|(k, v)| (*k, OsStr::new(v))));
    if !test_support::env::in_scrubbed_child(name, &env) {
        return None;
    }
    let (_driver, gpus) = cuda_mock::MockDriver::with_devices(1).build().unwrap();
    let mock = nccl_mock::MockNccl::new(&gpus).build().unwrap().0;
    Some((load_trusted(lib).unwrap(), mock))
}

/// Both NCCLs' answers for `key`: as a u32, a u64 and a string, and as printed.
fn answers(nccl: &Nccl, key: &str) -> String {
    format!(
        "u32 {:?} u64 {:?} str {:?} printed {:?}",
        Param::<u32>::get_value(nccl, key),
        Param::<u64>::get_value(nccl, key),
        Param::<String>::get_value(nccl, key),
        Param::value_string(nccl, key),
    )
}

const KEYS: [&str; 8] = [
    "NCCL_DEBUG",
    "NCCL_DEBUG_SUBSYS",
    "NCCL_DEBUG_FILE",
    "NCCL_DEBUG_TIMESTAMP_FORMAT",
    "NCCL_DEBUG_TIMESTAMP_LEVELS",
    "NCCL_SET_THREAD_NAME",
    "NCCL_DEBUG_LEVELS",
    "NCCL_NO_SUCH_PARAMETER",
];

#[test]
fn the_simulated_parameters_answer_as_nccl_2_32_3_with_nothing_set() {
    let Some((real, mock)) = in_child(&this_test!(), "2.32.3", &[]) else {
        return;
    };
    for key in KEYS {
        assert_eq!(answers(&mock, key), answers(&real, key), "{key}");
    }
    assert_eq!(Param::keys(&mock).unwrap(), Param::keys(&real).unwrap());
    assert_eq!(
        Param::value_string(&real, "NCCL_DEBUG_SUBSYS").unwrap(),
        "INIT,ENV,BOOTSTRAP"
    );
}

#[test]
fn the_simulated_parameters_answer_as_nccl_2_32_3_with_the_environment_set() {
    let Some((real, mock)) = in_child(
        &this_test!(),
        "2.32.3",
        &[
            ("NCCL_DEBUG", "WARN"),
            ("NCCL_DEBUG_SUBSYS", "INIT,NET"),
            ("NCCL_DEBUG_FILE", "/tmp/nccl-param-test.%h"),
            ("NCCL_SET_THREAD_NAME", "1"),
            ("NCCL_DEBUG_TIMESTAMP_LEVELS", "ALL"),
            ("NCCL_PARAM_DUMP_ALL", "true"),
        ],
    ) else {
        return;
    };
    for key in KEYS {
        assert_eq!(answers(&mock, key), answers(&real, key), "{key}");
    }
    assert_eq!(
        Param::<u64>::get_value(&real, "NCCL_DEBUG_SUBSYS"),
        Ok(0x11)
    );
    assert_eq!(
        Param::value_string(&real, "NCCL_SET_THREAD_NAME").as_deref(),
        Ok("TRUE")
    );
    // NCCL_PARAM_DUMP_ALL lists the private keys too, in NCCL's order.
    let keys = Param::keys(&real).unwrap();
    assert_eq!(keys.len(), 10, "{keys:?}");
    assert_eq!(Param::keys(&mock).unwrap(), keys);
}

#[test]
fn the_simulated_encryption_answers_as_nccl_2_32_3() {
    let Some((real, mock)) = in_child(&this_test!(), "2.32.3", &[]) else {
        return;
    };
    for mode in [
        Encryption::None,
        Encryption::Psk("k".repeat(32)),
        Encryption::Psk("k".repeat(200)),
    ] {
        assert_eq!(set_encryption(&real, &mode), Ok(()), "{mode:?}");
        assert_eq!(set_encryption(&mock, &mode), Ok(()), "{mode:?}");
    }
    // What the safe layer refuses first, NCCL refuses too, with the same status.
    for nccl in [&real, &mock] {
        let f = nccl.fns().ncclSetEncryption.unwrap();
        let psk = c"short";
        let config = nccl_sys::ncclEncryptionConfig_t {
            size: size_of::<nccl_sys::ncclEncryptionConfig_t>(),
            magic: nccl_sys::NCCL_API_MAGIC,
            version: nccl_sys::NCCL_VERSION_CODE,
            mode: 1,
            psk: psk.as_ptr(),
        };
        // SAFETY: a valid config whose key outlives the call.
        let rc = unsafe { f(&config) };
        assert_eq!(rc, nccl_sys::ncclResult_t::ncclInvalidArgument);
    }
}

#[test]
fn nccl_2_18_3_has_none_of_it() {
    let Some((real, _mock)) = in_child(&this_test!(), "2.18.3", &[]) else {
        return;
    };
    let un = |feature, needed: &str| Error::Unsupported {
        feature,
        needed: needed.into(),
        found: "2.18.3".into(),
    };
    assert_eq!(
        Param::<u64>::get_value(&real, "NCCL_DEBUG_SUBSYS"),
        Err(un("ncclParamBind", "2.30.4"))
    );
    assert_eq!(
        Param::value_string(&real, "NCCL_DEBUG"),
        Err(un("ncclParamGetParameter", "2.30.4"))
    );
    assert_eq!(
        Param::keys(&real),
        Err(un("ncclParamGetAllParameterKeys", "2.30.4"))
    );
    assert_eq!(
        set_encryption(&real, &Encryption::None),
        Err(un("ncclSetEncryption", "2.32.3"))
    );
    let g = nccl_channel::Group::start(&real).unwrap();
    assert_eq!(g.simulate_end(), Err(un("ncclGroupSimulateEnd", "2.22.3")));
}
