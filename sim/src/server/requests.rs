//! What a logged-in session answers: SQL batches, RPC calls (the five system
//! procedures ODBC drivers use) and transaction manager requests, each turned
//! into the token stream SQL Server would send. Statements other than
//! `SELECT @@SPID` and session settings run a transaction on the files first
//! (see `storage`), so the kernel sees SQL Server's I/O for each.

use std::collections::HashMap;
use std::io;

use super::Shared;
use crate::storage::{Rng, TxnBuffers};
use crate::tds::rpc::{self, Call, Proc};
use crate::tds::sql::{self, Statement};
use crate::tds::tm::{self, TmRequest};
use crate::tds::tokens::{self, ServerMessage};
use crate::tds::types::INT2;
use crate::tds::{TDS_7_2, batch};

/// Messages SQL Server uses for the same failures.
const MSG_NOT_SUPPORTED: i32 = 4002;
const MSG_IO_ERROR: i32 = 823;
const MSG_NO_PROC: i32 = 2812;
const MSG_NO_PREPARED: i32 = 8179;
const MSG_NO_BEGIN_COMMIT: i32 = 3902;
const MSG_NO_BEGIN_ROLLBACK: i32 = 3903;
const MSG_BAD_DESCRIPTOR: i32 = 3989;
const MSG_NO_DTC: i32 = 8501;

/// One session's state once logged in.
pub struct Session {
    pub spid: u16,
    pub tds_version: u32,
    /// The open transaction's descriptor (0: none), which every request's
    /// ALL_HEADERS must carry.
    transaction: u64,
    /// sp_prepare'd statements by handle.
    prepared: HashMap<i32, String>,
    next_handle: i32,
    bufs: TxnBuffers,
    rng: Rng,
}

/// A failure answered with an ERROR token: (message number, text).
type Failure = (i32, String);

impl Session {
    pub fn new(spid: u16, tds_version: u32, rng: Rng) -> Session {
        Session {
            spid,
            tds_version,
            transaction: 0,
            prepared: HashMap::new(),
            next_handle: 1,
            bufs: TxnBuffers::default(),
            rng,
        }
    }

    pub fn sql_batch(&mut self, shared: &Shared, payload: &[u8]) -> io::Result<Vec<u8>> {
        let b = batch::decode(payload, self.tds_version >= TDS_7_2)?;
        let mut reply = Vec::with_capacity(64);
        match self.check_descriptor(b.headers.transaction_descriptor) {
            Ok(()) => {
                if let Err((n, text)) = self.statement(shared, &b.sql, &mut reply, false) {
                    error(&mut reply, shared, n, &text, tokens::DONE);
                }
            }
            Err((n, text)) => error(&mut reply, shared, n, &text, tokens::DONE),
        }
        Ok(reply)
    }

    /// An RPC request: every call in it, in order. A request this server
    /// cannot read (an unsupported parameter type, say) is answered with an
    /// ERROR, and the session goes on.
    pub fn rpc(&mut self, shared: &Shared, payload: &[u8]) -> Vec<u8> {
        let mut reply = Vec::with_capacity(128);
        let r = match rpc::decode(payload) {
            Ok(r) => r,
            Err(e) => {
                let text = format!("The RPC request could not be read: {e}.");
                error(
                    &mut reply,
                    shared,
                    MSG_NOT_SUPPORTED,
                    &text,
                    tokens::DONEPROC,
                );
                return reply;
            }
        };
        if let Err((n, text)) = self.check_descriptor(r.headers.transaction_descriptor) {
            error(&mut reply, shared, n, &text, tokens::DONEPROC);
            return reply;
        }
        let last = r.calls.len() - 1;
        for (i, call) in r.calls.iter().enumerate() {
            let more = if i < last { tokens::DONE_MORE } else { 0 };
            match self.call(shared, call, &mut reply) {
                Ok(()) => {
                    tokens::done_token(&mut reply, tokens::DONEPROC, more, tokens::CMD_EXECUTE, 0)
                }
                Err((n, text)) => {
                    message(&mut reply, shared, n, &text);
                    tokens::done_token(
                        &mut reply,
                        tokens::DONEPROC,
                        more | tokens::DONE_ERROR,
                        tokens::CMD_EXECUTE,
                        0,
                    );
                }
            }
        }
        reply
    }

    /// One call: its statement's results, RETURNSTATUS, then RETURNVALUE for
    /// a new prepared handle (the caller adds DONEPROC).
    fn call(&mut self, shared: &Shared, call: &Call, reply: &mut Vec<u8>) -> Result<(), Failure> {
        let proc = call.proc_name.known().ok_or_else(|| {
            (
                MSG_NO_PROC,
                format!(
                    "Could not find stored procedure '{}'.",
                    call.proc_name.display()
                ),
            )
        })?;
        let bad = |e: io::Error| (MSG_NOT_SUPPORTED, e.to_string());
        let mut new_handle = None;
        match proc {
            // @stmt, [@params, values...]
            Proc::ExecuteSql => {
                let stmt = call.text(0, "@stmt").map_err(bad)?;
                self.statement(shared, &stmt, reply, true)?;
            }
            // @handle OUTPUT, @params, @stmt, [@options]
            Proc::Prepare | Proc::PrepExec => {
                let stmt = call.text(2, "@stmt").map_err(bad)?;
                let handle = self.next_handle;
                self.next_handle += 1;
                self.prepared.insert(handle, stmt.clone());
                if proc == Proc::PrepExec {
                    self.statement(shared, &stmt, reply, true)?;
                }
                new_handle = Some((call.params[0].name.as_str(), handle));
            }
            // @handle, [values...]
            Proc::Execute => {
                let handle = call.int(0, "@handle").map_err(bad)? as i32;
                let stmt = self.prepared.get(&handle).cloned().ok_or_else(|| {
                    (
                        MSG_NO_PREPARED,
                        format!("Could not find prepared statement with handle {handle}."),
                    )
                })?;
                self.statement(shared, &stmt, reply, true)?;
            }
            Proc::Unprepare => {
                let handle = call.int(0, "@handle").map_err(bad)? as i32;
                self.prepared.remove(&handle);
            }
        }
        tokens::return_status(reply, 0);
        if let Some((name, handle)) = new_handle {
            tokens::return_value_int(reply, 0, name, handle);
        }
        Ok(())
    }

    /// A transaction manager request: the ENVCHANGEs of SQL Server (begin:
    /// a new descriptor; commit/rollback: the old one) and a DONE.
    pub fn transaction_manager(&mut self, shared: &Shared, payload: &[u8]) -> Vec<u8> {
        let mut reply = Vec::with_capacity(64);
        let result = tm::decode(payload)
            .map_err(|e| {
                let text = format!("The transaction manager request could not be read: {e}.");
                (MSG_NOT_SUPPORTED, text)
            })
            .and_then(|t| {
                self.check_descriptor(t.headers.transaction_descriptor)?;
                self.tm_request(shared, t.request, &mut reply)
            });
        match result {
            Ok(()) => tokens::done(&mut reply, tokens::DONE_FINAL, 0, 0),
            Err((n, text)) => error(&mut reply, shared, n, &text, tokens::DONE),
        }
        reply
    }

    fn tm_request(
        &mut self,
        shared: &Shared,
        request: TmRequest,
        reply: &mut Vec<u8>,
    ) -> Result<(), Failure> {
        let (then, kind, missing) = match request {
            TmRequest::Begin(_) => {
                // A nested begin only deepens the transaction: no ENVCHANGE.
                if self.transaction == 0 {
                    self.begin(shared, reply);
                }
                return Ok(());
            }
            TmRequest::Save { .. } => return Ok(()),
            TmRequest::Distributed(kind) => {
                return Err((
                    MSG_NO_DTC,
                    format!(
                        "MS DTC is not available in this simulator (transaction manager request {kind})."
                    ),
                ));
            }
            TmRequest::Commit { then, .. } => (then, tokens::ENV_COMMIT_TRAN, MSG_NO_BEGIN_COMMIT),
            TmRequest::Rollback { then, .. } => {
                (then, tokens::ENV_ROLLBACK_TRAN, MSG_NO_BEGIN_ROLLBACK)
            }
        };
        if self.transaction == 0 {
            let what = if kind == tokens::ENV_COMMIT_TRAN {
                "COMMIT"
            } else {
                "ROLLBACK"
            };
            return Err((
                missing,
                format!("The {what} TRANSACTION request has no corresponding BEGIN TRANSACTION."),
            ));
        }
        tokens::env_change_bytes(reply, kind, &[], &self.transaction.to_le_bytes());
        self.transaction = 0;
        if then.is_some() {
            self.begin(shared, reply);
        }
        Ok(())
    }

    fn begin(&mut self, shared: &Shared, reply: &mut Vec<u8>) {
        self.transaction = shared.new_transaction_descriptor();
        tokens::env_change_bytes(
            reply,
            tokens::ENV_BEGIN_TRAN,
            &self.transaction.to_le_bytes(),
            &[],
        );
    }

    /// A request must run in the session's transaction (or in none).
    fn check_descriptor(&self, sent: u64) -> Result<(), Failure> {
        if sent == self.transaction {
            return Ok(());
        }
        Err((
            MSG_BAD_DESCRIPTOR,
            format!(
                "New request is not allowed to start because it should come with valid \
                 transaction descriptor (sent {sent:#x}, session's {:#x}).",
                self.transaction
            ),
        ))
    }

    /// One statement's tokens, ended by DONE (a batch) or DONEINPROC with
    /// DONE_MORE (inside an RPC, whose DONEPROC follows).
    fn statement(
        &mut self,
        shared: &Shared,
        text: &str,
        reply: &mut Vec<u8>,
        in_proc: bool,
    ) -> Result<(), Failure> {
        let (token, more) = if in_proc {
            (tokens::DONEINPROC, tokens::DONE_MORE)
        } else {
            (tokens::DONE, 0)
        };
        let stmt = sql::classify(text);
        if matches!(stmt, Statement::Modify(_) | Statement::Query) {
            shared
                .storage
                .transaction(&mut self.bufs, &mut self.rng, self.spid)
                .map_err(|e| {
                    eprintln!("sqlservr: session {}: I/O error: {e}", self.spid);
                    (
                        MSG_IO_ERROR,
                        format!("The operating system returned an error: {e}"),
                    )
                })?;
        }
        match stmt {
            Statement::SelectSpid => {
                // @@SPID is a smallint.
                tokens::col_metadata_int(reply, &[("", INT2)]);
                tokens::row_int(reply, &[(INT2, self.spid as i64)]);
                tokens::done_token(reply, token, more | tokens::DONE_COUNT, sql::CMD_SELECT, 1);
            }
            Statement::Session => tokens::done_token(reply, token, more, 0, 0),
            Statement::Modify(cmd) => {
                tokens::done_token(reply, token, more | tokens::DONE_COUNT, cmd, 1)
            }
            Statement::Query => {
                tokens::col_metadata_int(reply, &[("", tokens::TYPE_INT4)]);
                tokens::row_int(reply, &[(tokens::TYPE_INT4, 1)]);
                tokens::done_token(reply, token, more | tokens::DONE_COUNT, sql::CMD_SELECT, 1);
            }
        }
        Ok(())
    }

    /// A request type this server does not take (bulk load, ...).
    pub fn unsupported(&self, shared: &Shared, packet_type: u8) -> Vec<u8> {
        let mut reply = Vec::new();
        let text = format!("Request type {packet_type:#04x} is not supported by this simulator.");
        error(&mut reply, shared, MSG_NOT_SUPPORTED, &text, tokens::DONE);
        reply
    }
}

/// An ERROR token (severity 16).
fn message(reply: &mut Vec<u8>, shared: &Shared, number: i32, text: &str) {
    let m = ServerMessage {
        number,
        state: 1,
        class: 16,
        text: text.into(),
        server: shared.server_name.clone(),
        procedure: String::new(),
        line: 1,
    };
    tokens::message(reply, &m);
}

/// An ERROR and the DONE (or DONEPROC) that ends the failed request.
pub fn error(reply: &mut Vec<u8>, shared: &Shared, number: i32, text: &str, done: u8) {
    message(reply, shared, number, text);
    let cmd = if done == tokens::DONEPROC {
        tokens::CMD_EXECUTE
    } else {
        0
    };
    tokens::done_token(reply, done, tokens::DONE_ERROR, cmd, 0);
}

#[cfg(test)]
mod tests;
