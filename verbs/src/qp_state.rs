//! The QP state machine of `xwarp::verbs`, in one place: how the verbs state of a QP
//! follows from its connection ([`derive_state`]), where its connection is
//! ([`ConnPhase`]), and which changes [`QueuePair::modify`](crate::QueuePair::modify)
//! may make ([`transition`], [`plan_modify`]). The application's checks and the
//! engine's modify both go through this module; the table and its reasons are after
//! siw's `siw_qp_modify` plus the verbs RESET (the rules are listed on
//! [`QpModify`]).
//!
//! The states themselves are the protocol core's [`QpState`] (RFC 5040 §6 / the RDMAC
//! verbs QP states); the core moves its own QP through RTS, CLOSING, TERMINATE and
//! ERROR, and this module adds what the core cannot know: a connection still being set
//! up, a close the application asked for, and a connection that ended.

use crate::qp_attr::QpModify;

/// QP states visible to the application: the protocol core's states (RFC 5040 §6 / the
/// RDMAC verbs QP states), as [`QueuePair::state`](crate::QueuePair::state) reports them.
pub use xwarp_rdmap::QpState;

/// Where a QP's connection is, as [`plan_modify`] needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConnPhase {
    /// No connect or accept was applied (a new QP, or one just reset).
    Unused,
    /// A connection was started and has not ended (connecting, MPA, RTS, closing).
    Active,
    /// The connection ended (closed, failed, or the QP was moved to ERROR).
    Done,
}

impl ConnPhase {
    /// Whether connect or accept may start a connection on the QP (RTS is entered by
    /// connect or accept only, and only on an unused QP: a used one needs a reset first).
    pub(crate) fn can_start(self) -> bool {
        self == ConnPhase::Unused
    }
}

/// The engine's facts about a QP besides its connection object.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Flags {
    /// A connect or accept was applied (the QP owns a TCP connection).
    pub(crate) started: bool,
    /// The application asked for a graceful close (disconnect or modify to CLOSING).
    pub(crate) disconnect_requested: bool,
    /// The connection failed (an error, a Terminate, a reject, modify to ERROR or
    /// TERMINATE): it ends in ERROR, not IDLE.
    pub(crate) errored: bool,
    /// The connection ended (closed, or could never be made).
    pub(crate) finished: bool,
}

impl Flags {
    /// Where the connection is, for [`plan_modify`].
    pub(crate) fn phase(self) -> ConnPhase {
        if self.finished {
            ConnPhase::Done
        } else if !self.started && !self.errored {
            ConnPhase::Unused
        } else {
            ConnPhase::Active
        }
    }
}

/// The QP's connection object as [`derive_state`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Link {
    /// No connection object (never connected, TCP handshake under way, or it failed
    /// before MPA).
    None,
    /// A connection that is not closed; the state of its protocol QP (`None` while the
    /// MPA exchange has not made one yet).
    Open(Option<QpState>),
    /// A closed connection.
    Closed,
}

/// The verbs state of a QP: its connection's state, refined by the engine's [`Flags`].
pub(crate) fn derive_state(link: Link, f: Flags) -> QpState {
    use QpState as Q;
    match link {
        Link::Closed => match (f.disconnect_requested && !f.errored, f.finished) {
            (true, true) => Q::Idle,
            (true, false) => Q::Closing,
            (false, _) => Q::Error,
        },
        Link::Open(core) => match core {
            // modify(ERROR) before the MPA exchange finished.
            None | Some(Q::Idle) if f.errored => Q::Error,
            None | Some(Q::Idle) => Q::Idle,
            // A disconnect waiting behind a Local Invalidate is already CLOSING.
            Some(Q::Rts) if f.disconnect_requested => Q::Closing,
            Some(s) => s,
        },
        Link::None if f.finished || f.errored => Q::Error,
        Link::None => Q::Idle,
    }
}

/// What a legal state change does on the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transition {
    /// To the current state: nothing happens.
    Stay,
    /// The verbs RESET (ERROR → IDLE, or IDLE → IDLE after the connection ended): the
    /// QP becomes as created.
    Reset,
    /// RTS → CLOSING: a graceful disconnect.
    Close,
    /// RTS → TERMINATE: send a Terminate, then ERROR.
    Terminate,
    /// To ERROR: abortive (flush everything, reset TCP).
    Abort,
}

/// The transition table: what moving a QP in `cur` (connection in `phase`) to `to`
/// does, or why it is refused.
pub(crate) fn transition(
    cur: QpState,
    phase: ConnPhase,
    to: QpState,
) -> Result<Transition, String> {
    use QpState::*;
    match (cur, to) {
        (Error, Idle) => Ok(Transition::Reset),
        (Idle, Idle) if phase == ConnPhase::Done => Ok(Transition::Reset),
        (a, b) if a == b => Ok(Transition::Stay),
        (Idle | Rts | Closing | Terminate, Error) => Ok(Transition::Abort),
        (Rts, Closing) => Ok(Transition::Close),
        (Rts, Terminate) => Ok(Transition::Terminate),
        (_, Rts) => Err(format!(
            "{cur:?} -> Rts: RTS is entered by connect or accept"
        )),
        (Rts, Idle) => Err(
            "Rts -> Idle: the QP is connected; end the connection first (disconnect / \
             Closing, or Error), then reset it to Idle"
                .into(),
        ),
        (Closing, Idle) => Err(
            "Closing -> Idle: the graceful close is still draining work; the QP enters \
             Idle by itself when it finished (then modify to Idle resets it), or move it \
             to Error"
                .into(),
        ),
        (Terminate, Idle) => Err(
            "Terminate -> Idle: the Terminate is being sent; the QP enters Error next, \
             then reset it to Idle"
                .into(),
        ),
        (Error, _) => Err(format!(
            "Error -> {to:?}: from ERROR only a reset to Idle is possible"
        )),
        (Idle, Closing | Terminate) => Err(format!("Idle -> {to:?}: the QP is not connected")),
        _ => Err(format!("{cur:?} -> {to:?} is not a QP state transition")),
    }
}

/// Whether `m` is legal for a QP in `cur` whose connection is in `phase`, and what its
/// state change does (`None`: no state change). Attributes change only before
/// connect/accept or together with a reset; IRD/ORD fit the MPA v2 fields.
pub(crate) fn plan_modify(
    cur: QpState,
    phase: ConnPhase,
    m: &QpModify,
) -> Result<Option<Transition>, String> {
    let t = m.state.map(|to| transition(cur, phase, to)).transpose();
    let reset = matches!(t, Ok(Some(Transition::Reset)));
    if m.has_attrs() {
        if !reset && (cur != QpState::Idle || phase != ConnPhase::Unused) {
            return Err(format!(
                "QP attributes can change only before connect/accept or with a reset to \
                 Idle (the QP is {cur:?}{})",
                if cur == QpState::Idle {
                    ", connection started"
                } else {
                    ""
                }
            ));
        }
        let max = u32::from(xwarp_ddp::mpa::frame::IRD_ORD_MAX);
        if m.ird.is_some_and(|v| v > max) || m.ord.is_some_and(|v| v > max) {
            return Err(format!("IRD/ORD must be at most {max} (MPA v2)"));
        }
    }
    t
}

/// [`plan_modify`] as a yes/no: `Ok(true)` when the change includes a reset (ERROR →
/// IDLE, or IDLE → IDLE after the connection ended); `Err` carries the reason. (The
/// form the table's tests check; the engine uses [`plan_modify`].)
#[cfg(test)]
pub(crate) fn check_modify(cur: QpState, phase: ConnPhase, m: &QpModify) -> Result<bool, String> {
    plan_modify(cur, phase, m).map(|t| t == Some(Transition::Reset))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qp_attr::QpModify;
    use xwarp_ddp::mpa::RtrType;

    const ALL: [QpState; 5] = [
        QpState::Idle,
        QpState::Rts,
        QpState::Closing,
        QpState::Terminate,
        QpState::Error,
    ];
    const PHASES: [ConnPhase; 3] = [ConnPhase::Unused, ConnPhase::Active, ConnPhase::Done];

    /// siw_qp_modify's table (siw_qp_nextstate_from_idle/_rts/_term/_close): from IDLE
    /// only ERROR (RTS needs the LLP handle, so only connect/accept enter it); from RTS
    /// CLOSING, TERMINATE, ERROR; from CLOSING and TERMINATE only ERROR. Plus the verbs
    /// RESET: ERROR → IDLE, and IDLE → IDLE once the connection ended, report a reset.
    /// To the current state is a no-op; every other pair is refused with a reason.
    #[test]
    fn siw_qp_modify_transition_table() {
        use QpState::*;
        let legal = |from: QpState, to: QpState| {
            from == to
                || matches!(
                    (from, to),
                    (Idle | Rts | Closing | Terminate, Error)
                        | (Rts, Closing | Terminate)
                        | (Error, Idle)
                )
        };
        let mut n_legal = 0;
        for from in ALL {
            for to in ALL {
                for phase in PHASES {
                    let r = check_modify(from, phase, &QpModify::to_state(to));
                    if legal(from, to) {
                        let reset = to == Idle
                            && (from == Error || (from == Idle && phase == ConnPhase::Done));
                        assert_eq!(r, Ok(reset), "{from:?} -> {to:?} ({phase:?})");
                        n_legal += 1;
                    } else {
                        let why = r.expect_err(&format!("{from:?} -> {to:?} accepted"));
                        assert!(why.contains(&format!("{to:?}")), "{why}");
                    }
                }
            }
        }
        // 5 no-ops + 4 to ERROR + 2 from RTS + the reset from ERROR, in each phase.
        assert_eq!(n_legal, 3 * (5 + 4 + 2 + 1));
    }

    /// Attributes change only in IDLE before connect/accept, or with a reset; IRD/ORD
    /// fit the 14-bit MPA v2 fields (RFC 6581 §3); a refused attribute fails the whole
    /// modify.
    #[test]
    fn rfc6581_attributes_only_before_connect_and_within_14_bits() {
        let attrs = QpModify {
            ird: Some(0x3FFF),
            ord: Some(1),
            crc: Some(true),
            markers: Some(false),
            max_inline_data: Some(0),
            revision: Some(2),
            p2p_rtr: Some(Some(RtrType::Read)),
            ..QpModify::default()
        };
        assert!(attrs.has_attrs());
        assert_eq!(
            check_modify(QpState::Idle, ConnPhase::Unused, &attrs),
            Ok(false)
        );
        for phase in [ConnPhase::Active, ConnPhase::Done] {
            assert!(check_modify(QpState::Idle, phase, &attrs).is_err());
        }
        for s in ALL.into_iter().filter(|&s| s != QpState::Idle) {
            assert!(check_modify(s, ConnPhase::Done, &attrs).is_err(), "{s:?}");
            let with_state = QpModify {
                state: Some(QpState::Error),
                ..attrs.clone()
            };
            assert!(
                check_modify(s, ConnPhase::Done, &with_state).is_err(),
                "{s:?}"
            );
        }
        // With a reset the attributes are judged as on a new QP.
        let with_reset = QpModify {
            state: Some(QpState::Idle),
            ..attrs.clone()
        };
        assert_eq!(
            check_modify(QpState::Error, ConnPhase::Active, &with_reset),
            Ok(true)
        );
        assert_eq!(
            check_modify(QpState::Idle, ConnPhase::Done, &with_reset),
            Ok(true)
        );
        assert!(check_modify(QpState::Idle, ConnPhase::Active, &with_reset).is_err());
        assert!(check_modify(QpState::Rts, ConnPhase::Active, &with_reset).is_err());
        for bad in [
            QpModify {
                ird: Some(0x4000),
                ..QpModify::default()
            },
            QpModify {
                ord: Some(u32::MAX),
                ..QpModify::default()
            },
        ] {
            assert!(check_modify(QpState::Idle, ConnPhase::Unused, &bad).is_err());
        }
        assert!(!QpModify::to_state(QpState::Error).has_attrs());
    }

    const OPEN_FLAGS: Flags = Flags {
        started: true,
        disconnect_requested: false,
        errored: false,
        finished: false,
    };

    /// A new QP (and one just reset) is IDLE and unused: connect and accept take it.
    #[test]
    fn verbs_new_qp_is_idle_and_unused() {
        let f = Flags::default();
        assert_eq!(derive_state(Link::None, f), QpState::Idle);
        assert_eq!(f.phase(), ConnPhase::Unused);
        assert!(f.phase().can_start());
        assert!(!OPEN_FLAGS.phase().can_start());
    }

    /// siw's RTR (TCP up, MPA under way) is reported as IDLE; modify(ERROR) during it
    /// makes the QP ERROR at once.
    #[test]
    fn siw_rtr_is_reported_as_idle_until_mpa_finished() {
        assert_eq!(derive_state(Link::None, OPEN_FLAGS), QpState::Idle);
        assert_eq!(derive_state(Link::Open(None), OPEN_FLAGS), QpState::Idle);
        assert_eq!(
            derive_state(Link::Open(Some(QpState::Idle)), OPEN_FLAGS),
            QpState::Idle
        );
        let errored = Flags {
            errored: true,
            ..OPEN_FLAGS
        };
        assert_eq!(derive_state(Link::Open(None), errored), QpState::Error);
        assert_eq!(derive_state(Link::None, errored), QpState::Error);
        assert_eq!(errored.phase(), ConnPhase::Active);
    }

    /// The protocol core's RTS, CLOSING, TERMINATE and ERROR are reported as they are,
    /// except that a disconnect waiting behind a Local Invalidate is already CLOSING.
    #[test]
    fn rfc5040_open_connection_reports_the_core_state() {
        for s in [
            QpState::Rts,
            QpState::Closing,
            QpState::Terminate,
            QpState::Error,
        ] {
            assert_eq!(derive_state(Link::Open(Some(s)), OPEN_FLAGS), s);
        }
        let closing = Flags {
            disconnect_requested: true,
            ..OPEN_FLAGS
        };
        assert_eq!(
            derive_state(Link::Open(Some(QpState::Rts)), closing),
            QpState::Closing
        );
    }

    /// siw_qp_llp_close: a graceful close is CLOSING while it drains and IDLE once it
    /// finished (then a modify to IDLE is a reset); a connection that ended any other
    /// way (error, Terminate, the peer closing first) is ERROR.
    #[test]
    fn siw_llp_close_graceful_ends_idle_otherwise_error() {
        let draining = Flags {
            disconnect_requested: true,
            ..OPEN_FLAGS
        };
        assert_eq!(derive_state(Link::Closed, draining), QpState::Closing);
        let done = Flags {
            finished: true,
            ..draining
        };
        assert_eq!(derive_state(Link::Closed, done), QpState::Idle);
        assert_eq!(done.phase(), ConnPhase::Done);
        assert_eq!(
            transition(QpState::Idle, done.phase(), QpState::Idle),
            Ok(Transition::Reset)
        );
        let failed = Flags {
            errored: true,
            ..done
        };
        assert_eq!(derive_state(Link::Closed, failed), QpState::Error);
        let peer_closed = Flags {
            finished: true,
            ..OPEN_FLAGS
        };
        assert_eq!(derive_state(Link::Closed, peer_closed), QpState::Error);
        // A connect that failed before any connection object existed.
        assert_eq!(derive_state(Link::None, peer_closed), QpState::Error);
    }

    /// What each legal state change does on the engine.
    #[test]
    fn siw_qp_modify_legal_transitions_do_what_siw_does() {
        use QpState::*;
        let t = |from, to| transition(from, ConnPhase::Active, to);
        assert_eq!(t(Idle, Error), Ok(Transition::Abort));
        assert_eq!(t(Rts, Closing), Ok(Transition::Close));
        assert_eq!(t(Rts, Terminate), Ok(Transition::Terminate));
        for from in [Rts, Closing, Terminate] {
            assert_eq!(t(from, Error), Ok(Transition::Abort));
        }
        assert_eq!(t(Error, Idle), Ok(Transition::Reset));
        for s in ALL {
            assert_eq!(t(s, s), Ok(Transition::Stay));
        }
    }
}
