//! The QP state machine (RFC 5040 §6 / verbs): [`QpState`] and the rules that say what
//! each state allows.

/// QP states (RFC 5040 §6 / verbs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Not connected; work can be posted but nothing moves.
    Idle,
    /// Ready to send and receive.
    Rts,
    /// Graceful close requested: no new send work, queued work still drains.
    Closing,
    /// A Terminate is queued; nothing else starts. Becomes ERROR once it is handed out.
    Terminate,
    /// Stream dead; all work flushed.
    Error,
}

/// What [`QpState::on_post_send`] says about a newly posted send work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PostRule {
    /// Queue it (IDLE, RTS): it runs once the QP is in RTS.
    Queue,
    /// Complete it at once with a flush status (ERROR).
    Flush,
    /// Refuse it (CLOSING, TERMINATE).
    Refuse,
}

impl QpState {
    /// The state `set_rts` moves to: IDLE → RTS; `None` from any other state.
    pub(crate) fn on_set_rts(self) -> Option<QpState> {
        (self == QpState::Idle).then_some(QpState::Rts)
    }

    /// The state a graceful close moves to: RTS → CLOSING; `None` from any other state.
    pub(crate) fn on_close(self) -> Option<QpState> {
        (self == QpState::Rts).then_some(QpState::Closing)
    }

    /// The state a local protocol error moves to: IDLE, RTS, CLOSING → TERMINATE (a
    /// Terminate is queued); `None` once a Terminate is queued or the stream is dead.
    pub(crate) fn on_fatal(self) -> Option<QpState> {
        match self {
            QpState::Idle | QpState::Rts | QpState::Closing => Some(QpState::Terminate),
            QpState::Terminate | QpState::Error => None,
        }
    }

    /// What happens to a posted send work request in this state.
    pub(crate) fn on_post_send(self) -> PostRule {
        match self {
            QpState::Idle | QpState::Rts => PostRule::Queue,
            QpState::Error => PostRule::Flush,
            QpState::Closing | QpState::Terminate => PostRule::Refuse,
        }
    }

    /// Whether posted receives complete at once with a flush status (ERROR).
    pub(crate) fn flushes_receives(self) -> bool {
        self == QpState::Error
    }

    /// Whether inbound segments are validated and placed (RTS, CLOSING); in the other
    /// states they are read and dropped.
    pub(crate) fn receives(self) -> bool {
        matches!(self, QpState::Rts | QpState::Closing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc5040_qp_state_rules() {
        use QpState::*;
        let all = [Idle, Rts, Closing, Terminate, Error];
        for s in all {
            assert_eq!(s.on_set_rts(), (s == Idle).then_some(Rts));
            assert_eq!(s.on_close(), (s == Rts).then_some(Closing));
            assert_eq!(
                s.on_fatal(),
                matches!(s, Idle | Rts | Closing).then_some(Terminate)
            );
            assert_eq!(s.receives(), matches!(s, Rts | Closing));
            assert_eq!(s.flushes_receives(), s == Error);
        }
        assert_eq!(Idle.on_post_send(), PostRule::Queue);
        assert_eq!(Rts.on_post_send(), PostRule::Queue);
        assert_eq!(Error.on_post_send(), PostRule::Flush);
        assert_eq!(Closing.on_post_send(), PostRule::Refuse);
        assert_eq!(Terminate.on_post_send(), PostRule::Refuse);
    }
}
