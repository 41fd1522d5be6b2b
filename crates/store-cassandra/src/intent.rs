//! The intent of a guarded batch: the ops on partitions other than the
//! guarded one, with the timestamp they are written at, stored in the
//! guarded partition by the same lightweight transaction that checks the
//! guards.
//!
//! Encoding (all integers big-endian):
//!
//! ```text
//! 0x01 (format) | write id (16 bytes) | timestamp i64 | op count u32 | ops
//! op = 0x00 put | table (u8 len, bytes) | partition (u16 len, bytes)
//!               | clustering (u16 len, bytes) | version u64 | value (u32 len, bytes)
//!    | 0x01 delete | table | partition | clustering
//! ```

use tarn_store::{Op, StoreError, StoreResult};

const FORMAT: u8 = 1;

/// One op of an intent, with the table as a plain name (a decoded intent
/// names tables that this process may never have seen).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct IntentOp {
    pub table: String,
    pub partition: Vec<u8>,
    pub clustering: Vec<u8>,
    /// `Some((value, version))` for a put, `None` for a delete.
    pub put: Option<(Vec<u8>, u64)>,
}

/// A decoded intent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Intent {
    pub write_id: [u8; 16],
    /// Write timestamp (microseconds) of every op: applying an intent twice,
    /// or after later writes of the same rows, changes nothing.
    pub timestamp: i64,
    pub ops: Vec<IntentOp>,
}

/// Encodes the ops of a batch that fall outside the guarded partition.
pub(crate) fn encode(write_id: &[u8; 16], timestamp: i64, ops: &[&Op]) -> Vec<u8> {
    let size: usize = ops.iter().map(|op| op_size(op)).sum();
    let mut out = Vec::with_capacity(29 + size);
    out.push(FORMAT);
    out.extend_from_slice(write_id);
    out.extend_from_slice(&timestamp.to_be_bytes());
    out.extend_from_slice(&(ops.len() as u32).to_be_bytes());
    for op in ops {
        let key = op.key();
        out.push(match op {
            Op::Put { .. } => 0,
            Op::Delete { .. } => 1,
        });
        let table = key.table.name().as_bytes();
        out.push(table.len() as u8);
        out.extend_from_slice(table);
        // Keys are at most MAX_KEY_LEN (4096) bytes: validated before this.
        out.extend_from_slice(&(key.partition.len() as u16).to_be_bytes());
        out.extend_from_slice(&key.partition);
        out.extend_from_slice(&(key.clustering.len() as u16).to_be_bytes());
        out.extend_from_slice(&key.clustering);
        if let Op::Put { value, version, .. } = op {
            out.extend_from_slice(&version.to_be_bytes());
            out.extend_from_slice(&(value.len() as u32).to_be_bytes());
            out.extend_from_slice(value);
        }
    }
    out
}

/// Bytes one op takes in a batch or an intent, roughly: what batch size
/// limits are checked against.
pub(crate) fn op_size(op: &Op) -> usize {
    let key = op.key();
    let value = match op {
        Op::Put { value, .. } => value.len() + 12,
        Op::Delete { .. } => 0,
    };
    1 + 1 + key.table.name().len() + 4 + key.partition.len() + key.clustering.len() + value
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> StoreResult<&'a [u8]> {
        if self.bytes.len() < n {
            return Err(StoreError::Corrupt("intent is truncated".into()));
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> StoreResult<[u8; N]> {
        Ok(self.take(N)?.try_into().expect("took N bytes"))
    }
}

/// Decodes an intent; damaged bytes are [`StoreError::Corrupt`].
pub(crate) fn decode(bytes: &[u8]) -> StoreResult<Intent> {
    let mut r = Reader { bytes };
    let [format] = r.array::<1>()?;
    if format != FORMAT {
        return Err(StoreError::Corrupt(format!(
            "intent format {format} is not {FORMAT}"
        )));
    }
    let write_id = r.array::<16>()?;
    let timestamp = i64::from_be_bytes(r.array::<8>()?);
    let count = u32::from_be_bytes(r.array::<4>()?) as usize;
    let mut ops = Vec::with_capacity(count.min(4096));
    for _ in 0..count {
        let [tag] = r.array::<1>()?;
        let [tlen] = r.array::<1>()?;
        let table = std::str::from_utf8(r.take(tlen as usize)?)
            .map_err(|_| StoreError::Corrupt("intent table name is not UTF-8".into()))?
            .to_string();
        let plen = u16::from_be_bytes(r.array::<2>()?) as usize;
        let partition = r.take(plen)?.to_vec();
        let clen = u16::from_be_bytes(r.array::<2>()?) as usize;
        let clustering = r.take(clen)?.to_vec();
        let put = match tag {
            0 => {
                let version = u64::from_be_bytes(r.array::<8>()?);
                let vlen = u32::from_be_bytes(r.array::<4>()?) as usize;
                Some((r.take(vlen)?.to_vec(), version))
            }
            1 => None,
            other => return Err(StoreError::Corrupt(format!("intent op tag {other}"))),
        };
        ops.push(IntentOp {
            table,
            partition,
            clustering,
            put,
        });
    }
    if !r.bytes.is_empty() {
        return Err(StoreError::Corrupt("bytes after the intent's ops".into()));
    }
    Ok(Intent {
        write_id,
        timestamp,
        ops,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tarn_store::{Key, Table};

    #[test]
    fn intents_round_trip() {
        let t = Table::new("items");
        let ops = [
            Op::Put {
                key: Key::new(t, vec![0xff; 4096], b"c".to_vec()),
                value: vec![7; 1000],
                version: u64::MAX,
            },
            Op::Delete {
                key: Key::new(Table::new("x"), b"p".to_vec(), vec![0]),
            },
        ];
        let refs: Vec<&Op> = ops.iter().collect();
        let bytes = encode(&[9; 16], -5, &refs);
        let intent = decode(&bytes).unwrap();
        assert_eq!(intent.write_id, [9; 16]);
        assert_eq!(intent.timestamp, -5);
        assert_eq!(intent.ops.len(), 2);
        assert_eq!(intent.ops[0].table, "items");
        assert_eq!(intent.ops[0].partition, vec![0xff; 4096]);
        assert_eq!(intent.ops[0].put, Some((vec![7; 1000], u64::MAX)));
        assert_eq!(intent.ops[1].table, "x");
        assert_eq!(intent.ops[1].put, None);
        // Every truncation is refused, never misread.
        for n in 0..bytes.len() {
            assert!(matches!(decode(&bytes[..n]), Err(StoreError::Corrupt(_))));
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(decode(&longer), Err(StoreError::Corrupt(_))));
    }
}
