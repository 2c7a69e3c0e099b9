"""What the target's passes cost on this machine, as a conversation reads them: the one object a
conversation needs of its engine's measurements (not the engine itself)."""

from __future__ import annotations

from ..model import TargetModel
from .calibration import CalibrationStore
from .costs import TargetCosts


class CostBook:
    """The target's verify and plain-decoding costs: the measured table (saved per model and
    device, or calibrated here; `Engine.calibrate` writes `measured`) where it reaches far
    enough, else a prior (never measured on the spot: a turn must not wait for a calibration).
    One per engine, shared by its conversations."""

    def __init__(self, target: TargetModel, store: CalibrationStore,
                 measured: TargetCosts | None = None):
        self.target, self.store, self.measured = target, store, measured
        self._priors: dict[int, TargetCosts] = {}

    def reaches(self, max_draft: int) -> bool:
        """Are measured costs known as far as `max_draft` drafts?"""
        return self.measured is not None and self.measured.max_draft >= max_draft

    def costs(self, max_draft: int) -> TargetCosts:
        """Verify costs for 1..max_draft + 1 tokens and the plain decoding cost."""
        if self.measured is not None and self.reaches(max_draft):
            return self.measured.up_to(max_draft)
        if max_draft not in self._priors:
            self._priors[max_draft] = self.store.prior(self.target, max_draft)
        return self._priors[max_draft]

    def pass_size(self, q: int) -> int:
        """The tokens a q-token verify pass runs as: padded where the measured costs found a
        longer pass cheaper (costs.pad_targets), else q (and always q before a calibration)."""
        return self.measured.pass_size(q) if self.measured is not None else q
