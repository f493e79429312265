//! The messages between ranks and their hub, and how they are framed on a TCP stream.
//!
//! A frame is a little-endian `u32` length, then that many bytes: the protocol
//! [`VERSION`], a message tag and the fields. Frames are parsed without trusting them:
//! any malformed input (a garbage peer, a port that is not a hub) gives an error, never a
//! panic, and memory grows only with bytes that really arrived, whatever length a frame
//! claims.

use std::io::{self, Read, Write};

use crate::dtype::{self, V};
use crate::parts::{Contrib, Kind, Op};
use nccl_sys::{ncclDataType_t, ncclRedOp_t};

/// Bumped whenever a message changes; a peer speaking another version is refused.
pub(crate) const VERSION: u8 = 1;

/// The first field of a [`Msg::Hello`]: the connection speaks this protocol at all.
const MAGIC: &[u8; 8] = b"MOCKNET1";

/// The largest frame accepted (1 GiB): room for any simulated buffer, and a bound on what
/// a corrupt length can make a reader wait for.
const MAX_FRAME: u32 = 1 << 30;

/// Collective call names, sent by index so the hub can name parts like the ranks do.
const CALLS: [&str; 9] = [
    "ncclAllReduce",
    "ncclAllGather",
    "ncclReduceScatter",
    "ncclBroadcast",
    "ncclBcast",
    "ncclReduce",
    "ncclAlltoAll",
    "ncclGather",
    "ncclScatter",
];

/// One message between a rank and its hub.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Msg {
    /// Rank to hub, first: who it is and how many ranks it expects.
    Hello { nranks: u32, rank: u32, device: i32 },
    /// Hub to ranks while they gather: the ranks not come yet (for timeout messages).
    Waiting { missing: Vec<u32> },
    /// Hub to ranks: everyone came; each rank's device.
    Welcome { devices: Vec<i32> },
    /// Hub to a rank: its hello is refused (`rc` is an `ncclResult_t`).
    Refused { rc: u32, msg: String },
    /// Rank to hub: its part of collective number `seq`, with the bytes it reads of its
    /// send buffer; `withdrawn`: the part was refused locally, the collective must fail.
    Coll {
        op: u64,
        seq: u64,
        part: Contrib,
        withdrawn: bool,
        input: Vec<u8>,
    },
    /// Rank to hub: a send to `peer` (with its bytes) or a receive from `peer`.
    P2p {
        op: u64,
        is_send: bool,
        peer: u32,
        count: u64,
        dtype: ncclDataType_t,
        withdrawn: bool,
        data: Vec<u8>,
    },
    /// Rank to hub: its communicator was aborted (peers fail with a remote error).
    Abort,
    /// Rank to hub: its communicator was destroyed; peers still waiting for it fail.
    Leave,
    /// Hub to rank: operation `op` completed with `rc`; `data` goes to its receive buffer.
    Done {
        op: u64,
        rc: u32,
        data: Option<Vec<u8>>,
    },
    /// Hub to a rank, before the `Done` of its part: the ranks disagreed on collective
    /// number `seq`, as `why` says.
    Disagree { seq: u64, why: String },
    /// Hub to ranks: rank `rank` aborted or its process went away.
    Gone { rank: u32 },
    /// Coordinator to hub, and hub to every rank: the id of grow number `seq`
    /// (`ncclCommGetUniqueId`), which ranks that pass none to `ncclCommGrow` use.
    GrowId { seq: u64, id: Vec<u8> },
    /// Rank to hub: a one-sided put (`data`: the peer's window place, the offset and the
    /// bytes) or plain signal (`None`) for rank `peer`; hub to that rank: the same from
    /// rank `peer`. `withdrawn`: the sender's sanitizer refused it.
    Put {
        peer: u32,
        withdrawn: bool,
        data: Option<(u64, u64, Vec<u8>)>,
    },
}

/// A malformed frame, by what was wrong.
#[derive(Debug)]
pub(crate) struct WireError(pub(crate) String);

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn bad<T>(what: impl Into<String>) -> Result<T, WireError> {
    Err(WireError(what.into()))
}

/// A cursor over one frame's bytes; every read checks the bytes are there.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.buf.len() < n {
            return bad("frame too short");
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.array::<1>()?[0])
    }

    fn bool(&mut self) -> Result<bool, WireError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => bad(format!("bad flag {b}")),
        }
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn i32(&mut self) -> Result<i32, WireError> {
        Ok(i32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn usize(&mut self) -> Result<usize, WireError> {
        usize::try_from(self.u64()?).or_else(|_| bad("count too large"))
    }

    fn bytes(&mut self) -> Result<Vec<u8>, WireError> {
        let n = self.usize()?;
        Ok(self.take(n)?.to_vec())
    }

    fn u32s(&mut self) -> Result<Vec<u32>, WireError> {
        let n = self.usize()?;
        if n > self.buf.len() / 4 {
            return bad("list longer than its frame");
        }
        (0..n).map(|_| self.u32()).collect()
    }

    fn dtype(&mut self) -> Result<ncclDataType_t, WireError> {
        let t = ncclDataType_t(self.u32()?);
        match dtype::size_of(t) {
            Some(_) => Ok(t),
            None => bad(format!("bad datatype {}", t.0)),
        }
    }

    fn op(&mut self) -> Result<Op, WireError> {
        match self.u8()? {
            0 => match self.u32()? {
                b @ 0..=3 => Ok(Op::Builtin(ncclRedOp_t(b))),
                b => bad(format!("bad reduction op {b}")),
            },
            1 => Ok(Op::Avg),
            2 => Ok(Op::PreMul(V::I(i128::from_le_bytes(self.array()?)))),
            3 => Ok(Op::PreMul(V::F(f64::from_le_bytes(self.array()?)))),
            t => bad(format!("bad op tag {t}")),
        }
    }

    fn contrib(&mut self) -> Result<Contrib, WireError> {
        let call = *CALLS
            .get(usize::from(self.u8()?))
            .ok_or_else(|| WireError("bad call".into()))?;
        let kind = *Kind::ALL
            .get(usize::from(self.u8()?))
            .ok_or_else(|| WireError("bad collective kind".into()))?;
        Ok(Contrib {
            call,
            kind,
            // The hub never sees the ranks' pointers; it works on shipped bytes.
            send: 0,
            recv: 0,
            count: self.usize()?,
            dtype: self.dtype()?,
            op: self.op()?,
            root: self.i32()?,
            placed: Default::default(),
        })
    }

    fn end(&self) -> Result<(), WireError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            bad("trailing bytes")
        }
    }
}

/// Appends fields to a frame being built.
#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i32(&mut self, v: i32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.0.extend_from_slice(b);
    }
    fn op(&mut self, op: Op) {
        match op {
            Op::Builtin(b) => {
                self.u8(0);
                self.u32(b.0);
            }
            Op::Avg => self.u8(1),
            Op::PreMul(V::I(i)) => {
                self.u8(2);
                self.0.extend_from_slice(&i.to_le_bytes());
            }
            Op::PreMul(V::F(f)) => {
                self.u8(3);
                self.0.extend_from_slice(&f.to_le_bytes());
            }
        }
    }
    fn contrib(&mut self, c: &Contrib) {
        let call = CALLS.iter().position(|n| *n == c.call).unwrap_or(0);
        let kind = Kind::ALL.iter().position(|k| *k == c.kind).unwrap_or(0);
        self.u8(call as u8);
        self.u8(kind as u8);
        self.u64(c.count as u64);
        self.u32(c.dtype.0);
        self.op(c.op);
        self.i32(c.root);
    }
}

impl Msg {
    /// The frame's payload (without the length prefix).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u8(VERSION);
        match self {
            Msg::Hello {
                nranks,
                rank,
                device,
            } => {
                w.u8(1);
                w.0.extend_from_slice(MAGIC);
                w.u32(*nranks);
                w.u32(*rank);
                w.i32(*device);
            }
            Msg::Waiting { missing } => {
                w.u8(2);
                w.u64(missing.len() as u64);
                missing.iter().for_each(|m| w.u32(*m));
            }
            Msg::Welcome { devices } => {
                w.u8(3);
                w.u64(devices.len() as u64);
                devices.iter().for_each(|d| w.i32(*d));
            }
            Msg::Refused { rc, msg } => {
                w.u8(4);
                w.u32(*rc);
                w.bytes(msg.as_bytes());
            }
            Msg::Coll {
                op,
                seq,
                part,
                withdrawn,
                input,
            } => {
                w.u8(5);
                w.u64(*op);
                w.u64(*seq);
                w.contrib(part);
                w.u8(u8::from(*withdrawn));
                w.bytes(input);
            }
            Msg::P2p {
                op,
                is_send,
                peer,
                count,
                dtype,
                withdrawn,
                data,
            } => {
                w.u8(6);
                w.u64(*op);
                w.u8(u8::from(*is_send));
                w.u32(*peer);
                w.u64(*count);
                w.u32(dtype.0);
                w.u8(u8::from(*withdrawn));
                w.bytes(data);
            }
            Msg::Abort => w.u8(7),
            Msg::Leave => w.u8(8),
            Msg::Done { op, rc, data } => {
                w.u8(9);
                w.u64(*op);
                w.u32(*rc);
                match data {
                    Some(d) => {
                        w.u8(1);
                        w.bytes(d);
                    }
                    None => w.u8(0),
                }
            }
            Msg::Gone { rank } => {
                w.u8(10);
                w.u32(*rank);
            }
            Msg::GrowId { seq, id } => {
                w.u8(11);
                w.u64(*seq);
                w.bytes(id);
            }
            Msg::Disagree { seq, why } => {
                w.u8(13);
                w.u64(*seq);
                w.bytes(why.as_bytes());
            }
            Msg::Put {
                peer,
                withdrawn,
                data,
            } => {
                w.u8(12);
                w.u32(*peer);
                w.u8(u8::from(*withdrawn));
                match data {
                    Some((seq, offset, bytes)) => {
                        w.u8(1);
                        w.u64(*seq);
                        w.u64(*offset);
                        w.bytes(bytes);
                    }
                    None => w.u8(0),
                }
            }
        }
        w.0
    }

    /// Parses one frame's payload.
    pub(crate) fn decode(buf: &[u8]) -> Result<Msg, WireError> {
        let mut r = Reader { buf };
        let version = r.u8()?;
        if version != VERSION {
            return bad(format!("protocol version {version}, expected {VERSION}"));
        }
        let msg = match r.u8()? {
            1 => {
                if &r.array::<8>()? != MAGIC {
                    return bad("not a mock NCCL hello");
                }
                Msg::Hello {
                    nranks: r.u32()?,
                    rank: r.u32()?,
                    device: r.i32()?,
                }
            }
            2 => Msg::Waiting { missing: r.u32s()? },
            3 => {
                let devices = r.u32s()?.into_iter().map(|d| d as i32).collect();
                Msg::Welcome { devices }
            }
            4 => Msg::Refused {
                rc: r.u32()?,
                msg: String::from_utf8_lossy(&r.bytes()?).into_owned(),
            },
            5 => Msg::Coll {
                op: r.u64()?,
                seq: r.u64()?,
                part: r.contrib()?,
                withdrawn: r.bool()?,
                input: r.bytes()?,
            },
            6 => Msg::P2p {
                op: r.u64()?,
                is_send: r.bool()?,
                peer: r.u32()?,
                count: r.u64()?,
                dtype: r.dtype()?,
                withdrawn: r.bool()?,
                data: r.bytes()?,
            },
            7 => Msg::Abort,
            8 => Msg::Leave,
            9 => Msg::Done {
                op: r.u64()?,
                rc: r.u32()?,
                data: if r.bool()? { Some(r.bytes()?) } else { None },
            },
            10 => Msg::Gone { rank: r.u32()? },
            11 => Msg::GrowId {
                seq: r.u64()?,
                id: r.bytes()?,
            },
            12 => Msg::Put {
                peer: r.u32()?,
                withdrawn: r.bool()?,
                data: if r.bool()? {
                    Some((r.u64()?, r.u64()?, r.bytes()?))
                } else {
                    None
                },
            },
            13 => Msg::Disagree {
                seq: r.u64()?,
                why: String::from_utf8_lossy(&r.bytes()?).into_owned(),
            },
            t => return bad(format!("unknown message {t}")),
        };
        r.end()?;
        Ok(msg)
    }
}

/// Writes `msg` as one frame.
pub(crate) fn send(mut to: impl Write, msg: &Msg) -> io::Result<()> {
    let payload = msg.encode();
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|&n| n <= MAX_FRAME)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "message too large"))?;
    let mut frame = Vec::with_capacity(4 + payload.len());
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(&payload);
    to.write_all(&frame)?;
    to.flush()
}

/// Reads one frame and parses it. A closed stream, a short frame, an oversized length or
/// a malformed message are all errors (`InvalidData` for the last two).
pub(crate) fn recv(mut from: impl Read) -> io::Result<Msg> {
    let mut len = [0u8; 4];
    from.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len);
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes"),
        ));
    }
    // Grows with the bytes that arrive, not with the length the peer claims.
    let mut buf = Vec::new();
    from.take(u64::from(len)).read_to_end(&mut buf)?;
    if buf.len() != len as usize {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Msg::decode(&buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.0))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn round_trip(m: Msg) {
        let mut buf = Vec::new();
        send(&mut buf, &m).unwrap();
        assert_eq!(recv(&buf[..]).unwrap(), m);
    }

    #[test]
    fn messages_round_trip() {
        round_trip(Msg::Hello {
            nranks: 3,
            rank: 2,
            device: 1,
        });
        round_trip(Msg::Waiting {
            missing: vec![0, 2],
        });
        round_trip(Msg::Welcome {
            devices: vec![0, -1, 3],
        });
        round_trip(Msg::Refused {
            rc: 5,
            msg: "rank 1 joined twice".into(),
        });
        for op in [
            Op::Builtin(ncclRedOp_t::ncclMax),
            Op::Avg,
            Op::PreMul(V::I(-7)),
            Op::PreMul(V::F(0.5)),
        ] {
            round_trip(Msg::Coll {
                op: 9,
                seq: 4,
                part: Contrib {
                    call: "ncclReduceScatter",
                    kind: Kind::ReduceScatter,
                    send: 0,
                    recv: 0,
                    count: 12,
                    dtype: ncclDataType_t::ncclUint64,
                    op,
                    root: 0,
                    placed: Default::default(),
                },
                withdrawn: true,
                input: vec![1, 2, 3],
            });
        }
        round_trip(Msg::P2p {
            op: 1,
            is_send: true,
            peer: 1,
            count: 2,
            dtype: ncclDataType_t::ncclInt8,
            withdrawn: false,
            data: vec![7, 8],
        });
        round_trip(Msg::Abort);
        round_trip(Msg::Leave);
        round_trip(Msg::Done {
            op: 3,
            rc: 6,
            data: Some(vec![0; 5]),
        });
        round_trip(Msg::Done {
            op: 3,
            rc: 0,
            data: None,
        });
        round_trip(Msg::Gone { rank: 1 });
        round_trip(Msg::Disagree {
            seq: 4,
            why: "rank 0 calls ncclAllGather of 4 ncclInt32".into(),
        });
        round_trip(Msg::Put {
            peer: 2,
            withdrawn: false,
            data: Some((1, 16, vec![1, 2, 3])),
        });
        round_trip(Msg::Put {
            peer: 0,
            withdrawn: true,
            data: None,
        });
        round_trip(Msg::GrowId {
            seq: 2,
            id: vec![7; 128],
        });
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let good = Msg::Coll {
            op: 1,
            seq: 2,
            part: Contrib {
                call: "ncclAllReduce",
                kind: Kind::AllReduce,
                send: 0,
                recv: 0,
                count: 1,
                dtype: ncclDataType_t::ncclFloat32,
                op: Op::Avg,
                root: 0,
                placed: Default::default(),
            },
            withdrawn: false,
            input: vec![0; 4],
        }
        .encode();
        // Every truncation and every single-byte corruption parses or fails cleanly.
        let refusal = |b: &[u8]| Msg::decode(b).err().map(|e| e.0);
        for n in 0..good.len() {
            assert_eq!(
                refusal(&good[..n]).as_deref(),
                Some("frame too short"),
                "prefix of {n} bytes"
            );
        }
        for i in 0..good.len() {
            for b in [0u8, 0x7f, 0xff] {
                let mut g = good.clone();
                g[i] = b;
                let _ = Msg::decode(&g);
            }
        }
        // A huge claimed length is refused before anything is allocated for it.
        let e = recv(&[0xff, 0xff, 0xff, 0xff, 1, 2][..]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        // A plausible length with too few bytes behind it is a short read.
        let e = recv(&[0, 0, 0, 0x10, 1, 2][..]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        // Another version, an unknown tag and a wrong magic are refused.
        assert_eq!(
            refusal(&[2, 7]),
            Some(format!("protocol version 2, expected {VERSION}"))
        );
        assert_eq!(
            refusal(&[VERSION, 99]).as_deref(),
            Some("unknown message 99")
        );
        let mut hello = Msg::Hello {
            nranks: 2,
            rank: 0,
            device: 0,
        }
        .encode();
        hello[2] = b'X';
        assert_eq!(refusal(&hello).as_deref(), Some("not a mock NCCL hello"));
        // A list claiming more entries than the frame holds.
        let mut w = Writer::default();
        w.u8(VERSION);
        w.u8(2);
        w.u64(u64::MAX / 2);
        assert_eq!(refusal(&w.0).as_deref(), Some("list longer than its frame"));
    }
}
