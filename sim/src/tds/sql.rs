//! What the simulator makes of a statement's text. It parses no SQL: it only
//! tells `SELECT @@SPID` (answered with the session's real SPID, which tests
//! compare with what the tracer read from the wire), session settings (which
//! touch no data), data changes (answered with a row count), and everything
//! else (answered like `SELECT 1`).

/// DONE CurCmd values (the statement's token in SQL Server's grammar).
pub const CMD_SELECT: u16 = 0x00C1;
pub const CMD_INSERT: u16 = 0x00C3;
pub const CMD_DELETE: u16 = 0x00C4;
pub const CMD_UPDATE: u16 = 0x00C5;
pub const CMD_MERGE: u16 = 0x0117;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Statement {
    /// `SELECT @@SPID`: one SMALLINT row, no I/O.
    SelectSpid,
    /// SET/USE and the like: no rows, no I/O.
    Session,
    /// INSERT/UPDATE/DELETE/MERGE: a transaction on the files, one row
    /// affected, with this DONE CurCmd.
    Modify(u16),
    /// Anything else: a transaction on the files and a `SELECT 1` answer.
    Query,
}

/// Classifies by the first keyword, case-insensitively; `SELECT @@SPID` must
/// be the whole text (whitespace and a trailing `;` aside).
pub fn classify(sql: &str) -> Statement {
    let text = sql.trim().trim_end_matches(';').trim_end();
    let mut words = text.split_whitespace();
    let first = words.next().unwrap_or("").to_ascii_uppercase();
    let rest: Vec<&str> = words.collect();
    match first.as_str() {
        "SELECT" if rest.len() == 1 && rest[0].eq_ignore_ascii_case("@@SPID") => {
            Statement::SelectSpid
        }
        "SET" | "USE" => Statement::Session,
        "INSERT" => Statement::Modify(CMD_INSERT),
        "UPDATE" => Statement::Modify(CMD_UPDATE),
        "DELETE" => Statement::Modify(CMD_DELETE),
        "MERGE" => Statement::Modify(CMD_MERGE),
        _ => Statement::Query,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_spid_in_any_case_and_spacing() {
        for s in [
            "SELECT @@SPID",
            "select @@spid",
            "  Select\n\t@@Spid ; ",
            "SELECT @@SPID;",
        ] {
            assert_eq!(classify(s), Statement::SelectSpid, "{s:?}");
        }
        for s in [
            "SELECT @@SPID, 1",
            "SELECT @@SPIDX",
            "SELECT 1",
            "SELECT @@SPID AS s",
        ] {
            assert_ne!(classify(s), Statement::SelectSpid, "{s:?}");
        }
    }

    #[test]
    fn other_statements() {
        assert_eq!(classify("set textsize 4096"), Statement::Session);
        assert_eq!(classify("USE master"), Statement::Session);
        assert_eq!(
            classify("UPDATE t SET v = v + 1 WHERE id = @P1"),
            Statement::Modify(CMD_UPDATE)
        );
        assert_eq!(
            classify("insert into t values (1)"),
            Statement::Modify(CMD_INSERT)
        );
        assert_eq!(classify("SELECT 1"), Statement::Query);
        assert_eq!(classify(""), Statement::Query);
    }
}
