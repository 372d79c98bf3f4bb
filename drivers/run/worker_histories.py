"""--workers-restart: each live session's history as its worker kept it, turn by turn (TurnKept), held by the
coordinator (never recorded) so that a replacement worker can go on with the session where the lost one left it."""

from __future__ import annotations

from rampwatch.drivers.client.ramp import ConversationState
from rampwatch.drivers.run import worker_wire as ww


class _Kept:
    """One session's: its encoded messages, and its conversation's state, as of turn `turn`."""

    def __init__(self) -> None:
        self.history: list[str] = []
        self.state: ConversationState | None = None
        self.turn = 0


class SessionHistories:
    def __init__(self) -> None:
        self._by_session: dict[str, _Kept] = {}

    def keep(self, kept: ww.TurnKept) -> None:
        entry = self._by_session.get(kept.session)
        if entry is None:
            entry = self._by_session[kept.session] = _Kept()
        entry.history += kept.added
        entry.state, entry.turn = kept.state, kept.turn

    def forget(self, session: str) -> None:
        """The session has ended (or will not be resumed): its history is let go."""
        self._by_session.pop(session, None)

    def resume(self, session: str, turn: int) -> ww.SessionResume:
        """Ramp session `session` (s<k>) to go on at `turn`, from what its worker kept (nothing: from scratch)."""
        kept = self._by_session.get(session)
        return ww.SessionResume(
            session=int(session[1:]),
            turn=turn,
            history=kept.history if kept is not None else [],
            state=kept.state if kept is not None else None,
            kept_turn=kept.turn if kept is not None else 0,
        )
