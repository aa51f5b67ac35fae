//! The server's answers to RPC and transaction manager requests, decoded
//! back with the client's token decoder.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use super::*;
use crate::server::SpidPool;
use crate::storage::Storage;
use crate::tds::TDS_7_4;
use crate::tds::rpc::tests::{encode as rpc, int4, nvarchar};
use crate::tds::rpc::{BY_REF, SP_EXECUTE, SP_EXECUTESQL, SP_PREPEXEC, SP_UNPREPARE};
use crate::tds::tm::tests::encode as tm_request;
use crate::tds::tm::{TM_BEGIN_XACT, TM_COMMIT_XACT, TM_GET_DTC_ADDRESS, TM_ROLLBACK_XACT};
use crate::tds::tokens::Token;

/// A Shared with small files under /var/tmp (O_DIRECT needs a disk
/// filesystem), removed when the guard drops.
struct Fixture {
    shared: Shared,
    dir: PathBuf,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn fixture(name: &str) -> Fixture {
    let base = if std::path::Path::new("/var/tmp").is_dir() {
        PathBuf::from("/var/tmp")
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!("stalltrace-sim-req-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let storage =
        Storage::create(&dir.join("t.mdf"), 1 << 20, &dir.join("t_log.ldf"), 1 << 20).unwrap();
    let shared = Shared {
        storage,
        spids: SpidPool::default(),
        open: Mutex::new(HashMap::new()),
        database: "db".into(),
        server_name: "srv".into(),
        tls: None,
        last_descriptor: AtomicU64::new(100),
    };
    Fixture { shared, dir }
}

fn session() -> Session {
    Session::new(57, TDS_7_4, Rng::new(1))
}

fn error_number(toks: &[Token]) -> Option<i32> {
    toks.iter().find_map(|t| match t {
        Token::Error(m) => Some(m.number),
        _ => None,
    })
}

fn env(toks: &[Token], kind: u8) -> Option<(Vec<u8>, Vec<u8>)> {
    toks.iter().find_map(|t| match t {
        Token::EnvChange { kind: k, new, old } if *k == kind => Some((new.clone(), old.clone())),
        _ => None,
    })
}

#[test]
fn transactions_begin_commit_rollback_and_descriptors() {
    let f = fixture("tm");
    let mut s = session();
    let toks =
        tokens::decode(&s.transaction_manager(&f.shared, &tm_request(0, TM_BEGIN_XACT, &[0, 0])))
            .unwrap();
    let (new, old) = env(&toks, tokens::ENV_BEGIN_TRAN).expect("BEGIN TRANSACTION ENVCHANGE");
    assert!(old.is_empty());
    let d1 = u64::from_le_bytes(new.try_into().unwrap());
    assert_eq!(d1, 101);
    // A request outside the transaction is refused; inside, it runs.
    let toks = tokens::decode(
        &s.sql_batch(&f.shared, &batch::encode("SELECT 1", 0))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(error_number(&toks), Some(MSG_BAD_DESCRIPTOR));
    let toks = tokens::decode(
        &s.sql_batch(&f.shared, &batch::encode("SELECT 1", d1))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(error_number(&toks), None, "{toks:?}");
    // Commit and begin the next at once, as ODBC does with autocommit off.
    let toks = tokens::decode(
        &s.transaction_manager(&f.shared, &tm_request(d1, TM_COMMIT_XACT, &[0, 1, 0, 0])),
    )
    .unwrap();
    assert_eq!(
        env(&toks, tokens::ENV_COMMIT_TRAN),
        Some((vec![], d1.to_le_bytes().to_vec()))
    );
    let (new, _) = env(&toks, tokens::ENV_BEGIN_TRAN).expect("the next transaction");
    let d2 = u64::from_le_bytes(new.try_into().unwrap());
    assert_ne!(d2, d1);
    let toks = tokens::decode(
        &s.transaction_manager(&f.shared, &tm_request(d2, TM_ROLLBACK_XACT, &[0, 0])),
    )
    .unwrap();
    assert_eq!(
        env(&toks, tokens::ENV_ROLLBACK_TRAN),
        Some((vec![], d2.to_le_bytes().to_vec()))
    );
    assert!(env(&toks, tokens::ENV_BEGIN_TRAN).is_none());
    // Nothing left to commit; DTC is not there.
    let toks =
        tokens::decode(&s.transaction_manager(&f.shared, &tm_request(0, TM_COMMIT_XACT, &[0, 0])))
            .unwrap();
    assert_eq!(error_number(&toks), Some(MSG_NO_BEGIN_COMMIT));
    let toks =
        tokens::decode(&s.transaction_manager(&f.shared, &tm_request(0, TM_GET_DTC_ADDRESS, &[])))
            .unwrap();
    assert_eq!(error_number(&toks), Some(MSG_NO_DTC));
    let toks = tokens::decode(&s.transaction_manager(&f.shared, &[1, 2])).unwrap();
    assert_eq!(error_number(&toks), Some(MSG_NOT_SUPPORTED));
}

#[test]
fn prepared_statements_as_odbc_runs_them() {
    let f = fixture("rpc");
    let mut s = session();
    let prepexec = rpc(
        0,
        SP_PREPEXEC,
        &[
            ("", BY_REF, int4(None)),
            ("", 0, nvarchar("", true)),
            ("", 0, nvarchar("SELECT @@SPID", true)),
        ],
    );
    let toks = tokens::decode(&s.rpc(&f.shared, &prepexec)).unwrap();
    assert_eq!(toks[1], Token::Row(vec![Some(57)]), "{toks:?}");
    assert!(matches!(
        toks[2],
        Token::Done {
            token: tokens::DONEINPROC,
            ..
        }
    ));
    assert_eq!(toks[3], Token::ReturnStatus(0));
    assert!(matches!(
        &toks[4],
        Token::ReturnValue { value: Some(1), .. }
    ));
    assert!(matches!(
        toks[5],
        Token::Done {
            token: tokens::DONEPROC,
            status: 0,
            ..
        }
    ));
    let execute = rpc(0, SP_EXECUTE, &[("", 0, int4(Some(1)))]);
    let toks = tokens::decode(&s.rpc(&f.shared, &execute)).unwrap();
    assert_eq!(toks[1], Token::Row(vec![Some(57)]));
    let toks = tokens::decode(&s.rpc(&f.shared, &rpc(0, SP_UNPREPARE, &[("", 0, int4(Some(1)))])))
        .unwrap();
    assert_eq!(error_number(&toks), None);
    let toks = tokens::decode(&s.rpc(&f.shared, &execute)).unwrap();
    assert_eq!(error_number(&toks), Some(MSG_NO_PREPARED));
}

#[test]
fn executesql_updates_and_what_is_refused() {
    let f = fixture("exec");
    let mut s = session();
    let update = rpc(
        0,
        SP_EXECUTESQL,
        &[
            (
                "",
                0,
                nvarchar("UPDATE t SET v = v + 1 WHERE id = @P1", false),
            ),
            ("", 0, nvarchar("@P1 int", false)),
            ("@P1", 0, int4(Some(3))),
        ],
    );
    let toks = tokens::decode(&s.rpc(&f.shared, &update)).unwrap();
    assert!(
        matches!(
            toks[0],
            Token::Done {
                token: tokens::DONEINPROC,
                cur_cmd: sql::CMD_UPDATE,
                row_count: 1,
                ..
            }
        ),
        "{toks:?}"
    );
    assert_eq!(toks[1], Token::ReturnStatus(0));
    // An unknown procedure, an XML parameter, a truncated request: an ERROR each.
    let mut by_name = Vec::new();
    batch::put_all_headers(&mut by_name, 0);
    by_name.extend_from_slice(&[7, 0]);
    crate::tds::put_ucs2(&mut by_name, "my_proc");
    by_name.extend_from_slice(&[0, 0]);
    for (payload, number) in [
        (by_name, MSG_NO_PROC),
        (
            rpc(0, SP_EXECUTESQL, &[("", 0, vec![0xF1, 0])]),
            MSG_NOT_SUPPORTED,
        ),
        (update[..update.len() - 3].to_vec(), MSG_NOT_SUPPORTED),
    ] {
        let toks = tokens::decode(&s.rpc(&f.shared, &payload)).unwrap();
        assert_eq!(error_number(&toks), Some(number), "{toks:?}");
        assert!(matches!(
            toks.last(),
            Some(Token::Done {
                token: tokens::DONEPROC,
                status: tokens::DONE_ERROR,
                ..
            })
        ));
    }
    // Session settings touch no file and return no rows.
    let toks = tokens::decode(
        &s.sql_batch(&f.shared, &batch::encode("SET TEXTSIZE 4096", 0))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(toks.len(), 1);
}
