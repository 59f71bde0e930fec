"""The provider's op table: every op of :mod:`h3gate.op_registry` by name, as diffusers computes it, in the
signatures of a candidate's standalone ops (:meth:`h3gate.candidates.Candidate.kernel_ops`)."""

from h3gate import op_registry

OPS = {op.name: op.provider for op in op_registry.OPS}
